"""CoHyDE training: DPO wrapper, description scoring, and one tiny round end to end."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from coevo.config import load_params, section
from coevo.data.schema import Dataset
from coevo.models.generator import Generator
from coevo.train.dpo import train_dpo
from tests.conftest import REPO_ROOT, SAMPLE_DIR, shared_data
from tests.test_cogr_train import splits_read  # one copy of the split spy

CORPUS = ["weather forecast tool", "stock price api", "music search", "Request: find weather"]


def _preference(generator: Generator, prompt: str, chosen: str, rejected: str) -> float:
    """log p(chosen | prompt) - log p(rejected | prompt), summed over completion tokens."""

    def logp(completion: str) -> float:
        tok = generator.tokenizer
        prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([prompt_ids + tok(completion, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            logits = generator.model(input_ids=ids).logits[0, :-1]
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        targets = ids[0, 1:]
        picked = logprobs[torch.arange(len(targets)), targets]
        return float(picked[len(prompt_ids) - 1 :].sum())

    return logp(chosen) - logp(rejected)


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_dpo_moves_the_policy_towards_chosen(tmp_path, lora):
    generator = Generator.create("tiny", lora=section("cohyde.lora", enabled=lora), seed=0, corpus=CORPUS)
    prompts = [generator.render([{"role": "user", "content": f"Request: q{i}\nTool description:"}]) for i in range(4)]
    pairs = [{"prompt": p, "chosen": "weather forecast tool", "rejected": "stock price api"} for p in prompts]
    before = _preference(generator, prompts[0], pairs[0]["chosen"], pairs[0]["rejected"])
    stats = train_dpo(generator, pairs, section("cohyde.dpo", epochs=3, learning_rate=1e-2, batch_size=4), 0.1,
                      tmp_path / "gen", seed=0)
    after = _preference(generator, prompts[0], pairs[0]["chosen"], pairs[0]["rejected"])
    assert after > before
    assert stats["pairs"] == 4 and stats["steps"] == 3 and np.isfinite(stats["train_loss"])
    assert stats["reference"] == ("adapter copy" if lora else "frozen model copy")
    if lora:  # TRL's temporary reference adapter must not survive into the checkpoint
        assert list(generator.model.peft_config) == ["default"]
    reloaded = Generator.load(tmp_path / "gen")
    # The checkpoint keeps the learnt preference (small drift: the reloaded tokenizer/weights round trip).
    reloaded_preference = _preference(reloaded, prompts[0], pairs[0]["chosen"], pairs[0]["rejected"])
    assert reloaded_preference == pytest.approx(after, rel=0.02) and reloaded_preference > before
    assert json.loads((tmp_path / "gen" / "dpo.json").read_text())["pairs"] == 4


def test_dpo_refuses_bad_pairs(tmp_path):
    dpo = section("cohyde.dpo")
    with pytest.raises(ValueError, match="at least one"):
        train_dpo(None, [], dpo, 0.1, tmp_path, seed=0)
    with pytest.raises(ValueError, match="pair 0: field 'rejected'"):
        train_dpo(None, [{"prompt": "p", "chosen": "a"}], dpo, 0.1, tmp_path, seed=0)
    with pytest.raises(ValueError, match="pair 0: chosen and rejected are the same"):
        train_dpo(None, [{"prompt": "p", "chosen": "a", "rejected": "a"}], dpo, 0.1, tmp_path, seed=0)


def test_descriptions_are_scored_by_ndcg_at_5_under_the_encoder():
    from coevo.models.encoder import load_text_encoder
    from coevo.retrieval.dense import DenseIndex
    from coevo.rewards.cohyde import encode_texts, score_descriptions

    encoder = load_text_encoder("all-minilm-l6-v2")
    tools = {f"t{i}": text for i, text in enumerate([
        "Weather forecast API: hourly temperature and rain for a city",
        "Stock quotes API: latest share price for a ticker symbol",
        "Recipe search API: find recipes by ingredient",
        "Flight status API: departure and arrival times of a flight",
        "Currency converter API: exchange rates between currencies",
        "Movie database API: ratings and plot summaries of films",
        "Translation API: translate text between languages",
    ])}
    index = DenseIndex.build(list(tools), encode_texts(encoder, list(tools.values())))
    samples = [[tools["t0"], "Flight status API: departure and arrival times of a flight", tools["t0"], "x"]]
    scores = score_descriptions(encoder, index, samples, [{"t0": 1}])
    assert scores.shape == (1, 4)
    assert scores[0, 0] == pytest.approx(1.0) and scores[0, 2] == pytest.approx(1.0)
    assert scores[0, 1] < 1.0
    with pytest.raises(ValueError, match="same number of samples"):
        score_descriptions(encoder, index, [["a", "b"], ["c"]], [{"t0": 1}, {"t0": 1}])


def _small_stabletoolbench(tmp_path: Path, per_group: int = 4, val_fraction: float = 0.25) -> Path:
    """The first ``per_group`` records of each group file, prepared as a dataset folder
    (split by group: with 4 per group, one val and one test query per group file)."""
    from coevo.data.loaders import load_source

    source = SAMPLE_DIR / "stabletoolbench"
    if not source.exists():
        source = shared_data("stabletoolbench")
    files = sorted(source.rglob("test_instruction/*.json")) or sorted(source.glob("*.json"))
    raw = tmp_path / "raw"
    raw.mkdir(exist_ok=True)
    for path in files:
        (raw / path.name).write_text(json.dumps(json.loads(path.read_text())[:per_group]))
    dataset = load_source("stabletoolbench", raw, seed=0, val_fraction=val_fraction, test_fraction=0.25)
    return dataset.save(tmp_path / f"dataset_val{val_fraction}")


def _params(*extra: str):
    return load_params(REPO_ROOT / "params.yaml", ["seed=0", *extra])


# A random tiny rewriter only writes text after a real warm-up: full fine-tuning at a
# high learning rate (LoRA at 2e-4 leaves its greedy outputs empty).
TINY_ROUND = (
    "cohyde.generator=tiny", "cohyde.rounds=1", "cohyde.max_new_tokens=16", "cohyde.lora.enabled=false",
    "cohyde.warmup.learning_rate=3e-3", "cohyde.warmup.epochs=2", "cohyde.warmup.batch_size=16",
    "cohyde.encoder_training.batch_size=8", "cohyde.dpo.learning_rate=1e-3",
)


@pytest.mark.slow
def test_one_tiny_round_end_to_end(tmp_path):
    from coevo.methods.cohyde import HYDE, RAW, S1A, CoHyDE, rewriter_messages
    from coevo.retrieval.dense import DenseIndex

    dataset_dir = _small_stabletoolbench(tmp_path)
    data = Dataset.load(dataset_dir)
    n_val, n_test = len(data.relevant("val")), len(data.relevant("test"))
    assert n_val == n_test == 6
    params = _params(*TINY_ROUND)
    cfg = params.cohyde
    with splits_read() as asked:
        run = CoHyDE(tmp_path / "run", params, dataset_dir)
        rows = run.run()
    folder = tmp_path / "run"
    # Training, evaluation and round selection read train and val; never test.
    assert "test" not in asked and "val" in asked
    # a round is five stamped phases: S2, S3, S4, DPO, then its val evaluation
    assert [p.name for p in run.phases()] == [RAW, S1A, "s1b", HYDE, "round_1_s2", "round_1_s3", "round_1_s4",
                                              "round_1_dpo", "round_1"]
    assert all(run.is_done(p.name) for p in run.phases())
    assert [r["name"] for r in rows] == [RAW, S1A, HYDE, "round_1"]
    for row in rows:
        assert 0.0 <= row["eval"]["ndcg@5"] <= 1.0 and 0.0 <= row["eval"]["recall@5"] <= 1.0
        assert row["eval"]["n"] == n_val
    assert run.best_phase() in {HYDE, "round_1"}

    # Metrics: every stage, per group and overall, on the val split.
    history = run.history()
    assert {row["stage"] for row in history} == {RAW, S1A, HYDE, "round_1"}
    groups = {row["group"] for row in history if row["stage"] == "round_1"}
    assert {"G1", "G2", "G3", "overall"} <= groups
    for row in history:
        assert 0.0 <= row["ndcg@5"] <= 1.0 and 0.0 <= row["recall@5"] <= 1.0 and row["split"] == "val"
    overall = [r for r in history if r["group"] == "overall" and r["stage"] == RAW][0]
    assert overall["n"] == n_val == sum(r["n"] for r in history if r["stage"] == RAW and r["group"] != "overall")

    # DPO pairs: best vs worst of the sampled descriptions, ties dropped, stats consistent.
    queries = run.train_queries()
    s4 = json.loads((folder / "round_1" / "s4.json").read_text())
    samples = json.loads((folder / "round_1" / "s4_samples.json").read_text())["samples"]
    pairs = json.loads((folder / "round_1" / "pairs.json").read_text())
    scores = np.array(s4["scores"])
    assert scores.shape == (len(queries), cfg.num_samples)
    mining = s4["mining"]
    assert mining["pairs"] == len(pairs)
    assert mining["pairs"] + mining["ties_dropped"] + mining["empty_dropped"] == len(queries)
    # ties and empty samples, recounted from what S4 wrote: best and worst among the written samples
    written = [[j for j, text in enumerate(row) if text.strip()] for row in samples]
    assert mining["empty_samples"] == sum(len(row) - len(w) for row, w in zip(samples, written))
    assert mining["empty_dropped"] == sum(len(w) < 2 for w in written)
    assert mining["ties_dropped"] == sum(len(w) >= 2 and scores[i, w].max() == scores[i, w].min()
                                         for i, w in enumerate(written))
    generator = Generator.load(folder / "s1b" / "generator")
    prompt_of = {generator.render(rewriter_messages(q["text"])): i for i, q in enumerate(queries)}
    for pair in pairs:
        q = prompt_of[pair["prompt"]]
        assert pair["chosen_score"] == pytest.approx(scores[q, written[q]].max())
        assert pair["rejected_score"] == pytest.approx(scores[q, written[q]].min())
        assert pair["chosen_score"] > pair["rejected_score"]
        assert pair["chosen"] in samples[q] and pair["rejected"] in samples[q]
    assert json.loads((folder / "round_1" / "dpo.json").read_text())["pairs"] == len(pairs)
    assert run.result("round_1_s4")["mining"] == mining and run.result("round_1_s2")["descriptions"] == len(queries)
    assert not list(folder.rglob("done.json"))  # no marker beside the stamps: one checkpoint mechanism

    # Indexes: one per encoder version, complete corpus, verified on load, contents differ.
    n_items = len(run.items)
    manifests = [DenseIndex.load(folder / stage / "index").manifest() for stage in (RAW, S1A, "round_1")]
    assert all(m["n_items"] == n_items for m in manifests)
    assert manifests[0]["content_hash"] != manifests[1]["content_hash"]  # S1a changed the encoder
    # S3 changes the encoder unless its pairs gave no signal (identical descriptions: loss 0).
    s3_loss = json.loads((folder / "round_1" / "s3.json").read_text())["encoder"]["train_loss"]
    assert (manifests[1]["content_hash"] != manifests[2]["content_hash"]) == (s3_loss > 0)
    assert [m["encoder"].split(":")[1] for m in manifests] == [RAW, S1A, "round_1"]

    flat = run.flat_metrics("round_1")
    assert flat["train/pairs"] == len(pairs) and "eval/val/G3/recall@5" in flat and "eval/val/overall/ndcg@5" in flat
    assert not [k for k in flat if k.startswith("eval/test/")]

    # Idempotent: a second run recomputes nothing.
    stamps = {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}
    assert CoHyDE(folder, params, dataset_dir).run() == rows
    assert {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()} == stamps

    # The final evaluation reads the test split once: raw, S1a, vanilla HyDE and the chosen round.
    best = run.best_phase()
    with splits_read() as asked:
        final = run.final_evaluation("test")
    assert "test" in asked
    assert final["split"] == "test" and final["best_phase"] == best
    assert [r["phase"] for r in final["rows"]] == list(dict.fromkeys([RAW, S1A, HYDE, best]))
    for row in final["rows"]:
        assert row["split"] == "test" and row["n_queries"] == n_test and 0.0 <= row["ndcg@5"] <= 1.0
        assert {"G1", "G2", "G3", "overall"} <= set(row["groups"])
    # nothing of the test split is stored in the run folder
    assert {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()} == stamps

    # The paper's ablations pair the round's artifacts with the vanilla ones (no retraining:
    # the round's files are reused; only the evaluation pairs differently).
    co = run.evaluate("round_1", store=False)
    assert (co["encoder"], co["rewriter"]) == ("round_1", "round_1")
    assert co["splits"]["val"] == json.loads((folder / "eval" / "round_1.json").read_text())["splits"]["val"]
    for pairing, encoder, rewriter in (("trained_rewriter_s1a_encoder", S1A, "round_1"),
                                       ("vanilla_rewriter_co_trained_encoder", "round_1", HYDE)):
        ablation = CoHyDE(folder, _params(*TINY_ROUND, f"cohyde.eval_pairing={pairing}"), dataset_dir)
        result = ablation.evaluate("round_1", store=False)
        assert (result["encoder"], result["rewriter"]) == (encoder, rewriter)
        assert not ablation.is_done("round_1")  # the pairing is part of the round's evaluation key
        assert ablation.is_done("round_1_dpo")  # and not of its training
        assert ablation.stages("round_1") == (encoder, rewriter)  # what serving loads
    # What is encoded is part of vanilla HyDE's and every round's key from S3 on, not of S1a's, S1b's or S2's
    # (S2 writes the descriptions alone).
    both = CoHyDE(folder, _params(*TINY_ROUND, "cohyde.encode=query_and_description"), dataset_dir)
    assert [p.name for p in both.phases() if both.is_done(p.name)] == [RAW, S1A, "s1b", "round_1_s2"]
    assert {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()} == stamps


def test_the_encoder_embeds_the_description_or_the_query_followed_by_it():
    from coevo.methods.cohyde import searched_text

    assert searched_text("find  the\tweather ", "Weather API: forecasts", "description") == "Weather API: forecasts"
    assert (searched_text("find  the\tweather ", "Weather API: forecasts", "query_and_description")
            == "find the weather\nWeather API: forecasts")
    assert searched_text("find the weather", "", "query_and_description") == "find the weather"
    with pytest.raises(ValueError, match="unknown cohyde.encode 'both'"):
        searched_text("q", "d", "both")


def test_s1b_on_query_pairs_trains_each_training_query_towards_its_tool_as_the_index_embeds_it(tmp_path):
    """``warmup_data: query_pairs``: one supervised row per training query (capped, in order),
    prompt the rewriter's, target its most relevant tool in ``index_format`` cut to the budget;
    the tools mode keeps the paper's texts; S1b is re-keyed by the knob and records it."""
    from coevo.data.render import render_tool
    from coevo.methods.cohyde import CoHyDE
    from coevo.models.generator import SFT_TARGET_SLACK

    dataset_dir = _small_stabletoolbench(tmp_path)
    pairs = ("cohyde.warmup_data=query_pairs", "cohyde.max_new_tokens=12", "cohyde.index_format=title_api_desc")
    run = CoHyDE(tmp_path / "run", _params("cohyde.generator=tiny", *pairs), dataset_dir)
    tokenizer = run.rewriter("base").tokenizer
    rows = run.warmup_pairs(tokenizer)
    train = run._queries("train")
    assert len(rows) == len(train) > 2
    for row, query in zip(rows, train):
        assert " ".join(query["text"].split()) in row["prompt"][-1]["content"]
        tool = min(query["relevant"], key=lambda i: (-query["relevant"][i], i))
        target = row["completion"][0]["content"]
        assert target and render_tool(run.items[tool], "title_api_desc").startswith(target)
        assert len(tokenizer(target, add_special_tokens=False)["input_ids"]) <= 12 - SFT_TARGET_SLACK
    capped = CoHyDE(tmp_path / "capped", _params("cohyde.generator=tiny", *pairs, "cohyde.warmup_max_examples=2"),
                    dataset_dir).warmup_pairs(tokenizer)
    assert len(capped) == 2 and all(row in rows for row in capped)
    assert capped == sorted(capped, key=rows.index)  # the draw keeps the training order

    tools = CoHyDE(tmp_path / "tools", _params("cohyde.generator=tiny"), dataset_dir)
    assert all(isinstance(t, str) and t for t in tools.warmup_texts())
    s1b = {p.name: p for p in run.phases()}["s1b"]
    assert "cohyde.warmup_data" in s1b.params and run.key("s1b") != tools.key("s1b")
    result = run.s1b()
    assert result["data"] == "query_pairs" and result["examples"] == len(rows)
    assert result["sft"]["train/steps"] >= 1


