"""The project's committed DVC pipeline: `dvc.yaml` and the record it is rendered from
(``records/cogr.yaml``, the demo's resolved params), so a fresh clone's `dvc repro` rebuilds the
demo (CoGR on data/sample/metatool) without a first `coevo run`.

- the committed files cannot go stale: dvc.yaml is ``render(read_records())`` of the committed
  records, and records/cogr.yaml is what `coevo demo` resolves from params.yaml + params/cpu.yaml
  + params/demo.yaml today (one line names the command that rewrites both);
- git ignores every output the stages declare and tracks the pipeline files; DVC ignores neither;
- in a copy of the repository's files (a fresh clone), DVC lists the four stages in order, and
  the two data stages really run (seconds of work; the train stage, ~13 minutes, never runs here).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import BIN, REPO_ROOT, sh
from coevo.config import flatten
from coevo.orchestration.dvc_record import write_record
from coevo.orchestration.dvc_stages import (
    DEMO_COMMAND,
    DEMO_PARAMS,
    DVC_FILE,
    demo_tree,
    main,
    read_records,
    record_file,
    render,
)

RECORD = REPO_ROOT / record_file("cogr")
REWRITE = f"`{DEMO_COMMAND}` rewrites records/cogr.yaml and dvc.yaml from the params files; commit both"
DATASET = "metatool_sample"
STAGES = [f"prepare-{DATASET}", f"validate-{DATASET}", "cogr-train", "cogr-evaluate"]


def _git_work_tree() -> bool:
    done = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=REPO_ROOT, capture_output=True, text=True)
    return done.returncode == 0 and done.stdout.strip() == "true"


needs_git = pytest.mark.skipif(not _git_work_tree(), reason="the project is not a git work tree here")


def _declared_outputs(doc: dict) -> list[str]:
    """Every path a stage of ``doc`` writes: outs (plain or with options), metrics and plots."""
    paths = []
    for stage in doc["stages"].values():
        for kind in ("outs", "metrics", "plots"):
            for entry in stage.get(kind, []):
                paths.extend(entry if isinstance(entry, dict) else [entry])
    return paths


# ------------------------------------------------------------------ the committed files agree


def test_the_committed_pipeline_is_the_demo_record_and_its_rendering(tmp_path):
    assert RECORD.is_file() and (REPO_ROOT / DVC_FILE).is_file(), f"records/cogr.yaml or dvc.yaml is missing: {REWRITE}"
    recorded, resolved = flatten(yaml.safe_load(RECORD.read_text())), flatten(demo_tree(REPO_ROOT))
    changed = sorted(k for k in recorded.keys() | resolved.keys()
                     if recorded.get(k, "<absent>") != resolved.get(k, "<absent>"))
    if changed:
        pytest.fail(f"records/cogr.yaml differs from what `coevo demo` resolves today at {', '.join(changed[:5])}"
                    f"{' ...' if len(changed) > 5 else ''}: {REWRITE}", pytrace=False)
    written = write_record("cogr", demo_tree(REPO_ROOT), tmp_path)  # what a demo run's record_run writes
    if written.read_text() != RECORD.read_text():
        pytest.fail(f"records/cogr.yaml holds the demo's params but not as a demo run writes them: {REWRITE}",
                    pytrace=False)
    if (REPO_ROOT / DVC_FILE).read_text() != render(read_records(REPO_ROOT)):
        pytest.fail(f"dvc.yaml is not rendered from the records under records/: {REWRITE}", pytrace=False)


def test_the_rewrite_command_reproduces_the_committed_files(tmp_path, monkeypatch, capsys):
    for path in DEMO_PARAMS:  # a clone's params files and code: the command writes both files
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / path, tmp_path / path)
    (tmp_path / "coevo").symlink_to(REPO_ROOT / "coevo")  # the code deps are listed where the project holds the code
    monkeypatch.chdir(tmp_path)
    assert main(["--demo"]) == 0
    assert "wrote records/cogr.yaml" in capsys.readouterr().out
    for path in (record_file("cogr"), DVC_FILE):
        if (tmp_path / path).read_text() != (REPO_ROOT / path).read_text():
            pytest.fail(f"`{DEMO_COMMAND}` writes another {path} than the committed one: {REWRITE}", pytrace=False)


def test_the_demo_files_are_the_ones_coevo_demo_reads():
    from coevo.cli.run import DEMO_PARAMS as CLI_DEMO_PARAMS  # orchestration never imports the CLI

    assert tuple(DEMO_PARAMS) == tuple(CLI_DEMO_PARAMS)


def test_the_committed_pipeline_is_the_demo_on_the_embedded_sample():
    doc = yaml.safe_load((REPO_ROOT / DVC_FILE).read_text())
    assert list(doc["stages"]) == STAGES
    assert doc["stages"][STAGES[0]]["deps"][0] == "data/sample/metatool"
    assert list(read_records(REPO_ROOT)) == ["cogr"]


@needs_git
def test_git_ignores_every_declared_output_and_tracks_the_pipeline_files():
    outputs = _declared_outputs(yaml.safe_load((REPO_ROOT / DVC_FILE).read_text()))
    assert f"data/models/cogr/{DATASET}" in outputs and "metrics.json" in outputs
    check = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=REPO_ROOT, input="\n".join(outputs),
                           capture_output=True, text=True)
    assert sorted(check.stdout.split()) == sorted(outputs), "outputs git would track: " + ", ".join(
        sorted(set(outputs) - set(check.stdout.split())))
    tracked = ["dvc.yaml", "records/cogr.yaml", "dvc.lock"]  # dvc.lock: a user's run commits it with its experiment
    check = subprocess.run(["git", "check-ignore", "--no-index", *tracked], cwd=REPO_ROOT, capture_output=True,
                           text=True)
    assert check.returncode == 1 and not check.stdout, f"git ignores {check.stdout.split()}"


# ------------------------------------------------------------------ a fresh clone


def _project_files() -> list[str]:
    """The files a commit of the work tree holds: tracked ones still present, and new ones git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO_ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    return [name for name in listed if name and (REPO_ROOT / name).is_file()]


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A copy of the repository's files, committed in a new git repository (what `git clone` gives)."""
    root = tmp_path_factory.mktemp("clone")
    for name in _project_files():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / name, root / name)
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",  # coevo and dvc, as after `source .venv/bin/activate`
        "PYTHONPATH": str(root),  # the stages run the clone's code, the code DVC hashes
        "PREFECT_HOME": str(tmp_path_factory.mktemp("prefect_home")),  # outside the clone: its git status stays clean
        "DVC_NO_ANALYTICS": "1",
        "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    sh(["git", "init", "-q"], root, env)
    sh(["git", "add", "-A"], root, env)
    sh(["git", "commit", "-qm", "clone"], root, env)
    return root, env


