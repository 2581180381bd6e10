"""Every run leaves a DVC record that reproduces that very model, as a user meets it: in a
fresh project `coevo run cogr` leaves `dvc status` clean; a second run with one knob changed
(and a push to a local remote) sits beside the first in `dvc exp show`; `dvc repro -f` re-runs
every stage from the record to the same files; `dvc exp apply` brings back the first run's
checkpoint with the md5 its registered model version carries.

Runs in a temporary git repository holding a copy of the code, params.yaml and a toy data set,
so the project's own DVC state is never touched. The tests run in order, each on the last.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from conftest import BIN, dvc_repo, make_project, sh

pytestmark = pytest.mark.slow


def coevo_run(root: Path, env: dict[str, str], *overrides: str) -> subprocess.CompletedProcess:
    args = [str(BIN / "coevo"), "run", "cogr"]
    for item in overrides:
        args += ["--set", item]
    return sh(args, root, env)


def lock_outs(root: Path) -> dict[str, str]:
    """path -> md5 of every stage output in dvc.lock."""
    import yaml

    lock = yaml.safe_load((root / "dvc.lock").read_text())
    return {o["path"]: o["md5"] for stage in lock["stages"].values() for o in stage.get("outs", [])}


def version_tags(root: Path, version: int) -> dict[str, str]:
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    return dict(client.get_model_version("coevo-cogr-toy", str(version)).tags)


def default_rate(root: Path) -> float:
    import yaml

    return yaml.safe_load((root / "params.yaml").read_text())["cogr"]["grpo"]["learning_rate"]


def ran_stages(output: str) -> list[str]:
    return re.findall(r"Running stage '([^']+)'", output)


@pytest.fixture(scope="module")
def repo(tmp_path_factory, prefect_server):
    root = make_project(tmp_path_factory.mktemp("dvc_project"), with_code=True)
    env = dvc_repo(root, prefect_server)
    return root, env


def test_a_run_leaves_its_record_and_dvc_status_is_clean(repo):
    root, env = repo
    run = coevo_run(root, env)
    assert "DVC record: experiment cogr-toy-" in run.stdout, run.stdout
    for path in ("records/cogr.yaml", "dvc.yaml", "dvc.lock", "metrics.json", "data/models/cogr/toy/phases/00_sft"):
        assert (root / path).exists(), path
    status = sh([str(BIN / "dvc"), "status"], root, env)
    assert "Data and pipelines are up to date." in status.stdout, status.stdout
    shown = sh([str(BIN / "dvc"), "metrics", "show"], root, env)  # GRAPE and CoHyDE never ran: no warning
    assert "failed to load" not in shown.stdout + shown.stderr and "metrics.json" in shown.stdout
    tags = version_tags(root, 1)  # from the champion back to its exact files
    assert tags["dvc.checkpoint_md5"] == lock_outs(root)["data/models/cogr/toy"]
    assert tags["dvc.experiment"].startswith("cogr-toy-") and len(tags["dvc.experiment_rev"]) == 40


def test_a_second_run_sits_beside_the_first_in_dvc_exp_show_and_is_pushed(repo, tmp_path_factory):
    root, env = repo
    remote = tmp_path_factory.mktemp("dvc_remote")
    sh([str(BIN / "dvc"), "remote", "add", "--default", "local", str(remote)], root, env)
    coevo_run(root, env, "cogr.grpo.learning_rate=0.001", "dvc.push=true")
    assert "Data and pipelines are up to date." in sh([str(BIN / "dvc"), "status"], root, env).stdout
    shown = json.loads(sh([str(BIN / "dvc"), "exp", "show", "--json"], root, env).stdout)
    runs = {rev["name"]: rev["data"] for base in shown for exp in base.get("experiments") or [] for rev in exp["revs"]}
    assert len(runs) == 2 and all(name.startswith("cogr-toy-") for name in runs), list(runs)
    rates = {data["params"]["records/cogr.yaml"]["data"]["cogr"]["grpo"]["learning_rate"] for data in runs.values()}
    assert rates == {default_rate(root), 0.001}, rates
    assert all("metrics.json" in data["metrics"] for data in runs.values())
    assert version_tags(root, 2)["dvc.pushed"] == "true"
    pushed = {p.name for p in remote.rglob("*") if p.is_file()}
    assert lock_outs(root)["data/models/cogr/toy"][2:] in pushed  # DVC's remote layout: files/md5/<2>/<rest>


def test_repro_force_rebuilds_the_recorded_run_to_the_same_files(repo):
    root, env = repo
    before = lock_outs(root)
    run = sh([str(BIN / "dvc"), "repro", "--force"], root, env)
    assert ran_stages(run.stdout) == ["prepare-toy", "validate-toy", "cogr-train", "cogr-evaluate"], run.stdout
    assert "done" not in "".join(line for line in run.stderr.splitlines() if "GRPO" in line or "SFT" in line)
    after = lock_outs(root)
    # Lucene writes a random segment id and a timestamp into every index it builds: only that output differs
    assert {p for p in before if before[p] != after[p]} <= {"data/indexes/cogr/toy"}, (before, after)


def test_apply_brings_back_the_first_checkpoint_its_model_version_names(repo):
    from coevo.steps import fingerprint

    root, env = repo
    first = version_tags(root, 1)
    sh([str(BIN / "dvc"), "exp", "apply", first["dvc.experiment"]], root, env)
    assert fingerprint(root / "data/models/cogr/toy") == first["dvc.checkpoint_md5"]
    from coevo.config import load_params

    assert load_params([root / "records/cogr.yaml"]).cogr.grpo.learning_rate == default_rate(root)
    assert "Data and pipelines are up to date." in sh([str(BIN / "dvc"), "status"], root, env).stdout
