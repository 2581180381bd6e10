"""CoGR end to end on a toy set with the `tiny` generator: SFT + one full round, checkpoints,
indexes, keyword dynamics, resume after a crash giving the same result, what a changed knob
re-runs, and the test split read only by the final evaluation."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest
import torch

from coevo.config import load_params
from coevo.data.schema import Dataset
from coevo.methods import cogr as cogr_module
from coevo.methods.cogr import CoGR, ngram_histogram, phase_seed, top_n_keywords
from coevo.retrieval.inverted_index import InvertedIndex
from tests.conftest import REPO_ROOT

TOOLS = {
    "weather": ("Weather Forecast", "Get the weather forecast, temperature and rain for a city."),
    "flights": ("Flight Search", "Search flights between airports and compare ticket prices."),
    "translate": ("Translator", "Translate text between languages such as french and german."),
    "currency": ("Currency Converter", "Convert money between currencies with exchange rates."),
    "recipes": ("Recipe Finder", "Find cooking recipes by ingredient and cuisine."),
}
# Per tool: three train queries, one val, one test.
TEMPLATES = ["I need {}", "help me with {}", "please find {}", "what about {}", "show me {}"]
SPLIT_OF = {3: "val", 4: "test"}
N_TRAIN, N_VAL, N_TEST = 15, 5, 5

# Small and fast: a few prompts per phase, short completions; no LoRA so `tiny` can move.
OVERRIDES = [
    "cogr.generator=tiny",
    "cogr.max_empty_share=1.0",  # the untrained tiny model writes few keywords
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
PHASES = ["seed", "00_sft", "01_query", "02_item"]
# wall-clock figures differ between runs
TIMING = ("seconds", "step_time", "tokens_per_s", "peak_gpu_mb", "rollouts_per_min", "generation_share")


def _toy(folder: Path, *, val_relevant: bool = True) -> Path:
    items = pd.DataFrame([{"item_id": k, "title": t, "text": d} for k, (t, d) in TOOLS.items()])
    queries, qrels = [], []
    for key, (title, _) in TOOLS.items():
        for j, template in enumerate(TEMPLATES):
            qid = f"{key}-{j}"
            split = SPLIT_OF.get(j, "train")
            queries.append({"query_id": qid, "text": template.format(title.lower()), "split": split})
            if split != "val" or val_relevant:
                qrels.append({"query_id": qid, "item_id": key, "grade": 1})
    return Dataset(items=items, queries=pd.DataFrame(queries), qrels=pd.DataFrame(qrels), name="toy").save(folder)


@pytest.fixture(scope="module")
def toy_dataset(tmp_path_factory) -> Path:
    return _toy(tmp_path_factory.mktemp("toy") / "data")


def _params(extra: list[str] = ()):
    return load_params(REPO_ROOT / "params.yaml", OVERRIDES + list(extra))


def _comparable(value):
    """A record without its wall-clock figures (nested dicts and lists walked)."""
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items() if not any(t in k for t in TIMING)}
    if isinstance(value, list):
        return [_comparable(v) for v in value]
    return value


@contextmanager
def splits_read() -> Iterator[list[str]]:
    """Record every split the data set is asked for (qrels or queries of a split)."""
    asked: list[str] = []
    relevant, queries_in = Dataset.relevant, Dataset.queries_in

    def spy_relevant(self, split=None, *args, **kwargs):
        asked.append(split)
        return relevant(self, split, *args, **kwargs)

    def spy_queries_in(self, split):
        asked.append(split)
        return queries_in(self, split)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Dataset, "relevant", spy_relevant)
        mp.setattr(Dataset, "queries_in", spy_queries_in)
        yield asked


def _mtimes(folder: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


def _stamp(run_dir: Path, name: str) -> dict:
    return json.loads((run_dir / "stamps" / f"{name}.json").read_text())


@contextmanager
def reward_calls() -> Iterator[list[dict]]:
    """Record every GRPO reward call: side, completions, the truncation flags it got, the rewards."""
    from coevo.rewards.cogr import ItemReward, QueryReward

    calls: list[dict] = []

    def spy(cls, side):
        original = cls.__call__

        def call(self, ids, completions, truncated=None):
            out = original(self, ids, completions, truncated=truncated)
            calls.append({"side": side, "ids": list(ids), "completions": list(completions), "truncated": truncated,
                          "rewards": out})
            return out

        return call

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(QueryReward, "__call__", spy(QueryReward, "query"))
        mp.setattr(ItemReward, "__call__", spy(ItemReward, "item"))
        yield calls


@pytest.fixture(scope="module")
def full_run(toy_dataset, tmp_path_factory):
    """One uninterrupted run (seed, SFT, a query and an item GRPO phase), with the splits it read
    and the GRPO reward calls (``run.reward_calls``)."""
    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("cogr") / "full"
    with splits_read() as asked, reward_calls() as calls:
        run = CoGR(folder, _params(), toy_dataset, progress=False)
        rows = run.run()
    run.reward_calls = calls
    return run, rows, list(asked)


def test_top_n_is_frequency_then_first_seen():
    lists = [["b", "a", "c"], ["c", "d"], ["a", "c"]]
    assert top_n_keywords(lists, 2) == ["c", "a"]  # c:3; a and b... a:2 beats d:1
    assert top_n_keywords([["x", "y"], ["y", "x"]], 1) == ["x"]  # tie: first seen wins
    assert ngram_histogram({"i": ["a", "b c", "b c"], "j": ["d e f g h"]}) == {"1": 1, "2": 1, "3": 0, "4+": 1, "total": 3}
    assert phase_seed(1, 0) != phase_seed(1, 1) and phase_seed(1, 2) == phase_seed(1, 2)


@pytest.mark.slow
def test_sft_and_one_round(full_run):
    run, rows, asked = full_run
    assert [p.name for p in run.phases()] == PHASES
    assert all(run.is_done(name) for name in PHASES)
    assert [r["name"] for r in rows] == ["00_sft", "01_query", "02_item"]
    for row in rows:
        for key in ("f1", "recall@100", "ndcg@10", "precision", "recall"):
            assert 0.0 <= row["eval"][key] <= 1.0
        kw = row["keywords"]
        assert 0.0 <= kw["item_mean"] <= run.cfg.k_max and 0.0 <= kw["query_mean"] <= run.cfg.k_max
        assert 0 <= kw["item_empty"] <= len(TOOLS) and 0 <= kw["query_empty"] <= N_VAL
    assert rows[0]["train"]["loss"] > 0
    for row in rows[1:]:
        train = row["train"]
        assert train["steps"] == 2 and train["prompts"] == 4 and train["kl"] == 0.0
        if row["kind"] == "query":
            # query reward: F1 of the retrieved items in [0, 1], -1 for an invalid keyword set
            assert -1.0 <= train["reward_mean"] <= 1.0
        else:
            # item reward (marginal): a sum of per-query F1 changes over the train queries of the
            # query index, each in [-1, 1]; -1 for an invalid set
            assert row["kind"] == "item"
            assert -N_TRAIN <= train["reward_mean"] <= N_TRAIN
    # Monitoring and selection use val; training never asked for the test split.
    assert "test" not in asked and "val" in asked
    assert run.best_phase() in {"00_sft", "01_query", "02_item"}

    # Algorithm 1 artifacts.
    folder = run.run_dir
    seed = pd.read_parquet(folder / "seed" / "items.parquet")
    assert sorted(seed["item_id"]) == sorted(TOOLS) and all(1 <= len(k) <= 3 for k in seed["keywords"])
    pooled = pd.read_parquet(folder / "seed" / "queries.parquet")
    assert len(pooled) == N_TRAIN and all(1 <= len(k) <= 4 for k in pooled["keywords"])

    # Every phase folder: generators, both indexes, metrics, dynamics; its record is the stamp's.
    for row in rows:
        phase_dir = run.phase_dir(row["phase"])
        for side in ("query", "item"):
            assert (phase_dir / "generators" / side / "generator.json").exists()
            assert (phase_dir / "generators" / side / "model" / "config.json").exists()  # full weights (no LoRA)
        items_index = InvertedIndex.load(phase_dir / "indexes" / "items.jsonl")
        assert set(items_index.doc_ids) == set(TOOLS)
        # train + val queries; test queries are never indexed during training
        queries_index = InvertedIndex.load(phase_dir / "indexes" / "queries.jsonl")
        assert len(queries_index) == N_TRAIN + N_VAL
        assert not [q for q in queries_index.doc_ids if q.endswith("-4")]
        assert json.loads((phase_dir / "metrics.json").read_text()) == run.result(row["name"])
        dynamics = json.loads((phase_dir / "dynamics.json").read_text())
        assert set(dynamics["items"]["distinct_by_ngram"]) == {"1", "2", "3", "4+", "total"}
        assert len(dynamics["examples"]["items"]) == 3 and len(dynamics["examples"]["queries"]) == 3
        assert (phase_dir / "dynamics.csv").read_text().startswith("phase,name,side,ngram,distinct")
    # The query phase changed only the query generator: the item generator is the SFT one.
    sft_item = run.phase_dir(0) / "generators" / "item" / "model" / "model.safetensors"
    q_item = run.phase_dir(1) / "generators" / "item" / "model" / "model.safetensors"
    assert sft_item.read_bytes() == q_item.read_bytes()
    state = run.early_stop()
    assert state is not None and state.metric == "f1" and len(run._monitored_records()) == 3


@pytest.mark.slow
def test_grpo_rewards_get_truncation_from_trl_token_ids(full_run):
    """Issue 11 (K_max): every GRPO reward call gets one truncation flag per completion, read
    from TRL's completion token ids (not guessed from the text), and a cut completion gets -1,
    never a parsed partial list. The toy budget (8 tokens) cuts most completions."""
    run, rows, _ = full_run
    calls = run.reward_calls
    assert {c["side"] for c in calls} == {"query", "item"}
    for call in calls:
        flags = call["truncated"]
        assert flags is not None and len(flags) == len(call["completions"]) == len(call["rewards"])
        assert all(r == -1.0 for r, cut in zip(call["rewards"], flags) if cut)
    assert any(any(c["truncated"]) for c in calls)
    for row in rows[1:]:
        assert row["train"]["kmax_budget_tokens"] > run.cfg.grpo.max_completion_length  # the toy budget is short


def test_truncation_flags_follow_trl_rule():
    """Cut = the last sampled token is neither an end of sequence nor padding (TRL's rule)."""
    from types import SimpleNamespace

    tokenizer = SimpleNamespace(eos_token_id=2, pad_token_id=0)
    generator = SimpleNamespace(tokenizer=tokenizer, model=SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[2, 7])))
    flags = cogr_module.truncation_flags(generator, max_tokens=4)
    assert flags([[5, 6, 2], [5, 6, 7], [5, 6, 8, 9], [0], []], ["", "", "", "", ""]) == [False, False, True, False, False]


