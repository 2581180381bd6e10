"""Which steps re-run after each kind of change, measured for `coevo run` and for `dvc repro`.

    .venv/bin/python bench/staleness_table.py [--change TEXT ...] [--keep]

In a throw-away copy of the project (tiny model, toy MetaTool data, one round), the full
pipeline runs once and leaves its DVC record; then each change is applied, both commands run
in their own copy of that finished project, and the steps each one actually executed (its
"done in" lines) are listed. A knob changes in the file each command reads: params.yaml for
`coevo run`, the run's record records/cogr.yaml for `dvc repro` (what `dvc exp run -S
records/cogr.yaml:<key>=<value>` does). The two columns must be identical: both go through the same keys (coevo/steps.py).
``--change`` keeps only the changes whose name contains TEXT (repeatable). The last line is
``identical=True|False``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from coevo.data.sample import toy_metatool

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TOY_TOOLS = 6  # the toy project of the flow tests (tests/conftest.py): 6 tools, 8 queries each
QUERIES_PER_TOOL = 8


def make_toy_metatool(dest: Path) -> Path:
    """A MetaTool-format subset of the committed sample: 6 tools, 8 queries each."""
    return toy_metatool(REPO / "data" / "sample" / "metatool", dest, tools=TOY_TOOLS, queries_per_tool=QUERIES_PER_TOOL)


def toy_params(dest: Path) -> Path:
    """params.yaml with the toy data and a tiny model, one round, a handful of prompts."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["data"].update(dataset="toy", loader="metatool", source="toy")
    cogr = params["cogr"]
    cogr.update(generator="tiny", seed_generator=None, rounds=1, max_empty_share=1.0)  # tiny writes few keywords
    cogr["sft"].update(epochs=1, batch_size=8)
    cogr["grpo"].update(num_generations=2, batch_size=4, max_prompts_per_phase=4, max_completion_length=12)
    cogr["sampling"].update(max_new_tokens=12)
    cogr["early_stopping"].update(patience=5)
    dest.write_text(yaml.safe_dump(params, sort_keys=False))
    return dest


def make_project(root: Path) -> Path:
    """The toy project with its code (DVC hashes the copied library): data, params.yaml, coevo/, tasks/, flows/."""
    root.mkdir(parents=True, exist_ok=True)
    make_toy_metatool(root / "toy")
    toy_params(root / "params.yaml")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("coevo", "tasks", "flows"):
        shutil.copytree(REPO / name, root / name, ignore=ignore)
    shutil.copy(REPO / ".dvcignore", root / ".dvcignore")
    return root


def set_param(key: str, value) -> callable:
    def apply(root: Path, params_file: str) -> None:
        params = yaml.safe_load((root / params_file).read_text())
        node = params
        *parents, leaf = key.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
        (root / params_file).write_text(yaml.safe_dump(params, sort_keys=False))
    return apply


def edit_data(root: Path, params_file: str) -> None:
    csv = root / "toy" / "all_clean_data.csv"
    lines = csv.read_text().splitlines()
    lines[1] = lines[1].replace(",", " today,", 1)  # one query's text changes
    csv.write_text("\n".join(lines) + "\n")


def edit_library(root: Path, params_file: str) -> None:
    with (root / "coevo" / "rewards" / "cogr.py").open("a") as f:
        f.write("\n# an edit to a library file the phases run\n")


CHANGES = {
    "data file (one query of the source)": edit_data,
    "GRPO knob (cogr.grpo.learning_rate)": set_param("cogr.grpo.learning_rate", 1.0e-4),
    "SFT knob (cogr.sft.learning_rate)": set_param("cogr.sft.learning_rate", 1.0e-3),
    "final split (evaluation.split)": set_param("evaluation.split", "val"),
    "library source (coevo/rewards/cogr.py)": edit_library,
}


def run(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    started = time.perf_counter()
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    print(f"  {time.perf_counter() - started:6.1f}s  {Path(args[0]).name} {' '.join(args[1:])} in {cwd.name}",
          file=sys.stderr, flush=True)  # progress (stderr: stdout keeps the table)
    if result.returncode != 0:
        sys.exit(f"{' '.join(args)} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result.stdout + result.stderr


def executed(output: str) -> list[str]:
    """Steps that did work ("<label>: done in Ns"), in order."""
    return re.findall(r"^\s+(.+?): done in [\d.]+s", output, flags=re.M)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--change", action="append", default=None, metavar="TEXT",
                        help="only the changes whose name contains TEXT (repeatable; default: all)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folders")
    args = parser.parse_args()
    changes = {name: change for name, change in CHANGES.items()
               if not args.change or any(text in name for text in args.change)}
    if not changes:
        parser.error(f"--change {args.change}: no change matches; changes: {'; '.join(CHANGES)}")
    work = Path(tempfile.mkdtemp(prefix="coevo-staleness-"))
    base = make_project(work / "base")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(base),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "HF_HUB_OFFLINE": "1", "COLUMNS": "200",
           "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@example.com", "GIT_COMMITTER_NAME": "b",
           "GIT_COMMITTER_EMAIL": "b@example.com"}
    try:
        for cmd in (["git", "init", "-q"], [str(BIN / "dvc"), "init", "-q"], ["git", "add", "-A"],
                    ["git", "commit", "-qm", "toy"]):
            subprocess.run(cmd, cwd=base, env=env, check=True, capture_output=True)
        # The finished pipeline every change starts from: one `coevo run`, which leaves its DVC
        # record (records/cogr.yaml, dvc.yaml, dvc.lock: what `dvc repro` would write).
        run([str(BIN / "coevo"), "run", "cogr"], base, env)
        rows = []
        for name, change in changes.items():
            results = {}
            for tool, cmd, params_file in (("coevo run", [str(BIN / "coevo"), "run", "cogr"], "params.yaml"),
                                           ("dvc repro", [str(BIN / "dvc"), "repro"], "records/cogr.yaml")):
                copy = work / f"{len(rows)}-{tool.split()[0]}"
                shutil.copytree(base, copy, symlinks=True)
                change(copy, params_file)
                results[tool] = executed(run(cmd, copy, {**env, "PYTHONPATH": str(copy)}))
            rows.append((name, results))
        print("| change | coevo run re-ran | dvc repro re-ran | same |")
        print("| --- | --- | --- | --- |")
        for name, results in rows:
            a, b = results["coevo run"], results["dvc repro"]
            print(f"| {name} | {', '.join(a) or '(nothing)'} | {', '.join(b) or '(nothing)'} | {'yes' if a == b else 'NO'} |")
        print(f"identical={all(r['coevo run'] == r['dvc repro'] for _, r in rows)}")
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
