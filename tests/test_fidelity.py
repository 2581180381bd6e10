"""Issue 11, item 4: the papers' definitions, checked where they cut across modules.

- one BM25 parameter set: CoGR's ranking of its retrieved set and the Lucene baseline both
  use coevo.retrieval.bm25's k1 0.9 / b 0.4;
- every new knob enters exactly the phases whose outputs depend on it (a knob missing from a
  phase's params would not re-run that phase);
- GRAPE refuses a CLIP retriever without weights at load time, naming the knob;
- CoHyDE's S3 starts from S1a (the default) or chains rounds; "without S1b" skips the warm-up.
(The CoGR reward rules have their tests in test_rewards_cogr.py and test_keywords.py; the
loader options in test_data_loaders.py.)
"""

from __future__ import annotations

import inspect

import pytest

from coevo.config import ParamsError, load_params
from coevo.methods.base import method_class
from tests.conftest import REPO_ROOT


def _params(*overrides: str):
    return load_params(REPO_ROOT / "params.yaml", list(overrides))


def _keys(method: str, *overrides: str) -> dict[str, str]:
    run = method_class(method).declared(_params(*overrides))
    return {p.name: run.key(p.name) for p in run.phases()}


def _changed(method: str, base: list[str], change: str) -> list[str]:
    before, after = _keys(method, *base), _keys(method, *base, change)
    assert list(before) == list(after)
    return [name for name in before if before[name] != after[name]]


# ------------------------------------------------------------------------------- BM25
def test_cogr_ranking_and_lucene_baseline_share_one_bm25_parameter_set():
    from coevo.retrieval import bm25, evaluate, lucene
    from coevo.retrieval.bm25 import BM25_B, BM25_K1, KeywordBM25
    from coevo.retrieval.evaluate import evaluate_keyword_retrieval

    assert (BM25_K1, BM25_B) == (0.9, 0.4)  # Lucene / Anserini defaults
    for fn in (lucene.bm25_baseline, lucene.bm25_rankings, KeywordBM25.__init__):
        params = inspect.signature(fn).parameters
        assert (params["k1"].default, params["b"].default) == (BM25_K1, BM25_B), fn
    assert "BM25_K1" in inspect.getsource(evaluate) and bm25.KeywordBM25 is KeywordBM25
    # A case where the parameter set decides the top item: bm25s' defaults (k1 1.5, b 0.75)
    # put i3 first, Lucene's (0.9, 0.4) the long item i5. CoGR's ranked metrics follow the latter.
    items = {"i0": ["c"], "i1": ["h", "b"], "i2": ["e", "c"], "i3": ["g", "a", "e"], "i4": ["d", "f", "c"],
             "i5": ["h", "e", "g", "d", "c", "b", "a"]}
    query = ["a", "h", "e"]
    assert KeywordBM25(items).rank(query)[0] == "i5" and KeywordBM25(items, k1=1.5, b=0.75).rank(query)[0] == "i3"
    for top, mrr1 in (("i5", 1.0), ("i3", 0.0)):
        metrics = evaluate_keyword_retrieval({"q": query}, items, {"q": {top: 1}}, query_ids=["q"])
        assert metrics["mrr@1"] == mrr1


# --------------------------------------------------------------- knobs -> phase keys
def test_cogr_epoch_knobs_enter_their_side_only():
    base = ["cogr.rounds=2"]
    assert _changed("cogr", base, "cogr.grpo.query_epochs=3") == ["01_query", "02_item", "03_query", "04_item"]
    # item epochs: not the first query phase (it does not depend on them), every phase after it
    assert _changed("cogr", base, "cogr.grpo.item_epochs=3") == ["02_item", "03_query", "04_item"]
    assert _changed("cogr", base, "cogr.item_reward=global") == ["01_query", "02_item", "03_query", "04_item"]