@pytest.mark.slow
def test_final_evaluation_reads_the_test_split_once(full_run):
    run, rows, _ = full_run
    with splits_read() as asked:
        final = run.final_evaluation("test")
    assert "test" in asked
    best = run.best_phase()
    assert final["split"] == "test" and final["best_phase"] == best
    assert [r["phase"] for r in final["rows"]] == ["00_sft", best]
    assert [r["label"] for r in final["rows"]] == ["SFT start", f"best phase {best}"]
    for row in final["rows"]:
        assert row["split"] == "test" and row["n_queries"] == N_TEST and 0.0 <= row["f1"] <= 1.0
    # The val evaluation is the one stored with the phase.
    val = run.evaluate(0, "val")
    assert val["n_queries"] == N_VAL and val["f1"] == pytest.approx(rows[0]["eval"]["f1"])


@pytest.mark.slow
def test_resume_after_crash_equals_uninterrupted(full_run, toy_dataset, tmp_path, monkeypatch):
    torch.set_num_threads(1)
    full, history, _ = full_run
    params = _params()

    # Crashed run: an exception while finishing phase 2 (after phase 1 finished) ...
    original = cogr_module.CoGR._finish_phase

    def crash_in_phase_two(self, spec, *args, **kwargs):
        if spec.index == 2:
            raise RuntimeError("simulated crash")
        return original(self, spec, *args, **kwargs)

    monkeypatch.setattr(cogr_module.CoGR, "_finish_phase", crash_in_phase_two)
    crashed = CoGR(tmp_path / "crashed", params, toy_dataset, progress=False)
    with pytest.raises(RuntimeError, match="simulated crash"):
        crashed.run()
    assert [r["name"] for r in crashed.rows()] == ["00_sft", "01_query"]
    assert [n for n in PHASES if crashed.is_done(n)] == ["seed", "00_sft", "01_query"]
    assert _stamp(tmp_path / "crashed", "02_item")["state"] == "running"
    assert not (tmp_path / "crashed" / "phases" / "02_item").exists()
    assert not [p for p in (tmp_path / "crashed" / "phases").iterdir() if p.name.startswith(".")]
    finished = _mtimes(tmp_path / "crashed" / "phases")

    # ... resumes at phase 2 (phases 0 and 1 untouched) and ends where the uninterrupted run ended.
    monkeypatch.setattr(cogr_module.CoGR, "_finish_phase", original)
    resumed = CoGR(tmp_path / "crashed", params, toy_dataset, progress=False).run()
    after = _mtimes(tmp_path / "crashed" / "phases")
    assert {p: t for p, t in after.items() if p in finished} == finished
    assert _comparable(resumed) == _comparable(history)
    final_full = json.loads((full.phase_dir(2) / "keywords.json").read_text())
    final_resumed = json.loads((tmp_path / "crashed" / "phases" / "02_item" / "keywords.json").read_text())
    assert final_full == final_resumed
    for side in ("query", "item"):
        weights = f"generators/{side}/model/model.safetensors"
        assert (full.phase_dir(2) / weights).read_bytes() == (tmp_path / "crashed" / "phases" / "02_item" / weights).read_bytes()
    assert {n: _stamp(tmp_path / "crashed", n)["key"] for n in PHASES} == {n: full.key(n) for n in PHASES}


