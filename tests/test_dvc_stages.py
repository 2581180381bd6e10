"""dvc.yaml from the runs' records: which stages, which params file, which paths, and when a run
leaves no record. (The user's path through DVC, with real runs, is tests/test_dvc.py.)"""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from conftest import REPO_ROOT
from coevo.config import load_params, load_tree
from coevo.orchestration.dvc_record import record_run, why_not_recordable, write_record
from coevo.orchestration.dvc_stages import read_records, record_file, render, targets


def _params(*overrides: str):
    return load_params([REPO_ROOT / "params.yaml"], list(overrides))


def test_one_record_gives_its_data_stages_and_its_own_run_with_the_record():
    doc = yaml.safe_load(render({"cogr": _params("data.dataset=toy", "data.source=toy")}))
    stages = doc["stages"]
    assert list(stages) == ["prepare-toy", "validate-toy", "cogr-train", "cogr-evaluate"]
    assert stages["cogr-train"]["cmd"] == "coevo run cogr -p records/cogr.yaml --stage train"
    (params_file, keys), = stages["cogr-train"]["params"][0].items()
    assert params_file == "records/cogr.yaml" and keys[0] == "seed" and "cogr.grpo.learning_rate" in keys
    assert stages["cogr-train"]["outs"] == [{"data/models/cogr/toy": {"persist": True}}]
    assert stages["prepare-toy"]["deps"][0] == "toy" and stages["prepare-toy"]["outs"] == ["data/processed/toy"]
    assert stages["cogr-evaluate"]["metrics"] == ["metrics.json"]
    assert "coevo/report.py" in stages["cogr-evaluate"]["deps"] and "coevo/methods/cogr.py" in stages["cogr-train"]["deps"]
    assert "plots" in doc  # CoGR's per-phase charts


def test_methods_not_run_have_no_stage_and_a_shared_data_set_has_one_owner():
    grape_only = yaml.safe_load(render({"grape": _params()}))["stages"]
    assert not any(name.startswith(("cogr", "cohyde")) for name in grape_only)
    assert grape_only["grape-evaluate"]["metrics"] == ["reports/grape/metrics.json"]

    both = yaml.safe_load(render({"cogr": _params(), "grape": _params(), "cohyde": _params("data.dataset=other")}))
    stages = both["stages"]
    dataset = _params().data.dataset
    assert stages[f"prepare-{dataset}"]["cmd"].startswith("coevo run cogr ")  # first in SPECS order owns it
    assert stages["prepare-other"]["cmd"].startswith("coevo run cohyde ")
    assert [s for s in stages if s.startswith("prepare-")] == [f"prepare-{dataset}", "prepare-other"]
    assert targets("grape", _params()) == [f"prepare-{dataset}", f"validate-{dataset}", "grape-train", "grape-evaluate"]


def test_a_record_is_the_resolved_tree_and_reads_back_as_the_same_params(tmp_path):
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("cogr:\n  rounds: 3\n")
    files, overrides = [REPO_ROOT / "params.yaml", overlay], ["seed=7"]
    path = write_record("cogr", load_tree(files, overrides), tmp_path)
    assert path == tmp_path / record_file("cogr")
    assert path.read_text().startswith("# The params the last whole `coevo run cogr` resolved")
    assert read_records(tmp_path) == {"cogr": load_params(files, overrides)}


def test_a_run_outside_a_dvc_project_or_with_the_record_off_says_why(tmp_path):
    assert "not a DVC project" in why_not_recordable(tmp_path)
    (tmp_path / ".dvc").mkdir()
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    assert "no commit yet" in why_not_recordable(tmp_path)
    off = record_run("cogr", _params("dvc.record=false"), {}, "x", tmp_path)
    assert off.skipped == "dvc.record is false" and off.tags() == {"dvc.record": "none (dvc.record is false)"}
    assert not (tmp_path / "records").exists()


def test_regenerating_without_records_says_what_writes_them(tmp_path):
    done = subprocess.run([sys.executable, "-m", "coevo.orchestration.dvc_stages"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 1 and "`coevo run <method>`" in done.stdout
    assert not (tmp_path / "dvc.yaml").exists()


@pytest.mark.parametrize("method", ["cogr", "grape", "cohyde"])
def test_every_method_renders_with_the_project_params(method):
    stages = yaml.safe_load(render({method: _params()}))["stages"]
    assert {f"{method}-train", f"{method}-evaluate"} <= set(stages)
