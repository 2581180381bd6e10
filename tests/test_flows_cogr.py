"""The CoGR flow end to end with the `tiny` model on a toy MetaTool set.

One module-scoped finished run; every test that changes something works on its own copy of
that project, so the tests do not depend on their order.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO_ROOT, make_project, task_states

pytestmark = pytest.mark.slow


def run(**kwargs):
    from flows.cogr import cogr_flow

    return cogr_flow(params_path="params.yaml", **kwargs)


@pytest.fixture(scope="module")
def finished(tmp_path_factory, prefect_server):
    root = make_project(tmp_path_factory.mktemp("cogr_project"))
    previous = Path.cwd()
    os.chdir(root)
    try:
        summary = run()
    finally:
        os.chdir(previous)
    return root, summary


@pytest.fixture
def project(finished, tmp_path, chdir) -> Path:
    """A private copy of the finished project, as the working directory."""
    copy = tmp_path / "project"
    shutil.copytree(finished[0], copy, symlinks=True)
    chdir(copy)
    return copy


def summary_curve(root: Path) -> list[dict]:
    from coevo.config import load_params
    from coevo.orchestration.pipeline import Pipeline

    return Pipeline("cogr", load_params(root / "params.yaml")).method.training_curve()


def test_full_run_logs_every_phase_to_mlflow(finished, chdir, tmp_path):
    root, summary = finished
    chdir(root)
    labels = [r["label"] for r in summary["rows"] if r["kind"] != "baseline"]
    assert labels == ["SFT (val)", "round 1 query GRPO (val)", "round 1 item GRPO (val)", "SFT start (test)",
                      f"best phase {summary['best_phase']} (test)"]
    assert [(r["baseline"], r["split"]) for r in summary["rows"] if r["kind"] == "baseline"] == [
        ("bm25", "val"), ("dense", "val"), ("bm25", "test"), ("dense", "test")]
    differences = summary["rows"][-1]["differences"]
    assert {d["name"] for d in differences} == {"vs start", "vs best baseline", "vs paper baseline"}
    assert {d["b"] for d in differences if d["name"] == "vs paper baseline"} == {
        f"BM25 @k*={next(r['chosen_k'] for r in summary['rows'] if r.get('baseline') == 'bm25')} (test)"}  # CoGR's paper
    assert summary["steps"] == {"executed": 11, "cached": 0}

    from mlflow.tracking import MlflowClient

    client = MlflowClient(summary["mlflow"]["tracking_uri"])
    run_id = summary["mlflow"]["run_id"]
    mlrun = client.get_run(run_id)
    assert mlrun.info.status == "FINISHED"
    assert client.get_experiment(mlrun.info.experiment_id).name == "cogr"
    for name in ("val/f1", "val/precision", "val/recall", "val/recall_at_100", "val/ndcg_at_10", "val/mrr_at_100"):
        assert sorted(m.step for m in client.get_metric_history(run_id, name)) == [0, 1, 2], name
    assert not [k for k in mlrun.data.metrics if k.startswith("eval/")]  # the per-phase series name their split
    # Live: the run opened before training and each phase's val metrics arrived when the phase ended.
    f1 = sorted(client.get_metric_history(run_id, "val/f1"), key=lambda m: m.step)
    assert mlrun.info.start_time < f1[0].timestamp < f1[1].timestamp < f1[2].timestamp < mlrun.info.end_time
    for name in ("train/reward_mean", "train/kl"):
        assert sorted(m.step for m in client.get_metric_history(run_id, name)) == [1, 2], name
    # GRPO learning curves per training step, counted across the two GRPO phases.
    curve_steps = [p["global_step"] for p in summary_curve(root)]
    assert curve_steps and curve_steps == sorted(set(curve_steps))
    for name in ("grpo/reward", "grpo/reward_std", "grpo/frac_reward_zero_std", "grpo/step_time"):
        assert sorted(m.step for m in client.get_metric_history(run_id, name)) == curve_steps, name
    # Streamed while the phase trained: 01_query's steps arrive after 00_sft's val figures and before its own.
    for name in ("loss", "reward", "reward_std", "frac_reward_zero_std", "step_seconds"):
        points = client.get_metric_history(run_id, f"live/01_query/{name}")
        assert points and f1[0].timestamp <= min(p.timestamp for p in points), name
        assert max(p.timestamp for p in points) <= f1[1].timestamp, name
    assert [k for k in mlrun.data.metrics if k.startswith("live/00_sft") and k.endswith("/loss")], mlrun.data.metrics
    metrics = mlrun.data.metrics
    assert "bm25/val/f1" in metrics and "bm25/test/f1" in metrics and "test/00_sft/f1" in metrics
    # What a comparer reads first: the served phase's headline and its gains with CI bounds.
    gain = next(c for c in summary["evaluation"]["comparisons"] if c["name"] == "vs start" and c["metric"] == "f1")
    assert metrics["summary/vs_start"] == pytest.approx(gain["mean"])
    assert metrics["summary/vs_start_ci_low"] == pytest.approx(gain["ci_low"])
    assert {"summary/val_f1", "summary/test_f1", "summary/vs_best_baseline_ci_low"} <= set(metrics)
    assert mlrun.data.params["chosen_phase"] == mlrun.data.tags["chosen_phase"] == summary["best_phase"]
    assert mlrun.data.params["cogr.generator"] == "tiny"
    tags = mlrun.data.tags
    assert tags["git.commit"] and tags["prefect.flow_run_id"] == summary["flow_run_id"]
    assert tags["dvc.md5.data/processed/toy"].endswith(".dir")
    assert tags["dvc.md5.data/models/cogr/toy"].endswith(".dir")
    # Lineage: the prepared data set as the run's input, its digest the folder's DVC md5.
    (data_input,) = mlrun.inputs.dataset_inputs
    assert data_input.dataset.name == "toy" and data_input.dataset.digest == tags["dvc.md5.data/processed/toy"]
    assert json.loads(data_input.dataset.source)["uri"].endswith("data/processed/toy")
    assert tags["dvc.record"].startswith("none (not a DVC project")  # the toy project is no DVC repository

    artifacts = {a.path for a in client.list_artifacts(run_id)}
    for folder in ("report", "plots", "data_validation", "tables"):
        artifacts |= {a.path for a in client.list_artifacts(run_id, folder)}
    assert {"tables/results.json", "tables/differences.json", f"tables/per_query_{summary['best_phase']}.json"} <= artifacts
    resolved = yaml.safe_load(Path(client.download_artifacts(run_id, "params.yaml", str(tmp_path))).read_text())
    assert resolved == yaml.safe_load((root / "params.yaml").read_text())  # the params as one file
    results = json.loads(Path(client.download_artifacts(run_id, "tables/results.json", str(tmp_path))).read_text())
    assert results["columns"][:2] == ["label", summary["table_metrics"][0]] and len(results["data"]) == len(summary["rows"])
    assert {"metrics.json", "plots/cogr_phases.csv", "report/eval_f1.png", "report/keyword_dynamics.png",
            "report/keyword_dynamics.csv", "report/examples.md", "data_validation/validation.json"} <= artifacts

    written = json.loads((root / "metrics.json").read_text())
    assert set(written["baselines"]["bm25"]) == {"val", "test"}
    assert written["test"]["SFT start"]["n_queries"] > 0
    with (root / "plots/cogr_phases.csv").open() as f:
        assert [r["name"] for r in csv.DictReader(f)] == ["00_sft", "01_query", "02_item"]
    assert any((root / "data/indexes/cogr/toy/lucene").glob("segments_*"))


def test_second_run_executes_no_task(project: Path):
    summary = run()
    states = task_states(summary["flow_run_id"])
    assert summary["steps"] == {"executed": 0, "cached": 11}, states
    assert len(states) == 11 and all(state == "Cached" for (_, state) in states), states
    from mlflow.tracking import MlflowClient  # a cached run still produces a complete MLflow run

    client = MlflowClient(summary["mlflow"]["tracking_uri"])
    assert len(client.get_metric_history(summary["mlflow"]["run_id"], "val/f1")) == 3


def test_the_run_is_open_with_its_input_when_training_starts(project: Path, monkeypatch):
    """What the UI shows while SFT runs: a RUNNING run with its params and the prepared data set."""
    from mlflow.tracking import MlflowClient

    import coevo.orchestration.flow

    seen = {}
    real_train = coevo.orchestration.flow._train

    def train_watched(pipe, stage, train, live=None):
        run = MlflowClient(live.tracker.uri).get_run(live.tracker.run_id)
        seen.update(status=run.info.status, inputs=[i.dataset.name for i in run.inputs.dataset_inputs],
                    generator=run.data.params.get("cogr.generator"))
        return real_train(pipe, stage, train, live)

    monkeypatch.setattr(coevo.orchestration.flow, "_train", train_watched)
    run()
    assert seen == {"status": "RUNNING", "inputs": ["toy"], "generator": "tiny"}


def test_a_train_stage_handed_to_a_deployment_charts_its_steps_into_the_flows_run(project: Path, monkeypatch):
    """`train_deployment`: the deployment's flow (run here in-process, where a GPU worker would run
    it) gets the handing flow's MLflow run, charts every trainer step into it while it trains, opens
    no run of its own and leaves the run's status to the flow that opened it."""
    from mlflow.tracking import MlflowClient

    import coevo.orchestration.flow
    from coevo.config import load_params
    from coevo.orchestration.tracking import absolute_uri

    client = MlflowClient(absolute_uri(load_params("params.yaml").tracking.uri))
    experiment = client.get_experiment_by_name("cogr").experiment_id
    runs_before = len(client.search_runs([experiment]))
    handed, window = {}, []

    def deployment(name, params_path, overrides, live_run_id=None, resolved=None):
        handed.update(name=name, run_id=live_run_id)
        started = time.time() * 1000
        coevo.orchestration.flow.run_pipeline("cogr", params_path, overrides, "train", live_run_id=live_run_id,
                                              resolved=resolved)
        window.extend([started, time.time() * 1000])
        handed["status"] = client.get_run(live_run_id).info.status

    monkeypatch.setattr(coevo.orchestration.flow, "train_elsewhere", deployment)
    summary = run(overrides=["cogr.grpo.learning_rate=1e-4"], train_deployment="cogr/train-gpu")
    run_id = summary["mlflow"]["run_id"]
    assert handed == {"name": "cogr/train-gpu", "run_id": run_id, "status": "RUNNING"}
    assert client.get_run(run_id).info.status == "FINISHED"
    assert len(client.search_runs([experiment])) == runs_before + 1  # the deployment opened none
    for name in ("loss", "reward", "step_seconds"):  # 01_query retrained (new rate): streamed while it trained
        points = client.get_metric_history(run_id, f"live/01_query/{name}")
        assert points and window[0] <= min(p.timestamp for p in points) <= max(p.timestamp for p in points) <= window[1]


