"""The CoGR flow end to end with the `tiny` model on a toy MetaTool set.

One module-scoped project (a temp folder holding params.yaml and the toy data) and one
Prefect test server are shared by the tests below; they run in file order and build on each
other: full run -> cached re-run -> resume after a lost phase -> a changed GRPO param.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
from collections import Counter
from pathlib import Path

import pytest
import yaml

from conftest import REPO_ROOT, SAMPLE_DIR

pytestmark = pytest.mark.slow
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # no telemetry calls from tests

TOY_TOOLS = 6
QUERIES_PER_TOOL = 8


def make_toy_metatool(dest: Path) -> Path:
    """A MetaTool-format subset of the committed sample: 6 tools, 8 queries each."""
    src = SAMPLE_DIR / "metatool"
    descriptions = json.loads((src / "plugin_des.json").read_text())
    with (src / "all_clean_data.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    tools = list(dict.fromkeys(r["Tool"] for r in rows))[:TOY_TOOLS]
    keep = [r for t in tools for r in [r for r in rows if r["Tool"] == t][:QUERIES_PER_TOOL]]
    dest.mkdir(parents=True, exist_ok=True)
    with (dest / "all_clean_data.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["Query", "Tool"])
        writer.writeheader()
        writer.writerows(keep)
    (dest / "plugin_des.json").write_text(json.dumps({t: descriptions[t] for t in tools}))
    return dest


def toy_params(dest: Path) -> Path:
    """params.yaml with the toy data and a tiny model, one round, a handful of prompts."""
    params = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    params["data"].update(dataset="toy", loader="metatool", source="toy")
    cogr = params["cogr"]
    cogr.update(generator="tiny", seed_generator=None, rounds=1)
    cogr["sft"].update(epochs=1, batch_size=8)
    cogr["grpo"].update(num_generations=2, batch_size=4, max_prompts_per_phase=4, max_completion_length=12)
    cogr["sampling"].update(max_new_tokens=12)
    cogr["early_stopping"].update(patience=5)
    dest.write_text(yaml.safe_dump(params, sort_keys=False))
    return dest


def make_project(root: Path, *, with_code: bool = False) -> Path:
    """A project folder for the flows: toy data, params.yaml, and (for DVC) the code deps."""
    root.mkdir(parents=True, exist_ok=True)
    make_toy_metatool(root / "toy")
    toy_params(root / "params.yaml")
    if with_code:
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        for name in ("coevo", "tasks", "flows"):
            shutil.copytree(REPO_ROOT / name, root / name, ignore=ignore)
        shutil.copytree(REPO_ROOT / "pipelines", root / "pipelines")
        for name in ("dvc.yaml", ".dvcignore"):
            shutil.copy(REPO_ROOT / name, root / name)
    return root


def task_states(flow_run_id: str) -> Counter:
    """(task name, state name) counts of one flow run, from the Prefect API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return Counter((r.name.rsplit("-", 1)[0], r.state.name) for r in runs)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    from prefect.testing.utilities import prefect_test_harness

    root = make_project(tmp_path_factory.mktemp("cogr_project"))
    previous = Path.cwd()
    os.chdir(root)
    try:
        with prefect_test_harness(server_startup_timeout=None):
            yield root
    finally:
        os.chdir(previous)


def run(**kwargs):
    from flows.cogr import cogr_flow

    return cogr_flow(params_path="params.yaml", **kwargs)


def test_full_run_logs_every_phase_to_mlflow(project: Path):
    summary = run()
    phases = [r for r in summary["rows"] if not r["label"].startswith(("BM25", "best"))]
    assert [r["label"] for r in phases] == ["SFT", "round 1 query", "round 1 item"]
    assert summary["steps"]["cached"] == 0 and summary["steps"]["executed"] == 11

    from mlflow.tracking import MlflowClient

    client = MlflowClient(summary["mlflow"]["tracking_uri"])
    run_id = summary["mlflow"]["run_id"]
    mlrun = client.get_run(run_id)
    assert mlrun.info.status == "FINISHED"
    assert client.get_experiment(mlrun.info.experiment_id).name == "cogr"
    for name in ("eval/f1", "eval/precision", "eval/recall", "eval/recall_at_100", "eval/ndcg_at_10", "eval/mrr_at_100"):
        steps = sorted(m.step for m in client.get_metric_history(run_id, name))
        assert steps == [0, 1, 2], name
    for name in ("train/reward_mean", "train/kl"):
        assert sorted(m.step for m in client.get_metric_history(run_id, name)) == [1, 2], name
    assert "bm25/f1" in mlrun.data.metrics and "test/f1" in mlrun.data.metrics
    assert mlrun.data.params["cogr.generator"] == "tiny"
    tags = mlrun.data.tags
    assert tags["git.commit"] and tags["prefect.flow_run_id"]
    assert tags["dvc.md5.data/processed/toy"].endswith(".dir")
    assert tags["dvc.md5.data/models/cogr/toy"].endswith(".dir")

    artifacts = {a.path for a in client.list_artifacts(run_id)}
    for folder in ("report", "plots", "data_validation"):
        artifacts |= {a.path for a in client.list_artifacts(run_id, folder)}
    assert {
        "metrics.json", "plots/cogr_phases.csv", "report/eval_f1.png", "report/keyword_dynamics.png",
        "report/keyword_dynamics.csv", "report/examples.md", "data_validation/validation.json",
    } <= artifacts

    metrics = json.loads(Path("metrics.json").read_text())
    assert set(metrics["bm25"]) == {"val", "test"} and "f1" in metrics["test"]
    with open("plots/cogr_phases.csv") as f:
        assert [r["name"] for r in csv.DictReader(f)] == ["00_sft", "01_query", "02_item"]
    assert any(Path("data/indexes/cogr/toy/lucene").glob("segments_*"))