def _porcelain(root: Path, env: dict[str, str]) -> list[str]:
    return sh(["git", "status", "--porcelain", "--untracked-files=all"], root, env).stdout.splitlines()


@needs_git
def test_a_clone_is_a_dvc_project_whose_repro_lists_the_demo_stages_in_order(clone):
    root, env = clone
    assert (root / ".dvc" / "config").is_file() and (root / "dvc.yaml").is_file()  # no `dvc init`, no first run
    # Nothing is built in a clone, so every stage runs: `--force` says the same without DVC hashing the
    # missing outputs of earlier stages, which plain `dvc repro --dry` does (and fails on: treeverse/dvc#9021).
    dry = sh([str(BIN / "dvc"), "repro", "--dry", "--force"], root, env)
    assert re.findall(r"Running stage '([^']+)'", dry.stdout) == STAGES, dry.stdout
    status = sh([str(BIN / "dvc"), "status"], root, env)
    assert [line[:-1] for line in status.stdout.splitlines() if re.match(r"^\S.*:$", line)] == STAGES, status.stdout
    pipeline = ["dvc.yaml", "records/cogr.yaml", "data/sample/metatool"]
    ignored = subprocess.run([str(BIN / "dvc"), "check-ignore", *pipeline], cwd=root, env=env, capture_output=True,
                             text=True)
    assert ignored.returncode == 1 and not ignored.stdout.strip(), f"DVC ignores {ignored.stdout.split()}"
    assert _porcelain(root, env) == []  # a dry run writes nothing


@needs_git
@pytest.mark.slow
@pytest.mark.full  # full tier: tests/test_init.py's wheel run does `dvc repro` of the same data stages for real
def test_a_clone_reproduces_the_data_stages_for_real(clone, prefect_server):
    root, env = clone
    env = {**env, "PREFECT_API_URL": prefect_server}  # one server for both stages (each would start its own)
    done = sh([str(BIN / "dvc"), "repro", *STAGES[:2]], root, env)
    assert re.findall(r"Running stage '([^']+)'", done.stdout) == STAGES[:2], done.stdout
    assert any((root / "data" / "processed" / DATASET).iterdir())
    assert (root / "reports" / "validation" / DATASET).is_dir()
    assert list(yaml.safe_load((root / "dvc.lock").read_text())["stages"]) == STAGES[:2]
    # the outputs are git-ignored; records/ and dvc.yaml are as committed; dvc.lock is new, for the user to commit
    assert _porcelain(root, env) == ["?? dvc.lock"]
    again = sh([str(BIN / "dvc"), "status", *STAGES[:2]], root, env)
    assert "Data and pipelines are up to date." in again.stdout, again.stdout