def test_lost_phase_resumes_there_and_reuses_the_rest(project: Path):
    # A run killed during the item phase leaves no 02_item folder (phases commit atomically).
    before = json.loads(Path("data/models/cogr/toy/phases/02_item/metrics.json").read_text())
    shutil.rmtree("data/models/cogr/toy/phases/02_item")
    states = task_states(run()["flow_run_id"])
    assert states[("cogr-02_item", "Completed")] == 1, states  # only the lost phase trains again
    assert states[("cogr-01_query", "Cached")] == 1 and states[("cogr-00_sft", "Cached")] == 1
    assert states[("cogr-seed", "Cached")] == 1
    after = json.loads(Path("data/models/cogr/toy/phases/02_item/metrics.json").read_text())

    def results(record: dict) -> dict:  # wall-clock figures differ run to run; results must not
        return {k: v for k, v in record.items() if k not in ("seconds", "train")}

    assert results(after) == results(before)


def test_changed_grpo_param_reruns_only_the_grpo_phases(project: Path):
    states = task_states(run(overrides=["cogr.grpo.learning_rate=1e-4"])["flow_run_id"])
    for name in ("prepare-data", "validate-data", "cogr-seed", "cogr-00_sft", "baseline-bm25", "baseline-dense"):
        assert states[(name, "Cached")] == 1, (name, states)
    for name in ("cogr-01_query", "cogr-02_item", "cogr-final", "cogr-reports"):
        assert states[(name, "Completed")] == 1, (name, states)


def test_evaluation_split_reruns_only_the_evaluation(project: Path):
    states = task_states(run(overrides=["evaluation.split=val"])["flow_run_id"])
    assert all(state == "Cached" for (name, state) in states if name.startswith(("cogr-0", "cogr-seed"))), states
    # Another split's evaluation steps have their own names and stamps: the test split's stay valid.
    assert states[("cogr-final-val", "Completed")] == 1 and ("cogr-final", "Completed") not in states, states
    back = task_states(run()["flow_run_id"])
    assert back[("cogr-final", "Cached")] == 1 and back[("cogr-reports", "Completed")] == 1, back


def test_failed_validation_stops_the_flow_with_the_report_path(project: Path):
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


def test_cli_answers_a_finished_pipeline_without_starting_prefect(project: Path):
    env = {**os.environ, "PREFECT_API_URL": "http://127.0.0.1:9/api"}  # unreachable: must not be needed
    result = subprocess.run([str(Path(sys.executable).parent / "coevo"), "run", "cogr"], capture_output=True, text=True,
                            timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    assert "up to date" in result.stdout and "best phase" in result.stdout, result.stdout


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