@pytest.mark.slow
def test_changed_knobs_rerun_only_the_phases_that_depend_on_them(full_run, toy_dataset, tmp_path):
    torch.set_num_threads(1)
    full, history, _ = full_run
    folder = tmp_path / "run"
    shutil.copytree(full.run_dir, folder)  # copy2 keeps the mtimes
    before = _mtimes(folder)
    stamps = {n: _stamp(folder, n) for n in PHASES}

    # A finished run is not recomputed.
    assert _comparable(CoGR(folder, _params(), toy_dataset).run()) == _comparable(history)
    assert _mtimes(folder) == before

    # A GRPO knob: the seed and phase 0 stay (stamps and files untouched); both GRPO phases re-run.
    lr = ["cogr.grpo.learning_rate=2e-3"]
    changed = CoGR(folder, _params(lr), toy_dataset)
    assert [n for n in PHASES if changed.is_done(n)] == ["seed", "00_sft"]
    rows = changed.run()
    assert [r["name"] for r in rows] == ["00_sft", "01_query", "02_item"]
    for name in ("seed", "00_sft"):
        assert _stamp(folder, name) == stamps[name]
    for sub in ("seed", "phases/00_sft"):
        assert _mtimes(folder / sub) == {p: t for p, t in before.items() if folder / sub in p.parents}
    for name in ("01_query", "02_item"):
        stamp = _stamp(folder, name)
        assert stamp["state"] == "done" and stamp["key"] != stamps[name]["key"] and stamp["key"] == changed.key(name)
        assert (folder / "phases" / name / "metrics.json").stat().st_mtime_ns > before[folder / "phases" / name / "metrics.json"]

    # One more round adds two phases and keeps every finished one (the patience is no phase's
    # input either: raised here so that the flat toy curve does not stop the new round).
    kept = _mtimes(folder)
    more = CoGR(folder, _params(lr + ["cogr.rounds=2", "cogr.early_stopping.patience=10"]), toy_dataset)
    assert [p.name for p in more.phases()] == PHASES + ["03_query", "04_item"]
    rows = more.run()
    assert [r["name"] for r in rows] == ["00_sft", "01_query", "02_item", "03_query", "04_item"]
    assert {p: t for p, t in _mtimes(folder).items() if p in kept} == kept
    assert (folder / "phases" / "04_item" / "metrics.json").exists()

    # Back to one round: the extra phases' folders and stamps are pruned; the rest stays.
    fewer = CoGR(folder, _params(lr), toy_dataset)
    assert fewer.prune() == ["03_query", "04_item"]
    assert sorted(p.name for p in (folder / "phases").iterdir()) == ["00_sft", "01_query", "02_item"]
    assert sorted(p.stem for p in (folder / "stamps").iterdir()) == sorted(PHASES)
    assert _mtimes(folder) == kept
    assert all(fewer.is_done(n) for n in PHASES)