def test_cohyde_ablation_knobs_enter_the_right_phases():
    """A round is five stamped phases; a knob re-runs the ones that read it and what reads them."""
    base = ["cohyde.rounds=2"]
    round_1 = ["round_1_s2", "round_1_s3", "round_1_s4", "round_1_dpo", "round_1"]
    round_2 = [name.replace("_1", "_2") for name in round_1]
    assert _changed("cohyde", base, "cohyde.s1b_warmup=false") == ["s1b", "hyde", *round_1, *round_2]
    # the pairing is how a round is evaluated, not how it trains: only the evaluations re-run
    assert _changed("cohyde", base, "cohyde.eval_pairing=trained_rewriter_s1a_encoder") == ["round_1", "round_2"]
    # round 1's S3 starts from S1a either way; round 2's from round 1's encoder
    assert _changed("cohyde", base, "cohyde.s3_init=previous_round") == round_2[1:]
    # S2 writes descriptions alone; what S3 trains on and S4 scores is the query with them
    assert _changed("cohyde", base, "cohyde.encode=query_and_description") == ["hyde", *round_1[1:], *round_2]
    assert _changed("cohyde", base, "cohyde.dpo_beta=0.2") == [*round_1[3:], *round_2]
    assert _changed("cohyde", base, "cohyde.num_samples=3") == [*round_1[2:], *round_2]
    run = method_class("cohyde").declared(_params(*base))
    assert run.phase("round_2_s3").reads == ("round_2_s2", "s1a")  # S3 of round 2 starts from the S1a encoder
    assert run.phase("round_2_s2").reads == ("round_1_dpo",)  # the rewriter round 1 trained
    assert run._round_inputs(2) == ("round_2", "round_1", "s1a")
    chained = method_class("cohyde").declared(_params(*base, "cohyde.s3_init=previous_round"))
    assert chained._round_inputs(2) == ("round_2", "round_1", "round_1")
    assert chained._round_inputs(1) == run._round_inputs(1) == ("round_1", "s1b", "s1a")


def test_grape_clip_knobs_enter_the_index():
    tiny = ["grape.retriever=clip", "grape.clip_model=coevo-tiny-clip"]
    assert _changed("grape", tiny, "grape.clip_pretrained=/models/tiny.pt")[:1] == ["index"]


def test_data_knobs_are_part_of_the_prepare_key():
    """The prepare step's key covers the whole data section (coevo.orchestration.pipeline), so the new data
    knobs re-prepare the data set, and through its fingerprint every phase."""
    from coevo.orchestration import pipeline

    assert '("seed", "data")' in inspect.getsource(pipeline)
    params = _params()
    for knob in ("min_grade", "split_scheme", "duplicates"):
        assert knob in params.model_dump()["data"]


# ---------------------------------------------------------------------------- GRAPE / CLIP
def test_clip_without_weights_is_an_error_naming_the_knob():
    with pytest.raises(ParamsError, match=r"grape: grape\.clip_pretrained is null but grape\.retriever is clip"):
        _params("grape.retriever=clip", "grape.clip_model=ViT-B-16")
    assert _params("grape.retriever=clip", "grape.clip_model=coevo-tiny-clip").grape.clip_pretrained is None
    assert _params("grape.retriever=clip", "grape.clip_model=ViT-B-16", "grape.clip_pretrained=openai")
    assert _params("grape.retriever=clip", "grape.clip_model=hf-hub:org/clip")  # hub models carry weights
    assert _params("grape.clip_model=ViT-B-16").grape.retriever == "text"  # only checked when CLIP is used


def test_load_clip_refuses_random_weights_outside_the_tiny_model():
    from coevo.models.clip import TINY_CLIP, load_clip

    with pytest.raises(ValueError, match="grape.clip_pretrained"):
        load_clip("ViT-B-32")
    import torch

    model, _, tokenizer = load_clip(TINY_CLIP)
    again, _, _ = load_clip(TINY_CLIP)  # seeded random weights: two loads agree
    with torch.no_grad():
        text = model.encode_text(tokenizer(["a dog runs", "a red car"]))
        assert tuple(text.shape) == (2, 32) and not model.training
        assert torch.equal(text, again.encode_text(tokenizer(["a dog runs", "a red car"])))


# ---------------------------------------------------------------------------- CoHyDE S1b
def test_without_s1b_the_rounds_start_from_the_untrained_rewriter(tmp_path):
    import torch

    from coevo.methods.cohyde import CoHyDE
    from coevo.models.generator import Generator
    from tests.test_cohyde_train import _small_stabletoolbench

    data = _small_stabletoolbench(tmp_path)
    run = CoHyDE(tmp_path / "run", _params("cohyde.generator=tiny", "cohyde.s1b_warmup=false"), data)
    assert run.phase("s1b").label == "S1b skipped (ablation)"
    record = run.run_phase("s1b")
    assert record["examples"] == 0 and "ablation" in record["skipped"]
    base = Generator.load(tmp_path / "run" / "base_generator")
    warm = Generator.load(tmp_path / "run" / "s1b" / "generator")
    for (name, a), (_, b) in zip(base.model.state_dict().items(), warm.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
