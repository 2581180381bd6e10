"""MLflow tracking helpers: fail-fast reachability, stable metric names, one run with everything."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from coevo.orchestration.tracking import Tracker, TrackingError, check_reachable, metric_name, phase_metrics


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens there


def test_unreachable_remote_uri_fails_fast_with_a_clear_message():
    uri = f"http://127.0.0.1:{_closed_port()}"
    started = time.perf_counter()
    with pytest.raises(TrackingError, match="unreachable") as info:
        check_reachable(uri, timeout_s=2.0)
    assert time.perf_counter() - started < 5
    assert uri in str(info.value) and "sqlite:///mlflow.db" in str(info.value)


def test_unresolvable_host_fails_fast():
    with pytest.raises(TrackingError):
        check_reachable("http://no-such-host.invalid:5000", timeout_s=2.0)


def test_local_store_needs_an_existing_folder(tmp_path: Path):
    check_reachable(f"sqlite:///{tmp_path}/mlflow.db")
    with pytest.raises(TrackingError, match="does not exist"):
        check_reachable(f"sqlite:///{tmp_path}/missing/dir/mlflow.db")


def test_metric_names_are_mlflow_safe_and_stable():
    assert metric_name("eval/recall@100") == "eval/recall_at_100"
    assert metric_name("eval/f1") == "eval/f1"
    record = {"eval/f1": 0.5, "train/kl": 0.1, "phase": 3, "name": "03_query", "eval/bad": float("nan")}
    assert phase_metrics(record) == {"eval/f1": 0.5, "train/kl": 0.1}


def test_tracker_logs_params_steps_tags_and_artifacts(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "table.csv").write_text("a,b\n1,2\n")
    uri = "sqlite:///mlflow.db"
    with Tracker(uri=uri, artifact_root="mlruns", experiment="cogr") as tracker:
        tracker.log_params({"cogr.rounds": 2, "cogr.lora.target_modules": ["q_proj", "v_proj"]})
        for step, f1 in enumerate([0.1, 0.2, 0.3]):
            tracker.log_metrics({"eval/f1": f1, "eval/recall@100": f1 * 2, "eval/skip": float("inf")}, step=step)
        tracker.set_tags({"git.commit": "abc"})
        tracker.log_artifact(tmp_path / "report", "report")
        tracker.log_json({"f1": 0.3}, "metrics.json")
        run_id = tracker.run_id
        assert tracker.run_url().endswith(f"/runs/{run_id}")

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracker.uri)  # absolute: MLflow caches stores by URI string
    assert tracker.uri == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["cogr.rounds"] == "2"
    assert run.data.params["cogr.lora.target_modules"] == '["q_proj", "v_proj"]'
    assert run.data.tags["git.commit"] == "abc"
    history = client.get_metric_history(run_id, "eval/f1")
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == [(0, 0.1), (1, 0.2), (2, 0.3)]
    assert "eval/recall_at_100" in run.data.metrics and "eval/skip" not in run.data.metrics
    names = {a.path for a in client.list_artifacts(run_id)} | {a.path for a in client.list_artifacts(run_id, "report")}
    assert {"metrics.json", "report/table.csv"} <= names
    # artifacts live under the configured root, one folder per experiment
    assert (tmp_path / "mlruns" / "cogr" / run_id / "artifacts" / "metrics.json").exists()


def test_a_run_samples_system_metrics_while_it_is_open(tmp_path: Path, monkeypatch):
    import time

    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)
    with Tracker(uri="sqlite:///mlflow.db", artifact_root="mlruns", experiment="cogr", system_metrics_s=0.2) as tracker:
        time.sleep(1.5)
        run_id = tracker.run_id
    client = MlflowClient(tracker.uri)
    cpu = client.get_metric_history(run_id, "system/cpu_utilization_percentage")
    memory = client.get_metric_history(run_id, "system/system_memory_usage_megabytes")
    assert len(cpu) >= 2 and sorted(m.step for m in cpu) == list(range(len(cpu)))  # a series, not one value
    assert memory and all(m.value > 0 for m in memory)
    assert client.get_run(run_id).info.status == "FINISHED"
    with Tracker(uri="sqlite:///mlflow.db", artifact_root="mlruns", experiment="cogr") as quiet:  # 0: off
        time.sleep(0.3)
    assert not [k for k in client.get_run(quiet.run_id).data.metrics if k.startswith("system/")]


CTRL_C_INSIDE_LOGGING = """
import logging, sys, time
from coevo.orchestration.tracking import Tracker
with Tracker(uri="sqlite:///mlflow.db", artifact_root="mlruns", experiment="cogr", system_metrics_s=0.2) as tracker:
    print(tracker.run_id, flush=True)
    time.sleep(1.0)
    logging._lock.acquire()  # what a Ctrl-C landing inside logging's lock-taking leaves held
    logging.root.manager._clear_cache()  # so the sampler thread's next level check needs that lock
    time.sleep(1.0)
    raise KeyboardInterrupt
