"""Orchestration overhead: a full tiny-model CoGR flow vs an immediate re-run with nothing
changed (the CLI's up-to-date check), vs the same re-run forced through Prefect (`--log-run`:
local server start + every task a cache hit), vs `dvc repro` with nothing changed, measured
in one run, in a throw-away copy of the project.

    .venv/bin/python bench/pipeline_overhead.py [--queries 64] [--rounds 1] [--keep]

Each figure is the wall time of the command a user types (`coevo run cogr`, `dvc repro`),
so process start, imports and the local Prefect server's start-up are included. The last
lines print the ratios; target: cached_rerun_ratio <= 0.10.
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

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


IN_PROCESS = """
import time
from coevo.orchestration.flow import method_flow
cogr_flow = method_flow("cogr")  # what flows/cogr.py (prefect.yaml's entrypoint) holds
cogr_flow(params_path="params.yaml")  # starts the local server; all tasks cached
started = time.perf_counter()
summary = cogr_flow(params_path="params.yaml")
assert summary["steps"]["executed"] == 0, summary["steps"]
print(f"in_process_cached_s={time.perf_counter() - started:.2f}")
"""


def make_project(dest: Path, queries: int, rounds: int = 1) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("coevo", "tasks", "flows"):
        shutil.copytree(REPO / name, dest / name, ignore=ignore)
    shutil.copytree(REPO / "data" / "sample" / "metatool", dest / "data" / "sample" / "metatool")
    for name in (".dvcignore", ".gitignore"):
        shutil.copy(REPO / name, dest / name)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["data"].update(dataset="bench", loader="metatool", source="data/sample/metatool")
    cogr = params["cogr"]
    # A random `tiny` model writes few keywords: the bench times orchestration, not learning, so
    # an all-empty phase must not stop the run (as in the flow tests' toy project).
    cogr.update(generator="tiny", seed_generator=None, rounds=rounds, max_train_queries=queries,
                max_empty_share=1.0)
    cogr["sft"].update(epochs=1)
    cogr["grpo"].update(num_generations=2, batch_size=4, max_prompts_per_phase=8, max_completion_length=16)
    cogr["sampling"].update(max_new_tokens=16)
    (dest / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def timed(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, str]:
    started = time.perf_counter()
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    print(f"  {seconds:6.1f}s  {' '.join(Path(a).name if i == 0 else a for i, a in enumerate(args)).splitlines()[0][:80]}",
          file=sys.stderr, flush=True)  # progress (stderr: stdout keeps the figures)
    if result.returncode != 0:
        sys.exit(f"{' '.join(args)} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return seconds, result.stdout + result.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=64, help="cap on training queries (cogr.max_train_queries)")
    parser.add_argument("--rounds", type=int, default=1, help="GRPO rounds of the flow (0: seeds and SFT only)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary project folder")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="coevo-bench-"))
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(root),
        "PREFECT_HOME": str(root / ".prefect-home"),  # a fresh local server database
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "HF_HUB_OFFLINE": "1",
        "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.com",
        "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@example.com",
    }
    try:
        make_project(root, args.queries, args.rounds)
        for cmd in (["git", "init", "-q"], [str(BIN / "dvc"), "init", "-q"], ["git", "add", "-A"],
                    ["git", "commit", "-qm", "bench"]):
            subprocess.run(cmd, cwd=root, env=env, check=True, capture_output=True)
        coevo = [str(BIN / "coevo"), "run", "cogr"]
        timed(coevo + ["--stage", "prepare"], root, env)  # warm-up: server database, first imports

        full, out_full = timed(coevo, root, env)
        cached, out_cached = timed(coevo, root, env)
        if "up to date" not in out_cached:
            sys.exit(f"the re-run was not answered as up to date:\n{out_cached[-3000:]}")
        forced, out_forced = timed(coevo + ["--log-run"], root, env)
        steps = re.search(r"steps: (\d+) executed, (\d+) from cache", out_forced)
        # The same cached re-run inside one process whose Prefect server is already up (a
        # worker or a long-lived process): what the orchestration itself costs per run.
        _, out_inproc = timed([sys.executable, "-c", IN_PROCESS], root, env)
        in_process = float(re.search(r"in_process_cached_s=([\d.]+)", out_inproc).group(1))
        # The full run left its DVC record (records/cogr.yaml, dvc.yaml, dvc.lock): `dvc repro` has nothing to do.
        noop, out_noop = timed([str(BIN / "dvc"), "repro"], root, env)
        if "Running stage" in out_noop:
            sys.exit(f"`dvc repro` after the recorded run was not a no-op:\n{out_noop}")

        print(f"project: {root} (MetaTool sample, tiny model, {args.queries} train queries, "
              f"{args.rounds} round{'' if args.rounds == 1 else 's'})")
        print("machine: shared 2-core CPU (other jobs running); figures are wall seconds")
        print(f"full_flow_s={full:.1f}")
        print(f"cached_rerun_s={cached:.1f}   (up-to-date check: no Prefect server, no task)")
        print(f"forced_flow_rerun_s={forced:.1f}   (--log-run; tasks executed/cached: "
              f"{steps.group(1) if steps else '?'}/{steps.group(2) if steps else '?'})")
        print(f"in_process_cached_rerun_s={in_process:.1f}   (server already up, imports done)")
        print(f"dvc_repro_noop_s={noop:.1f}")
        print(f"dvc_noop_vs_full={noop / full:.3f}")
        print(f"in_process_cached_vs_full={in_process / full:.3f}")
        print(f"forced_flow_rerun_ratio={forced / full:.3f}")
        print(f"cached_rerun_ratio={cached / full:.3f}   (target <= 0.10)")
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
