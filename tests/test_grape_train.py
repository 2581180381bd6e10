"""GRAPE end to end: the `tiny` rewriter trains a few GRPO steps against a frozen retriever
(MiniLM over tool descriptions; tiny random CLIP over Flickr8k-CN images). Training and the
monitor read the val split only; the test split is read once, by the final evaluation."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from coevo.config import load_params
from coevo.data.schema import Dataset
from coevo.methods.grape import Grape, monitor_shows_inflation, rewrite_messages
from tests.conftest import REPO_ROOT, shared_data
from tests.test_cogr_train import splits_read  # one copy of the split spy

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
SPLITS = ["train", "train", "train", "val", "test", "train"] * 2
STAGES = ["raw", "untrained", "trained"]
STEPS = 4


def _tool_dataset(tmp_path: Path, *, val_relevant: bool = True) -> Path:
    items = pd.DataFrame({"item_id": list(TOOLS), "title": list(TOOLS), "text": list(TOOLS.values())})
    queries = pd.DataFrame({"query_id": [f"q{i}" for i in range(len(QUERIES))],
                            "text": [q for q, _ in QUERIES], "split": SPLITS})
    qrels = pd.DataFrame({"query_id": queries["query_id"], "item_id": [t for _, t in QUERIES], "grade": 1})
    if not val_relevant:
        qrels = qrels[queries["split"] != "val"]
    return Dataset(items, queries, qrels, name="tools").save(tmp_path / "tools")


def _params(**overrides):
    sets = {"grape.generator": "tiny", "grape.grpo.steps": STEPS, "grape.eval_every": 2,
            "grape.grpo.batch_size": 4, "grape.grpo.num_generations": 2,
            "grape.grpo.max_completion_length": 8, "grape.sampling.max_new_tokens": 8,
            "grape.grpo.learning_rate": 1e-3, "grape.lora.target_modules": "[q_proj, v_proj]", **overrides}
    return load_params(REPO_ROOT / "params.yaml", [f"{k}={v}" for k, v in sets.items()])


def _adapter_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(folder / "adapter" / "adapter_model.safetensors")


def _check_run(run: Grape, rows: list[dict], n_val: int, moved: bool = True) -> dict:
    """The val table, the monitor curve, the training summary and the trained weights (``moved``:
    GRPO changed the adapter; False where every reward was the same, so every advantage was 0)."""
    assert [r["name"] for r in rows] == STAGES
    assert [p.name for p in run.phases()] == ["index", "raw", "untrained", "train", "trained"]
    assert all(run.is_done(p.name) for p in run.phases())
    table = run.table()
    assert list(table) == STAGES
    for stage, metrics in table.items():
        assert metrics["n_queries"] == n_val
        for key in ("recall@1", "recall@5", "recall@10", "mrr@10", "mrr", "malformed_fraction"):
            assert 0.0 <= metrics[key] <= 1.0, (stage, key)
        assert metrics["recall@1"] <= metrics["recall@5"] <= metrics["recall@10"]
        assert -1.0 <= metrics["mean_relevant_similarity"] <= 1.0
        assert -1.0 <= metrics["mean_rank_reward"] <= 1.0
        # the stamp's record is the stored val evaluation
        assert run.result(stage)["eval"] == metrics
    assert table["raw"]["malformed_fraction"] == 0.0  # the raw query is searched as typed
    summary = run.result("train")
    assert summary["steps"] == STEPS
    for key in ("reward_first", "reward_last", "reward_mean"):
        assert -1.0 <= summary[key] <= 1.0
    history = run.history()
    # untrained (step 0), the monitor at step 2, trained (the last step): both series each time
    assert [(row["step"], row["stage"]) for row in history] == [(0, "untrained"), (2, "step_2"), (STEPS, "trained")]
    assert all(row["split"] == "val" for row in history)
    assert history[0]["recall@1"] == table["untrained"]["recall@1"]
    assert history[-1]["recall@1"] == table["trained"]["recall@1"]
    assert all(not math.isnan(row["recall@1"]) and -1 <= row["mean_relevant_similarity"] <= 1 for row in history)
    first, last = history[0], history[-1]
    assert monitor_shows_inflation(history) == (
        last["mean_relevant_similarity"] > first["mean_relevant_similarity"] and last["recall@1"] <= first["recall@1"])
    # the trained rewriter is saved apart from the base one; GRPO moved it unless no reward varied
    base, trained = _adapter_weights(run.base_generator_dir), _adapter_weights(run.generator_dir)
    assert base.keys() == trained.keys() and base
    assert any(not torch.equal(base[k], trained[k]) for k in base) is moved
    return table


def test_grape_tiny_rewriter_trains_against_minilm(tmp_path):
    data = _tool_dataset(tmp_path)
    params = _params()
    with splits_read() as asked:
        run = Grape(tmp_path / "run", params, data)
        rows = run.run()
    table = _check_run(run, rows, n_val=SPLITS.count("val"))
    # training and the monitor never read the test split
    assert "test" not in asked and "val" in asked
    # the raw query stage is the frozen MiniLM itself: on these easy queries it ranks well
    assert table["raw"]["recall@10"] == 1.0
    assert (run.run_dir / "index" / "manifest.json").exists()
    assert run.best_phase() == "trained"

    # a finished run recomputes nothing
    before = {p: p.stat().st_mtime_ns for p in run.run_dir.rglob("*") if p.is_file()}
    assert Grape(tmp_path / "run", params, data).run() == rows
    assert before == {p: p.stat().st_mtime_ns for p in run.run_dir.rglob("*") if p.is_file()}

    # the final evaluation reads the test split, once, for every stage
    with splits_read() as asked:
        final = run.final_evaluation("test")
    assert "test" in asked
    assert final["split"] == "test" and final["best_phase"] == "trained"
    assert [r["label"] for r in final["rows"]] == STAGES
    for row in final["rows"]:
        assert row["split"] == "test" and row["n_queries"] == SPLITS.count("test")
        assert 0.0 <= row["recall@1"] <= row["recall@10"] <= 1.0
    assert not (run.run_dir / "eval" / "test.json").exists()
    assert before == {p: p.stat().st_mtime_ns for p in run.run_dir.rglob("*") if p.is_file()}

    # reports: val table, the final split's rows, the monitor curve
    reports = tmp_path / "reports"
    reports.mkdir()
    files = run.write_reports(tmp_path / "metrics.json", tmp_path / "monitor.csv", reports, final, {})
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["val"] == table and set(metrics["test"]) == set(STAGES)
    assert metrics["test"]["trained"]["n_queries"] == SPLITS.count("test")
    assert str(reports / "monitor.png") in files
    assert len(pd.read_csv(tmp_path / "monitor.csv")) == 3


def test_grape_similarity_ablation_with_reasoning(tmp_path):
    params = _params(**{"grape.reward": "similarity", "grape.reasoning": "true", "grape.max_reasoning_tokens": 4})
    run = Grape(tmp_path / "run", params, _tool_dataset(tmp_path))
    # the random tiny model never writes the "Rewrite:" marker: every rewrite is malformed, every
    # completion gets the floor reward, every GRPO advantage is 0 and the adapter stays as it was
    table = _check_run(run, run.run(), n_val=SPLITS.count("val"), moved=False)
    assert "Rewrite:" in rewrite_messages("q", reasoning=True)[1]["content"]
    assert json.loads((run.run_dir / "eval" / "trained.json").read_text())["reward"] == "similarity"
    assert table["untrained"]["malformed_fraction"] == 1.0 and table["trained"]["malformed_fraction"] == 1.0
    summary = run.result("train")
    assert summary["reward_mean"] == -1.0 and summary["frac_reward_zero_std"] == 1.0


def test_grape_expand_mode_searches_the_query_followed_by_the_rewrite(tmp_path):
    data = _tool_dataset(tmp_path)
    run = Grape(tmp_path / "run", _params(**{"grape.query_mode": "expand"}), data)
    rows = run.run()
    # the adapter moves if and only if some group's rewards differed (on these easy queries the
    # query alone ranks its tool first, so most groups tie)
    table = _check_run(run, rows, n_val=SPLITS.count("val"), moved=run.result("train")["frac_reward_zero_std"] < 1.0)
    assert "Answer with the added words only" in rewrite_messages("q", query_mode="expand")[1]["content"]
    for stage in ("untrained", "trained"):
        for ex in json.loads((run.run_dir / "eval" / f"{stage}.json").read_text())["splits"]["val"]["examples"]:
            assert ex["searched"] == (f"{ex['query']} {ex['rewrite']}" if ex["rewrite"] else ex["query"])
    # the query is always searched: MiniLM finds these easy queries' tools whatever the random model appends
    assert table["raw"]["recall@10"] == table["untrained"]["recall@10"] == 1.0
    # the mode is part of the rewriter's key: switching back to replace re-runs from the untrained phase
    replace = Grape(tmp_path / "run", _params(), data)
    assert replace.is_done("raw") and not replace.is_done("untrained")
    # mix mode asks for added words as expand does, is its own key, and searches the query too
    assert rewrite_messages("q", query_mode="mix") == rewrite_messages("q", query_mode="expand")
    mix = Grape(tmp_path / "run", _params(**{"grape.query_mode": "mix"}), data)
    assert mix.is_done("raw") and not mix.is_done("untrained")
    assert mix.run_phase("untrained")["eval"]["recall@10"] == 1.0


def test_grape_tiny_rewriter_trains_against_tiny_clip(tmp_path):
    from coevo.data.loaders import load_source

    full = load_source("image_captions", shared_data("flickr8k_cn_1k"), lang="zh")
    # 12 images per split, one Chinese caption each: enough for the wiring, fast on CPU
    keep = set(full.items.groupby("split").head(12)["item_id"])
    queries = full.queries[full.queries["query_id"].str.endswith("#zh#0")]
    qrels = full.qrels[full.qrels["item_id"].isin(keep) & full.qrels["query_id"].isin(set(queries["query_id"]))]
    queries = queries[queries["query_id"].isin(set(qrels["query_id"]))]
    data = Dataset(full.items[full.items["item_id"].isin(keep)], queries, qrels, name="flickr_zh_small")
    data_dir = data.save(tmp_path / "flickr")
    params = _params(**{"grape.retriever": "clip", "grape.clip_model": "coevo-tiny-clip"})
    run = Grape(tmp_path / "run", params, data_dir)
    _check_run(run, run.run(), n_val=int((queries["split"] == "val").sum()))
    manifest = json.loads((run.run_dir / "index" / "manifest.json").read_text())
    assert manifest["n_items"] == 36 and manifest["dim"] == 32 and manifest["encoder"].startswith("clip:")


def test_no_val_query_with_a_relevant_item_fails_before_any_work(tmp_path):
    run = Grape(tmp_path / "run", _params(), _tool_dataset(tmp_path, val_relevant=False))
    with pytest.raises(ValueError, match="no val query has a relevant item") as error:
        run.run()
    assert "val split" in str(error.value)
    done = [p.name for p in run.phases() if run.is_done(p.name)]
    assert done == [], f"phases {done} ran before the val check (every check runs before any work)"


def test_grape_sft_warm_start_trains_before_grpo_and_val_chooses_the_final_phase(tmp_path):
    from coevo.models.generator import SFT_TARGET_SLACK, cut_to_tokens

    data = _tool_dataset(tmp_path)
    params = _params(**{"grape.sft_warmup": "true", "grape.sft.batch_size": 2})
    run = Grape(tmp_path / "run", params, data)
    assert [p.name for p in run.phases()] == ["index", "raw", "untrained", "sft", "train", "trained"]
    rows = run.run()
    assert [r["name"] for r in rows] == ["raw", "untrained", "sft", "trained"]
    # one row per training query: its prompt, then its tool as the index embeds it, cut to the budget
    generator = run.base_generator()
    examples = run.sft_examples(generator.tokenizer)
    train = [(q, t) for (q, t), s in zip(QUERIES, SPLITS) if s == "train"]
    assert len(examples) == len(train) == run.result("sft")["examples"]
    budget = 8 - SFT_TARGET_SLACK
    for example, (query, tool) in zip(examples, train):
        assert query in example["prompt"][-1]["content"]
        target = example["completion"][0]["content"]
        assert target and f"{tool}: {TOOLS[tool]}".startswith(target)
        assert len(generator.tokenizer(target, add_special_tokens=False)["input_ids"]) <= budget
    assert cut_to_tokens("short", generator.tokenizer, 100) == "short"
    # the warm start is saved apart from the base rewriter and moved its adapter; GRPO starts from it
    base, warm = _adapter_weights(run.base_generator_dir), _adapter_weights(run.sft_generator_dir)
    assert any(not torch.equal(base[k], warm[k]) for k in base)
    assert run.result("sft")["sft"]["train/steps"] >= 1 and "recall@10" in run.result("sft")["eval"]
    assert list(run.table()) == ["raw", "untrained", "sft", "trained"]
    # val chooses between the warm start and GRPO; the final table reads test for every stage
    val = {s: run.table()[s]["recall@10"] for s in ("sft", "trained")}
    chosen = "sft" if val["sft"] > val["trained"] else "trained"
    final = run.final_evaluation("test")
    assert final["best_phase"] == chosen and [r["label"] for r in final["rows"]] == ["raw", "untrained", "sft", "trained"]
    # the warm start's knobs re-run it and what follows, not the untrained phase
    more = Grape(tmp_path / "run", _params(**{"grape.sft_warmup": "true", "grape.sft.batch_size": 2,
                                              "grape.sft.epochs": 2}), data)
    assert more.is_done("untrained") and not more.is_done("sft") and not more.is_done("train")


def test_grape_sft_warm_start_needs_item_texts():
    with pytest.raises(ValueError, match="grape.sft_warmup needs grape.retriever = text and grape.reasoning = false"):
        _params(**{"grape.sft_warmup": "true", "grape.reasoning": "true"})