"""


def test_ctrl_c_inside_a_logging_call_still_ends_the_run_killed(tmp_path: Path):
    """Seen once under load: Ctrl-C during SFT left `coevo run` hung for good, its main thread joining
    MLflow's system-metrics sampler, which waited on the logging lock the interrupt had left held."""
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient

    from conftest import REPO_ROOT

    done = subprocess.run([sys.executable, "-c", CTRL_C_INSIDE_LOGGING], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode != 0 and "KeyboardInterrupt" in done.stderr, done.stderr[-2000:]
    run_id = done.stdout.split()[0]
    assert MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(run_id).info.status == "KILLED"


def test_failed_block_marks_the_run_failed(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RuntimeError):
        with Tracker(uri="sqlite:///mlflow.db", artifact_root="mlruns", experiment="grape") as tracker:
            raise RuntimeError("boom")
    from mlflow.tracking import MlflowClient

    assert MlflowClient(tracker.uri).get_run(tracker.run_id).info.status == "FAILED"


def test_cli_rejects_bad_params_and_unreachable_store_before_any_work(tmp_path: Path, monkeypatch):
    from typer.testing import CliRunner

    from coevo.cli import app

    monkeypatch.chdir(tmp_path)
    params = Path(__file__).resolve().parents[1] / "params.yaml"
    runner = CliRunner()
    bad = runner.invoke(app, ["run", "cogr", "--params", str(params), "--set", "cogr.rounds=-1"])
    assert bad.exit_code == 2 and "cogr.rounds" in bad.output
    started = time.perf_counter()
    unreachable = runner.invoke(
        app, ["run", "cogr", "--params", str(params), "--set", f"tracking.uri=http://127.0.0.1:{_closed_port()}"]
    )
    assert unreachable.exit_code == 2 and "unreachable" in unreachable.output
    assert time.perf_counter() - started < 10
    assert not (tmp_path / "data").exists() and not (tmp_path / ".prefect").exists()  # nothing ran


def test_a_scheme_mlflow_does_not_support_is_refused_at_once():
    started = time.perf_counter()
    with pytest.raises(TrackingError, match="scheme 'ftp' is not a tracking store MLflow supports"):
        check_reachable("ftp://example.org/mlflow")
    assert time.perf_counter() - started < 1
    check_reachable("postgresql+psycopg2://user@db.invalid/mlflow")  # MLflow's own client reports those


def test_a_local_store_must_be_an_sqlite_file(tmp_path: Path):
    (tmp_path / "notes.db").write_text("not a database\n")
    with pytest.raises(TrackingError, match="notes.db is not an SQLite database"):
        check_reachable(f"sqlite:///{tmp_path}/notes.db")
    (tmp_path / "folder.db").mkdir()
    with pytest.raises(TrackingError, match="is a folder"):
        check_reachable(f"sqlite:///{tmp_path}/folder.db")


def test_coevo_ui_links_open_the_classic_model_training_pages(tmp_path):
    from mlflow.tracking import MlflowClient

    from coevo.cli.run import model_training_links

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    cogr = client.create_experiment("cogr", artifact_location=(tmp_path / "mlruns").as_uri())
    client.create_experiment("someone-else", artifact_location=(tmp_path / "other").as_uri())
    links = dict(model_training_links(uri, "http://127.0.0.1:5000"))
    assert links == {
        "experiments": "http://127.0.0.1:5000/#/experiments?workflowType=machine_learning",
        "cogr runs": f"http://127.0.0.1:5000/#/experiments/{cogr}?workflowType=machine_learning",
        "model registry": "http://127.0.0.1:5000/#/models",
    }


def test_a_phase_metric_names_its_split_once():
    from coevo.orchestration.flow import phase_metric_names

    assert phase_metric_names({"eval/f1": 0.5, "eval/val/G1/ndcg_at_5": 0.25, "eval/val/overall/ndcg_at_5": 0.75,
                               "train/reward_mean": 0.1}) == {
        "val/f1": 0.5, "val/G1/ndcg_at_5": 0.25, "val/overall/ndcg_at_5": 0.75, "train/reward_mean": 0.1}


def test_the_cli_does_not_raise_ctrl_c_inside_a_logging_call_and_raises_it_after():
    import logging
    import signal

    from coevo.cli.common import _Interrupts

    interrupts = _Interrupts()
    interrupts.REPEAT_S = 600.0  # its repeater must not fire during the test
    try:
        with logging._lock:  # this thread inside a logging call
            interrupts.on_signal(signal.SIGINT, None)  # deferred: the repeater raises it again later
        with pytest.raises(KeyboardInterrupt):
            interrupts.on_signal(signal.SIGINT, None)
    finally:
        interrupts.handled = True


def test_a_run_ending_killed_stops_the_cli_repeating_the_interrupt(tmp_path, monkeypatch):
    """The CLI raises an unanswered Ctrl-C again every REPEAT_S; once a tracker acts on it (ending its run
    KILLED) it stops, so that no second KeyboardInterrupt cuts that clean-up short on a loaded machine."""
    import signal
    import threading
    import time

    import coevo.interrupts
    from coevo.cli.common import _Interrupts
    from coevo.orchestration.tracking import Tracker

    monkeypatch.setattr(coevo.interrupts, "_acted_on", threading.Event())  # this test's, not the process's
    interrupts = _Interrupts()
    interrupts.REPEAT_S = 0.2
    try:
        with pytest.raises(KeyboardInterrupt):
            with Tracker(uri=f"sqlite:///{tmp_path}/mlflow.db", artifact_root=str(tmp_path / "mlruns"),
                         experiment="cogr") as tracker:
                interrupts.on_signal(signal.SIGINT, None)  # Ctrl-C: raised here, the tracker ends the run
        time.sleep(1.0)  # five repeat periods: a repeat would raise KeyboardInterrupt in this thread now
        interrupts.repeater.join(timeout=5)
        assert not interrupts.repeater.is_alive()
    finally:
        interrupts.handled = True
    assert tracker.client.get_run(tracker.run_id).info.status == "KILLED"