@pytest.mark.slow
def test_ablation_switches(toy_dataset, tmp_path):
    torch.set_num_threads(1)
    params = _params(
        ["cogr.query_side_only=true", "cogr.shared_generator=true", "cogr.sft_init=false", "cogr.item_reward=global",
         "cogr.rounds=2", "cogr.early_stopping.patience=1", "cogr.early_stopping.min_delta=0.5",
         "cogr.max_train_queries=6"],
    )
    run = CoGR(tmp_path / "ablation", params, toy_dataset, progress=False)
    assert [s.kind for s in run.schedule()] == ["base", "query", "query"]
    assert [p.name for p in run.phases()] == ["00_base", "01_query", "02_query"]  # no Algorithm 1 without SFT init
    assert len(run.train_query_ids) == 6 and set(run.train_qrels) == set(run.train_query_ids)
    history = run.run()
    # min_delta 0.5 cannot be met on this toy: patience 1 stops after the first GRPO phase.
    assert [r["name"] for r in history] == ["00_base", "01_query"]
    assert not run.is_done("02_query") and not (tmp_path / "ablation" / "phases" / "02_query").exists()
    assert not (tmp_path / "ablation" / "seed").exists()
    assert (run.phase_dir(1) / "generators" / "shared" / "generator.json").exists()
    state = run.stop_before("02_query")
    assert state is not None and state.stop is True and state.stale == 1 and state.best_index == 0
    assert run.best_phase() == "00_base"
    assert len(InvertedIndex.load(run.phase_dir(1) / "indexes" / "queries.jsonl")) == 6 + N_VAL  # capped train + val