@pytest.mark.slow
def test_a_round_interrupted_in_s4_resumes_there_and_keeps_s2_and_s3(tmp_path, monkeypatch):
    """One checkpoint mechanism: S2 and S3 are stamped phases, so a failure in S4 leaves them done
    and the next run starts at S4; nothing beside the stamps marks progress."""
    from coevo.methods.cohyde import CoHyDE

    dataset_dir = _small_stabletoolbench(tmp_path)
    params = _params(*TINY_ROUND)
    folder = tmp_path / "run"
    original = CoHyDE.s4

    def interrupted(self, r):
        raise KeyboardInterrupt("killed in S4")

    monkeypatch.setattr(CoHyDE, "s4", interrupted)
    with pytest.raises(KeyboardInterrupt):
        CoHyDE(folder, params, dataset_dir).run()
    run = CoHyDE(folder, params, dataset_dir)
    assert [p.name for p in run.phases() if run.is_done(p.name)] == ["raw", "s1a", "s1b", "hyde", "round_1_s2",
                                                                     "round_1_s3"]
    kept = {p: p.stat().st_mtime_ns for p in (folder / "round_1").rglob("*") if p.is_file()}
    ran = []
    monkeypatch.setattr(CoHyDE, "s4", lambda self, r: ran.append(r) or original(self, r))
    run.run()
    assert ran == [1] and all(run.is_done(p.name) for p in run.phases())
    assert all(path.stat().st_mtime_ns == mtime for path, mtime in kept.items())  # S2's and S3's outputs untouched


