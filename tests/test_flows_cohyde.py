"""The CoHyDE flow end to end: tiny rewriter, offline MiniLM encoder, one round on a toy set."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from conftest import SAMPLE_DIR, make_project, task_states

pytestmark = pytest.mark.slow


@pytest.fixture
def project(tmp_path_factory, prefect_server, chdir):
    root = make_project(tmp_path_factory.mktemp("cohyde_project"))
    # CoHyDE's home ground: StableToolBench (groups G1-G3), the first 4 queries of each group.
    files = sorted((SAMPLE_DIR / "stabletoolbench").rglob("test_instruction/*.json"))
    assert files, "the committed StableToolBench sample is missing"
    (root / "stb").mkdir()
    for path in files:
        (root / "stb" / path.name).write_text(json.dumps(json.loads(path.read_text())[:4]))
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["data"].update(dataset="stb_toy", loader="stabletoolbench", source="stb", val_fraction=0.25,
                          test_fraction=0.25)
    cohyde = params["cohyde"]
    # A random tiny rewriter writes text only after a real warm-up: full fine-tuning at a high
    # learning rate (the settings of the library's own tiny end-to-end test).
    cohyde.update(generator="tiny", rounds=1, max_new_tokens=16, max_train_queries=16)
    cohyde["lora"]["enabled"] = False
    cohyde["encoder_training"].update(batch_size=8)
    cohyde["warmup"].update(learning_rate=3e-3, epochs=2, batch_size=16)
    cohyde["dpo"].update(learning_rate=1e-3)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    chdir(root)
    return root


def test_cohyde_flow_logs_per_round_metrics_per_group_and_caches(project: Path):
    from flows.cohyde import cohyde_flow
    from mlflow.tracking import MlflowClient

    summary = cohyde_flow(params_path="params.yaml")
    labels = [r["label"] for r in summary["rows"] if r["kind"] != "baseline"]
    assert labels[:4] == ["raw encoder (val)", "S1a encoder (val)", "vanilla HyDE (val)", "round 1 (val)"]
    assert labels[4:7] == ["raw (test)", "s1a (test)", "hyde (test)"]
    client = MlflowClient(summary["mlflow"]["tracking_uri"])
    run_id = summary["mlflow"]["run_id"]
    assert sorted(m.step for m in client.get_metric_history(run_id, "val/ndcg_at_5")) == [0, 1, 2, 3]
    group_metrics = [k for k in client.get_run(run_id).data.metrics if k.endswith("/ndcg_at_5") and k.count("/") == 2]
    assert group_metrics, "per-group metrics are missing"
    assert [m.step for m in client.get_metric_history(run_id, "train/pairs")] == [3]
    metrics = json.loads(Path("reports/cohyde/metrics.json").read_text())
    assert "round_1" in metrics["val"]["overall"] and metrics["best_phase"] in ("hyde", "round_1")
    assert {"raw", "s1a", "hyde"} <= set(metrics["test"]) and set(metrics["baselines"]["bm25"]) == {"val", "test"}

    again = cohyde_flow(params_path="params.yaml")
    assert again["steps"]["executed"] == 0
    states = task_states(again["flow_run_id"])
    assert states and all(state == "Cached" for (_, state) in states), states