def test_seed_keywords_sample_g0_at_seed_temperature(toy_dataset, tmp_path, monkeypatch):
    """Algorithm 1 samples G_0 at cogr.seed_temperature, not the GRPO rollout temperature."""
    from coevo.models.generator import Generator

    torch.set_num_threads(1)
    params = _params(["cogr.seed_temperature=0.3", "cogr.sampling.temperature=1.0"])
    temperatures: list[float] = []
    real_generate = Generator.generate

    def spy(self, prompts, **kwargs):
        temperatures.append(kwargs["temperature"])
        return real_generate(self, prompts, **kwargs)

    monkeypatch.setattr(Generator, "generate", spy)
    run = CoGR(tmp_path / "seed_temp", params, toy_dataset, progress=False)
    summary = run.run_phase("seed")
    assert temperatures == [0.3]
    assert summary["items"] == len(TOOLS) and run.is_done("seed")
    assert not run.is_done("00_sft")


def test_no_val_query_with_a_relevant_item_fails_before_any_work(tmp_path):
    data = _toy(tmp_path / "data", val_relevant=False)
    with pytest.raises(ValueError, match="no val query has a relevant item") as error:
        CoGR(tmp_path / "run", _params(), data).run()
    assert "val split" in str(error.value) and "never on test" in str(error.value)
    assert not (tmp_path / "run" / "stamps").exists()


