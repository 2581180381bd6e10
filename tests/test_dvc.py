"""dvc.yaml drives the flow's stages: a second `dvc repro` is a no-op, a training param
re-runs train and evaluate only, and metrics/plots diffs work.

Runs in a temporary git repository holding a copy of the code, dvc.yaml, params.yaml and a
toy data set, so the project's own DVC state is never touched.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO_ROOT, make_project

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent


def sh(args: list[str], cwd: Path, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def ran_stages(output: str) -> list[str]:
    return re.findall(r"Running stage '([^']+)'", output)


@pytest.fixture(scope="module")
def repo(tmp_path_factory, prefect_server):
    root = make_project(tmp_path_factory.mktemp("dvc_project"), with_code=True)
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PREFECT_HOME": str(root / ".prefect-home"),
        "PYTHONPATH": str(root),  # stage commands import the copied code, the one DVC hashes
        "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    sh(["git", "init", "-q"], root, env)
    sh([str(BIN / "dvc"), "init", "-q"], root, env)
    sh([str(BIN / "dvc"), "config", "core.analytics", "false"], root, env)
    (root / ".gitignore").write_text((REPO_ROOT / ".gitignore").read_text())
    sh(["git", "add", "-A"], root, env)
    sh(["git", "commit", "-qm", "toy project"], root, env)
    env["PREFECT_API_URL"] = prefect_server  # one server for every stage command (each would start its own)
    return root, env


def test_repro_runs_every_stage_then_is_a_no_op(repo):
    root, env = repo
    first = sh([str(BIN / "dvc"), "repro"], root, env)
    assert ran_stages(first.stdout) == ["prepare", "validate", "train", "evaluate"], first.stdout
    for path in ("metrics.json", "plots/cogr_phases.csv", "dvc.lock", "data/models/cogr/toy/phases/00_sft"):
        assert (root / path).exists(), path
    second = sh([str(BIN / "dvc"), "repro"], root, env)
    assert ran_stages(second.stdout) == [], second.stdout
    status = sh([str(BIN / "dvc"), "status", "dvc.yaml"], root, env)  # GRAPE/CoHyDE pipelines never ran
    assert "up to date" in status.stdout, status.stdout
    sh(["git", "add", "-A"], root, env)
    sh(["git", "commit", "-qm", "first pipeline run"], root, env)


def test_training_param_reruns_train_and_evaluate_only(repo):
    root, env = repo
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["cogr"]["grpo"]["learning_rate"] = 1.0e-3
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run = sh([str(BIN / "dvc"), "repro"], root, env)
    assert ran_stages(run.stdout) == ["train", "evaluate"], run.stdout
    # Inside the train stage the same keys as `coevo run` decide: only the GRPO phases trained.
    assert "round 1 query GRPO: done" in run.stderr and "SFT: cached" in run.stderr, run.stderr

    diff = sh([str(BIN / "dvc"), "params", "diff", "--json"], root, env)
    assert "cogr.grpo.learning_rate" in json.loads(diff.stdout)["params.yaml"]
    metrics = sh([str(BIN / "dvc"), "metrics", "diff", "--all", "--json"], root, env)
    assert "metrics.json" in json.loads(metrics.stdout)
    plots = sh([str(BIN / "dvc"), "plots", "diff", "--json"], root, env)
    assert "plots/cogr_phases.csv" in plots.stdout
