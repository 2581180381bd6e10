"""CoGR end to end on a toy set with the `tiny` generator: SFT + one full round, checkpoints,
indexes, keyword dynamics, and resume after a crash giving the same result."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

torch = pytest.importorskip("torch")

from coevo.config import load_params  # noqa: E402
from coevo.data.schema import Dataset  # noqa: E402
from coevo.methods import cogr as cogr_module  # noqa: E402
from coevo.methods.cogr import CoGRRun, ngram_histogram, phase_seed, top_n_keywords  # noqa: E402
from coevo.retrieval.inverted_index import InvertedIndex  # noqa: E402

TOOLS = {
    "weather": ("Weather Forecast", "Get the weather forecast, temperature and rain for a city."),
    "flights": ("Flight Search", "Search flights between airports and compare ticket prices."),
    "translate": ("Translator", "Translate text between languages such as french and german."),
    "currency": ("Currency Converter", "Convert money between currencies with exchange rates."),
    "recipes": ("Recipe Finder", "Find cooking recipes by ingredient and cuisine."),
}
TEMPLATES = ["I need {}", "help me with {}", "please find {}", "what about {}"]

# Small and fast: a few prompts per phase, short completions; no LoRA so `tiny` can move.
OVERRIDES = [
    "cogr.generator=tiny",
    "cogr.rounds=1",
    "cogr.lora.enabled=false",
    "cogr.sft.epochs=2",
    "cogr.sft.learning_rate=5e-3",
    "cogr.grpo.max_prompts_per_phase=4",
    "cogr.grpo.num_generations=2",
    "cogr.grpo.batch_size=4",
    "cogr.grpo.learning_rate=1e-3",
    "cogr.grpo.max_completion_length=8",
    "cogr.sampling.max_new_tokens=8",
    "cogr.n_query_keywords=4",
    "cogr.m_item_keywords=3",
]


@pytest.fixture(scope="module")
def toy_dataset(tmp_path_factory) -> Path:
    items = pd.DataFrame([{"item_id": k, "title": t, "text": d} for k, (t, d) in TOOLS.items()])
    queries, qrels = [], []
    for key, (title, _) in TOOLS.items():
        for j, template in enumerate(TEMPLATES):
            qid = f"{key}-{j}"
            queries.append({"query_id": qid, "text": template.format(title.lower()), "split": "val" if j == 3 else "train"})
            qrels.append({"query_id": qid, "item_id": key, "grade": 1})
    folder = tmp_path_factory.mktemp("toy") / "data"
    Dataset(items=items, queries=pd.DataFrame(queries), qrels=pd.DataFrame(qrels), name="toy").save(folder)
    return folder


def _params(params_file: Path, extra: list[str] = ()):
    return load_params(params_file, OVERRIDES + list(extra))


def _comparable(history: list[dict]) -> list[dict]:
    timing = ("seconds", "step_time", "tokens_per_s")  # wall-clock figures differ between runs
    return [{k: v for k, v in row.items() if not any(t in k for t in timing)} for row in history]


def test_top_n_is_frequency_then_first_seen():
    lists = [["b", "a", "c"], ["c", "d"], ["a", "c"]]
    assert top_n_keywords(lists, 2) == ["c", "a"]  # c:3; a and b... a:2 beats d:1
    assert top_n_keywords([["x", "y"], ["y", "x"]], 1) == ["x"]  # tie: first seen wins
    assert ngram_histogram({"i": ["a", "b c", "b c"], "j": ["d e f g h"]}) == {"1": 1, "2": 1, "3": 0, "4+": 1, "total": 3}
    assert phase_seed(1, 0) != phase_seed(1, 1) and phase_seed(1, 2) == phase_seed(1, 2)


@pytest.mark.slow
def test_sft_and_one_round_then_resume_after_crash(toy_dataset, params_file, tmp_path, monkeypatch):
    torch.set_num_threads(1)
    params = _params(params_file)

    # Uninterrupted run.
    full = CoGRRun(tmp_path / "full", params, toy_dataset, progress=False)
    history = full.run()
    assert [r["name"] for r in history] == ["00_sft", "01_query", "02_item"]
    for row in history:
        for key in ("eval/f1", "eval/recall@100", "eval/ndcg@10", "eval/precision", "eval/recall"):
            assert 0.0 <= row[key] <= 1.0
    assert history[0]["train/loss"] > 0
    for row in history[1:]:
        assert row["train/steps"] == 2 and row["train/reward_mean"] is not None and row["train/kl"] == 0.0
        assert -1.0 <= row["train/reward_mean"] <= 1.0 or row["kind"] == "item"

    # Algorithm 1 artifacts.
    seed = pd.read_parquet(tmp_path / "full" / "seed" / "items.parquet")
    assert sorted(seed["item_id"]) == sorted(TOOLS) and all(1 <= len(k) <= 3 for k in seed["keywords"])
    pooled = pd.read_parquet(tmp_path / "full" / "seed" / "queries.parquet")
    assert len(pooled) == 15 and all(1 <= len(k) <= 4 for k in pooled["keywords"])

    # Every phase folder: generators, both indexes, metrics, history, dynamics.
    for row in history:
        folder = full.phase_dir(row["phase"])
        for side in ("query", "item"):
            assert (folder / "generators" / side / "generator.json").exists()
            assert (folder / "generators" / side / "model" / "config.json").exists()  # full weights (no LoRA)
        items_index = InvertedIndex.load(folder / "indexes" / "items.jsonl")
        assert set(items_index.doc_ids) == set(TOOLS)
        assert len(InvertedIndex.load(folder / "indexes" / "queries.jsonl")) == 20
        stored = json.loads((folder / "history.json").read_text())
        assert len(stored["history"]) == row["phase"] + 1 and "stop" in stored["early_stopping"]
        dynamics = json.loads((folder / "dynamics.json").read_text())
        assert set(dynamics["items"]["distinct_by_ngram"]) == {"1", "2", "3", "4+", "total"}
        assert len(dynamics["examples"]["items"]) == 3 and len(dynamics["examples"]["queries"]) == 3
        assert (folder / "dynamics.csv").read_text().startswith("phase,name,side,ngram,distinct")
    # The query phase changed only the query generator: the item generator is the SFT one.
    sft_item = full.phase_dir(0) / "generators" / "item" / "model" / "model.safetensors"
    q_item = full.phase_dir(1) / "generators" / "item" / "model" / "model.safetensors"
    assert sft_item.read_bytes() == q_item.read_bytes()

    # Crashed run: an exception while training phase 2 (after phase 1 finished) ...
    original = cogr_module.CoGRRun._finish_phase

    def crash_in_phase_two(self, spec, *args, **kwargs):
        if spec.index == 2:
            raise RuntimeError("simulated crash")
        return original(self, spec, *args, **kwargs)

    monkeypatch.setattr(cogr_module.CoGRRun, "_finish_phase", crash_in_phase_two)
    crashed = CoGRRun(tmp_path / "crashed", params, toy_dataset, progress=False)
    with pytest.raises(RuntimeError, match="simulated crash"):
        crashed.run()
    assert [r["name"] for r in crashed.history()] == ["00_sft", "01_query"]
    assert not (tmp_path / "crashed" / "phases" / "02_item").exists()
    assert not [p for p in (tmp_path / "crashed" / "phases").iterdir() if p.name.startswith(".")]

    # ... resumes at phase 2 and ends exactly where the uninterrupted run ended.
    monkeypatch.setattr(cogr_module.CoGRRun, "_finish_phase", original)
    resumed = CoGRRun(tmp_path / "crashed", params, toy_dataset, progress=False).run()
    assert _comparable(resumed) == _comparable(history)
    final_full = json.loads((full.phase_dir(2) / "keywords.json").read_text())
    final_resumed = json.loads((tmp_path / "crashed" / "phases" / "02_item" / "keywords.json").read_text())
    assert final_full == final_resumed
    weights = "generators/item/model/model.safetensors"
    assert (full.phase_dir(2) / weights).read_bytes() == (tmp_path / "crashed" / "phases" / "02_item" / weights).read_bytes()

    # A finished run is not recomputed; other params in the same folder are refused.
    again = CoGRRun(tmp_path / "full", params, toy_dataset, progress=False)
    assert _comparable(again.run()) == _comparable(history)
    with pytest.raises(ValueError, match="started with other params"):
        CoGRRun(tmp_path / "full", _params(params_file, ["cogr.rounds=2"]), toy_dataset, progress=False)


@pytest.mark.slow
def test_ablation_switches(toy_dataset, params_file, tmp_path):
    torch.set_num_threads(1)
    params = _params(
        params_file,
        ["cogr.query_side_only=true", "cogr.shared_generator=true", "cogr.sft_init=false", "cogr.item_reward=global",
         "cogr.rounds=2", "cogr.early_stopping.patience=1", "cogr.early_stopping.min_delta=0.5",
         "cogr.max_train_queries=6"],
    )
    run = CoGRRun(tmp_path / "ablation", params, toy_dataset, progress=False)
    assert [s.kind for s in run.schedule()] == ["base", "query", "query"]
    assert len(run.train_query_ids) == 6 and set(run.train_qrels) == set(run.train_query_ids)
    history = run.run()
    # min_delta 0.5 cannot be met on this toy: patience 1 stops after the first GRPO phase.
    assert [r["name"] for r in history] == ["00_base", "01_query"]
    assert not (tmp_path / "ablation" / "seed").exists()  # no Algorithm 1 without SFT init
    assert (run.phase_dir(1) / "generators" / "shared" / "generator.json").exists()
    assert json.loads((run.phase_dir(1) / "history.json").read_text())["early_stopping"]["stop"] is True
    assert len(InvertedIndex.load(run.phase_dir(1) / "indexes" / "queries.jsonl")) == 6 + 5  # capped train + val


def test_seed_keywords_sample_g0_at_seed_temperature(toy_dataset, params_file, tmp_path, monkeypatch):
    """Algorithm 1 samples G_0 at cogr.seed_temperature, not the GRPO rollout temperature."""
    from coevo.models.generator import Generator

    torch.set_num_threads(1)
    params = _params(params_file, ["cogr.seed_temperature=0.3", "cogr.sampling.temperature=1.0"])
    temperatures: list[float] = []
    real_generate = Generator.generate

    def spy(self, prompts, **kwargs):
        temperatures.append(kwargs["temperature"])
        return real_generate(self, prompts, **kwargs)

    monkeypatch.setattr(Generator, "generate", spy)
    summary = CoGRRun(tmp_path / "seed_temp", params, toy_dataset, progress=False).seed_keywords()
    assert temperatures == [0.3]
    assert summary["items"] == len(TOOLS)