def test_extractive_seeds_give_every_item_m_keywords_without_a_model(toy_dataset, tmp_path, monkeypatch):
    """cogr.seed_generator=yake: Algorithm 1's S_i from YAKE (no generator is loaded), the
    item's name first, up to M per item, none empty; the summary says the seeds are extractive."""
    from coevo.models.generator import Generator

    def no_model(*args, **kwargs):
        raise AssertionError("an extractive G_0 must not load a generator")

    monkeypatch.setattr(Generator, "create", no_model)
    run = CoGR(tmp_path / "yake", _params(["cogr.seed_generator=yake", "cogr.m_item_keywords=4"]), toy_dataset)
    summary = run.run_phase("seed")
    items, queries = run.seed_targets()
    assert summary["seed_kind"] == "extractive (YAKE)" and summary["item_fallbacks"] == 0
    assert set(items) == set(TOOLS)
    for item_id, keywords in items.items():
        title = TOOLS[item_id][0].lower()
        assert keywords[0] == title and 2 <= len(keywords) <= 4 and len(set(keywords)) == len(keywords)
    # Query targets pool the relevant item's seeds (one relevant tool per toy query).
    assert all(queries[q] == items[q.split("-")[0]] for q in queries)


def test_a_phase_whose_generator_writes_no_keywords_fails_unsaved(toy_dataset, tmp_path, monkeypatch):
    from coevo.checks import GenerationError

    run = CoGR(tmp_path / "empty", _params(["cogr.max_empty_share=0.5"]), toy_dataset)
    run.run_phase("seed")
    monkeypatch.setattr(CoGR, "_generate_keywords", lambda self, gen, prompts, *a, **k: [()] * len(prompts))
    with pytest.raises(GenerationError, match=r"phase 00_sft, item generator: no usable output for 5 of 5 inputs.*"
                                              r"cogr.max_empty_share = 0.5"):
        run.run_phase("00_sft")
    assert not run.is_done("00_sft") and not (run.phases_dir / "00_sft").exists()


def test_screening_puts_prompts_with_differing_rewards_first():
    from coevo.methods.cogr import screened_first

    groups = [[0.5, 0.5], [0.0, 1.0], [1.0, 1.0], [0.2, 0.0], [0.0, 0.0]]
    assert screened_first(["a", "b", "c", "d", "e"], groups) == ["b", "d", "a", "c", "e"]


@pytest.mark.slow
def test_a_screened_phase_trains_on_the_prompts_its_policy_disagrees_on(toy_dataset, tmp_path, monkeypatch):
    """screen_factor 3: 12 candidates, each sampled twice by the phase's starting policy; the phase
    trains on 4 of them, those whose rewards differed first, and records what it saw."""
    torch.set_num_threads(1)
    seen: list[tuple[list[str], list[list[float]]]] = []
    real = cogr_module.screened_first

    def spy(candidates, groups):
        seen.append((list(candidates), [list(g) for g in groups]))
        return real(candidates, groups)

    monkeypatch.setattr(cogr_module, "screened_first", spy)
    with reward_calls() as calls:
        rows = CoGR(tmp_path / "run", _params(["cogr.grpo.screen_factor=3"]), toy_dataset, progress=False).run()
    assert len(seen) == 2  # the query phase (12 of 15 training queries) and the item phase (all 5 items)
    (candidates, groups), (items, _) = seen
    assert len(items) == 5
    assert len(candidates) == len(set(candidates)) == 12 and all(len(g) == 2 for g in groups)
    train = next(r for r in rows if r["name"] == "01_query")["train"]
    mixed = [c for c, g in zip(candidates, groups) if max(g) > min(g)]
    assert train["screened"] == 12 and train["prompts"] == 4
    assert train["screened_mixed_share"] == len(mixed) / 12
    assert train["screened_solved_in_all_share"] == sum(min(g) >= 1.0 for g in groups) / 12
    query_calls = [call for call in calls if call["side"] == "query"]
    assert query_calls[0]["ids"] == [c for c in candidates for _ in range(2)]  # the screening pass
    trained = {q for call in query_calls[1:] for q in call["ids"]}
    assert trained == set(real(candidates, groups)[:4])  # the mixed ones first, then the draw's order
