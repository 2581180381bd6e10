"""GRAPE end to end: the `tiny` rewriter trains a few GRPO steps against a frozen retriever
(MiniLM over tool descriptions; tiny random CLIP over Flickr8k-CN images)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from coevo.config import load_params
from coevo.data.schema import Dataset
from coevo.methods.grape import GrapeRun, monitor_shows_inflation, rewrite_messages
from tests.conftest import shared_data

pytestmark = pytest.mark.slow

TOOLS = {
    "WeatherTool": "current weather, forecasts, temperature and rain for any city",
    "StockTool": "stock prices, market quotes and company financials",
    "RecipeTool": "cooking recipes, ingredients and meal ideas",
    "FlightTool": "search and book cheap flights between airports",
    "MusicTool": "find songs, albums and artists, create playlists",
    "NewsTool": "latest news headlines and articles by topic",
}
QUERIES = [
    ("will it rain in paris tomorrow", "WeatherTool"), ("how hot is it in cairo", "WeatherTool"),
    ("apple share price today", "StockTool"), ("is tesla stock up", "StockTool"),
    ("how do i bake bread", "RecipeTool"), ("dinner ideas with chicken", "RecipeTool"),
    ("flights from london to rome", "FlightTool"), ("cheapest ticket to tokyo", "FlightTool"),
    ("play some jazz", "MusicTool"), ("new album by adele", "MusicTool"),
    ("what happened in the world today", "NewsTool"), ("sports headlines", "NewsTool"),
]


def _tool_dataset(tmp_path):
    items = pd.DataFrame({"item_id": list(TOOLS), "title": list(TOOLS), "text": list(TOOLS.values())})
    splits = ["train", "train", "train", "val", "test", "train"] * 2
    queries = pd.DataFrame({"query_id": [f"q{i}" for i in range(len(QUERIES))],
                            "text": [q for q, _ in QUERIES], "split": splits})
    qrels = pd.DataFrame({"query_id": queries["query_id"], "item_id": [t for _, t in QUERIES], "grade": 1})
    return Dataset(items, queries, qrels, name="tools").save(tmp_path / "tools")


def _params(params_file, **overrides):
    sets = {"grape.generator": "tiny", "grape.grpo.steps": 4, "grape.eval_every": 2,
            "grape.grpo.batch_size": 4, "grape.grpo.num_generations": 2,
            "grape.grpo.max_completion_length": 8, "grape.sampling.max_new_tokens": 8,
            "grape.grpo.learning_rate": 1e-3, "grape.lora.target_modules": "[q_proj, v_proj]", **overrides}
    return load_params(params_file, [f"{k}={v}" for k, v in sets.items()])


def _check_run(run: GrapeRun, table: dict, train_steps: int) -> None:
    assert set(table) == {"raw", "untrained", "trained"}
    for stage in table.values():
        for split_metrics in stage.values():
            for key in ("recall@1", "recall@5", "recall@10", "mrr@10", "mrr", "mean_relevant_similarity"):
                assert 0.0 <= split_metrics[key] <= 1.0 or key == "mean_relevant_similarity"
            assert -1.0 <= split_metrics["mean_relevant_similarity"] <= 1.0
            assert -1.0 <= split_metrics["mean_rank_reward"] <= 1.0
    summary = json.loads((run.run_dir / "train" / "summary.json").read_text())
    assert summary["steps"] == train_steps
    for key in ("reward_first", "reward_last", "reward_mean"):
        assert -1.0 <= summary[key] <= 1.0
    history = run.history()
    # untrained (0), the monitor at step 2, trained (4): both monitor series recorded each time
    assert [row["step"] for row in history] == [0, 2, 4]
    assert all(not math.isnan(row["recall@1"]) and -1 <= row["mean_relevant_similarity"] <= 1 for row in history)
    assert isinstance(monitor_shows_inflation(history), bool)
    metrics = json.loads((run.run_dir / "metrics.json").read_text())
    assert metrics["monitor"] == history and metrics["stages"] == table


def test_grape_tiny_rewriter_trains_against_minilm(tmp_path, params_file):
    params = _params(params_file)
    run = GrapeRun(tmp_path / "run", params, _tool_dataset(tmp_path))
    table = run.run()
    _check_run(run, table, 4)
    # the raw query stage is the frozen MiniLM itself: on these easy queries it ranks well
    assert table["raw"]["val"]["recall@10"] == 1.0
    assert (run.run_dir / "index" / "manifest.json").exists()
    # a finished run recomputes nothing
    before = {p: p.stat().st_mtime_ns for p in (run.run_dir / "eval").glob("*.json")}
    assert GrapeRun(tmp_path / "run", params, run.dataset_dir).run() == table
    assert before == {p: p.stat().st_mtime_ns for p in (run.run_dir / "eval").glob("*.json")}


def test_grape_similarity_ablation_with_reasoning(tmp_path, params_file):
    params = _params(params_file, **{"grape.reward": "similarity", "grape.reasoning": "true",
                                     "grape.max_reasoning_tokens": 4})
    run = GrapeRun(tmp_path / "run", params, _tool_dataset(tmp_path))
    table = run.run()
    _check_run(run, table, 4)
    assert "Rewrite:" in rewrite_messages("q", reasoning=True)[1]["content"]
    # the random tiny model never writes the "Rewrite:" marker: every rewrite is malformed
    assert table["untrained"]["val"]["malformed_fraction"] == 1.0


def test_grape_tiny_rewriter_trains_against_tiny_clip(tmp_path, params_file):
    from coevo.data.loaders import load_source

    full = load_source("image_captions", shared_data("flickr8k_cn_1k"), lang="zh")
    # 12 images per split, one Chinese caption each: enough for the wiring, fast on CPU
    keep = set(full.items.groupby("split").head(12)["item_id"])
    queries = full.queries[full.queries["query_id"].str.endswith("#zh#0")]
    qrels = full.qrels[full.qrels["item_id"].isin(keep) & full.qrels["query_id"].isin(set(queries["query_id"]))]
    queries = queries[queries["query_id"].isin(set(qrels["query_id"]))]
    data = Dataset(full.items[full.items["item_id"].isin(keep)], queries, qrels, name="flickr_zh_small")
    data_dir = data.save(tmp_path / "flickr")
    params = _params(params_file, **{"grape.retriever": "clip", "grape.clip_model": "coevo-tiny-clip"})
    run = GrapeRun(tmp_path / "run", params, data_dir)
    table = run.run()
    _check_run(run, table, 4)
    manifest = json.loads((run.run_dir / "index" / "manifest.json").read_text())
    assert manifest["n_items"] == 36 and manifest["dim"] == 32 and manifest["encoder"].startswith("clip:")