def test_second_run_executes_no_task(project: Path):
    summary = run()
    states = task_states(summary["flow_run_id"])
    assert summary["steps"] == {"executed": 0, "cached": 11}, states
    assert states and all(state == "Cached" for (_, state) in states), states
    # a cached run still produces a complete MLflow run
    from mlflow.tracking import MlflowClient

    client = MlflowClient(summary["mlflow"]["tracking_uri"])
    assert len(client.get_metric_history(summary["mlflow"]["run_id"], "eval/f1")) == 3


def test_lost_phase_resumes_there_and_reuses_the_rest(project: Path):
    # A run killed during the item phase leaves no 02_item folder (phases commit atomically).
    before = json.loads(Path("data/models/cogr/toy/phases/02_item/metrics.json").read_text())
    shutil.rmtree("data/models/cogr/toy/phases/02_item")
    summary = run()
    states = task_states(summary["flow_run_id"])
    assert states[("cogr-grpo-phase", "Completed")] == 1  # only the lost phase trains again
    assert states[("cogr-grpo-phase", "Cached")] == 1
    assert states[("cogr-sft", "Cached")] == 1 and states[("cogr-seed-keywords", "Cached")] == 1
    after = json.loads(Path("data/models/cogr/toy/phases/02_item/metrics.json").read_text())
    def results(record: dict) -> dict:  # wall-clock figures differ run to run; results must not
        return {k: v for k, v in record.items() if "seconds" not in k and "per_s" not in k}

    assert results(after) == results(before)


def test_changed_grpo_param_reruns_only_the_grpo_phases(project: Path):
    summary = run(overrides=["cogr.grpo.learning_rate=1e-4"])
    states = task_states(summary["flow_run_id"])
    assert states[("cogr-seed-keywords", "Cached")] == 1 and states[("cogr-sft", "Cached")] == 1, states
    assert states[("prepare-data", "Cached")] == 1 and states[("validate-data", "Cached")] == 1
    assert states[("cogr-grpo-phase", "Completed")] == 2


def test_failed_validation_stops_the_flow_with_the_report_path(project: Path, tmp_path: Path):
    import pandas as pd

    from coevo.data.validation import DataValidationError

    bad = Path("data/processed/bad")
    shutil.copytree("data/processed/toy", bad)
    qrels = pd.read_parquet(bad / "qrels.parquet")
    qrels.loc[0, "item_id"] = "no-such-tool"
    qrels.to_parquet(bad / "qrels.parquet", index=False)
    with pytest.raises(DataValidationError, match="reports/validation/bad/validation.json"):
        run(overrides=["data.dataset=bad"], stage="validate")
    assert Path("reports/validation/bad/validation.json").exists()


def test_prefect_yaml_deployments_load_and_match_flow_signatures():
    """Every deployment names a loadable flow, parameters it accepts, a work pool and valid crons."""
    import inspect

    from prefect.client.schemas.schedules import CronSchedule
    from prefect.flows import load_flow_from_entrypoint

    config = yaml.safe_load((REPO_ROOT / "prefect.yaml").read_text())
    pools = set()
    for deployment in config["deployments"]:
        flow_obj = load_flow_from_entrypoint(str(REPO_ROOT / deployment["entrypoint"]))
        accepted = set(inspect.signature(flow_obj.fn).parameters)
        assert set(deployment.get("parameters", {})) <= accepted, deployment["name"]
        pools.add(deployment["work_pool"]["name"])
        for schedule in deployment.get("schedules", []):
            CronSchedule(cron=schedule["cron"], timezone=schedule.get("timezone"))
    assert pools == {"coevo-cpu", "coevo-gpu"}
    nightly = next(d for d in config["deployments"] if d["name"] == "nightly")
    train = next(d for d in config["deployments"] if d["name"] == "train-gpu")
    assert nightly["parameters"]["train_deployment"] == "cogr/train-gpu" and train["work_pool"]["name"] == "coevo-gpu"


@pytest.mark.parametrize(
    "override",
    ["cogr.seed_temperature=0.3", "cogr.m_item_keywords=7", "cogr.sampling.top_p=0.5", "cogr.seed_generator=tiny"],
)
def test_every_algorithm1_knob_invalidates_the_seeds(params_file: Path, override: str):
    # A knob the seeds depend on but the stamp leaves out would silently reuse stale seeds.
    from coevo.config import load_params
    from flows.cogr import run_parts

    def seed_stamp(overrides: list[str]) -> dict:
        parts = {part.name: part for part in run_parts(load_params(params_file, overrides))}
        return parts["seed"].params

    assert seed_stamp([override]) != seed_stamp([])
    assert seed_stamp(["cogr.grpo.learning_rate=1e-3"]) == seed_stamp([])