def test_no_val_query_with_a_relevant_tool_fails_at_the_first_phase(tmp_path):
    from coevo.methods.cohyde import CoHyDE

    run = CoHyDE(tmp_path / "run", _params(), _small_stabletoolbench(tmp_path, val_fraction=0.0))
    with pytest.raises(ValueError, match="no val query has a relevant item") as error:
        run.run()
    assert "val split" in str(error.value)
    assert [p.name for p in run.phases() if run.is_done(p.name)] == []
    assert not (tmp_path / "run" / "raw").exists() and not (tmp_path / "run" / "eval").exists()


def test_bad_stage_and_round_are_named(tmp_path):
    from coevo.methods.base import PhaseNotReady
    from coevo.methods.cohyde import CoHyDE, parse_round_phase

    params = _params("cohyde.rounds=2")
    run = CoHyDE(tmp_path / "run", params, tmp_path / "missing")
    with pytest.raises(ValueError, match="unknown phase 'round_x'; phases: raw, s1a, s1b, hyde, round_1_s2, round_1_s3, "
                                         "round_1_s4, round_1_dpo, round_1, round_2_s2, .*, round_2_dpo, round_2$"):
        run.phase("round_x")
    with pytest.raises(ValueError, match="unknown phase 'round_3'"):
        run.run_phase("round_3")
    with pytest.raises(ValueError, match="numbered from 1"):
        run.s2(0)
    with pytest.raises(ValueError, match="not a CoHyDE round phase: 'round_1_s5'"):
        parse_round_phase("round_1_s5")
    assert parse_round_phase("round_2_s3") == (2, "s3") and parse_round_phase("round_12") == (12, "eval")
    with pytest.raises(FileNotFoundError, match="dataset folder does not exist"):
        run.s1a()
    assert not os.path.exists(tmp_path / "run" / "s1a")
    ready = CoHyDE(tmp_path / "run2", params, _small_stabletoolbench(tmp_path))
    with pytest.raises(ValueError, match="unknown CoHyDE stage 'round_x'"):
        ready.evaluate("round_x")
    with pytest.raises(PhaseNotReady, match="cannot evaluate before training: .*round_1/encoder, .*round_1/generator missing"):
        ready.evaluate("round_1")
