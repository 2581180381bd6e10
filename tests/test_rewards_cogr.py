"""CoGR rewards: query F1, incremental item reward == naive full rebuild, budget rules."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coevo.retrieval.inverted_index import InvertedIndex
from coevo.retrieval.keywords import normalize_keyword
from coevo.rewards.cogr import INVALID_REWARD, ItemReward, QueryReward, naive_item_reward, naive_reference_f1


def _norm_set(keywords) -> set[str]:
    return {n for n in map(normalize_keyword, keywords) if n}


def pure_python_f1s(query_keywords, item_keywords, qrels, min_grade=None) -> dict[str, float]:
    """F1 per query straight from the definition, with Python sets (independent of the library)."""
    out = {}
    item_sets = {i: _norm_set(k) for i, k in item_keywords.items()}
    for q, kws in query_keywords.items():
        wanted = _norm_set(kws)
        retrieved = {i for i, s in item_sets.items() if s & wanted}
        relevant = {i for i, g in qrels.get(q, {}).items() if (g >= min_grade if min_grade else g > 0)}
        den = len(retrieved) + len(relevant)
        out[q] = 2 * len(retrieved & relevant) / den if den else 0.0
    return out


def pure_python_marginal(query_keywords, item_keywords, qrels, item, candidate, min_grade=None) -> float:
    before = pure_python_f1s(query_keywords, item_keywords, qrels, min_grade)
    after = pure_python_f1s(query_keywords, {**item_keywords, item: list(candidate)}, qrels, min_grade)
    return sum(after[q] - before[q] for q in query_keywords)


QUERIES = {"q1": ["a", "b"], "q2": ["c"], "q3": ["d", "e"]}
ITEMS = {"i1": ["a"], "i2": ["c", "x"], "i3": [], "i4": ["b", "c"]}
QRELS = {"q1": {"i1": 1, "i2": 1}, "q2": {"i2": 1}, "q3": {"ghost": 1}}


def test_query_reward_hand_computed() -> None:
    reward = QueryReward(InvertedIndex.from_keyword_sets(ITEMS), QRELS, k_max=3)
    out = reward(
        ["q1", "q1", "q2", "q3", "q9", "q1"],
        ["a, c", "a, b, c, x", "Keywords: C", "d", "a", "???"],
    )
    # q1 "a, c" retrieves i1, i2, i4 with i1, i2 relevant: F1 = 2*2/(3+2).
    assert out == pytest.approx([0.8, INVALID_REWARD, 2 * 1 / (2 + 1), 0.0, 0.0, INVALID_REWARD])
    # Budget counts distinct normalised keywords: four spellings of one keyword are one.
    assert reward(["q2"], ["c, C, c., 'c'"]) == pytest.approx([2 / 3])
    assert reward.score_keywords(["q1", "q1"], [None, ["A", "c"]]) == pytest.approx([INVALID_REWARD, 0.8])


def test_item_reward_hand_computed() -> None:
    reward = ItemReward(QUERIES, ITEMS, QRELS, k_max=5)
    # i1 switches from "a" to "c, d": q1 loses a relevant item, q2 and q3 gain a non-relevant one.
    assert reward(["i1"], ["c, d"]) == pytest.approx([-0.6666666666666666])
    assert reward.reference_queries("i4") == ("q1", "q2")
    assert reward(["i3", "i4", "i2"], ["zzz", "", "a, b, c, d, e, f"]) == pytest.approx([0.0, INVALID_REWARD, INVALID_REWARD])
    with pytest.raises(KeyError, match="'nope' is not in the index"):
        reward(["nope"], ["a"])
    with pytest.raises(ValueError, match="1 item ids but 2"):
        reward(["i1"], ["a", "b"])
    with pytest.raises(ValueError, match="mode"):
        ItemReward(QUERIES, ITEMS, QRELS, k_max=5, mode="local")


def test_trl_conversational_completions_are_read() -> None:
    reward = ItemReward(QUERIES, ITEMS, QRELS, k_max=5)
    assert reward(["i1"], [[{"role": "assistant", "content": "c, d"}]]) == reward(["i1"], ["c, d"])
    # Tool results are not the model's keywords: only the last assistant turn is scored.
    turns = [{"role": "assistant", "content": "a"}, {"role": "tool", "content": "x, y"},
             {"role": "assistant", "content": "c, d"}]
    assert reward(["i1"], [turns]) == reward(["i1"], ["c, d"])
    with pytest.raises(TypeError, match="completion"):
        reward(["i1"], [None])


def test_naive_reward_checks_its_reference() -> None:
    reference = naive_reference_f1(QUERIES, ITEMS, QRELS)
    assert reference == pytest.approx([2 * 1 / (2 + 2), 2 * 1 / (2 + 1), 0.0])  # retrieved: i1,i4 | i2,i4 | none
    assert naive_item_reward(QUERIES, ITEMS, QRELS, "i1", ["c", "d"], reference_f1=reference) == pytest.approx(-2 / 3)
    with pytest.raises(ValueError, match="one F1 per query"):
        naive_item_reward(QUERIES, ITEMS, QRELS, "i1", ["c"], reference_f1=reference[:2])
    with pytest.raises(KeyError, match="'nope' is not in item_keywords"):
        naive_item_reward(QUERIES, ITEMS, QRELS, "nope", ["c"])


# -- property: incremental == naive full rebuild ---------------------------------------
_VOCAB = ["a", "b", "c", "d", "e", "f g", "H"]
_kw_list = st.lists(st.sampled_from(_VOCAB + [" a ", "B."]), max_size=5)  # duplicates after normalisation


@st.composite
def instances(draw):
    items = draw(st.lists(st.sampled_from([f"i{n}" for n in range(9)]), min_size=1, max_size=9, unique=True))
    queries = draw(st.lists(st.sampled_from([f"q{n}" for n in range(7)]), min_size=1, max_size=7, unique=True))
    item_keywords = {i: draw(_kw_list) for i in items}
    query_keywords = {q: draw(_kw_list) for q in queries}
    # Relevance over corpus items plus a ghost item absent from the corpus; grades 0..2.
    qrels = {
        q: draw(st.dictionaries(st.sampled_from(items + ["ghost"]), st.integers(0, 2), max_size=4))
        for q in queries + ["q_unindexed"]
        if draw(st.booleans())
    }
    batch = draw(st.lists(st.tuples(st.sampled_from(items), _kw_list), min_size=1, max_size=6))
    return query_keywords, item_keywords, qrels, batch


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(), st.sampled_from(["dense", "sparse"]), st.sampled_from([None, 2]))
def test_incremental_item_reward_equals_naive_rebuild(instance, strategy, min_grade) -> None:
    query_keywords, item_keywords, qrels, batch = instance
    reward = ItemReward(query_keywords, item_keywords, qrels, k_max=30, strategy=strategy, min_grade=min_grade)
    item_ids = [item for item, _ in batch]
    candidates = [cand for _, cand in batch]
    got = reward.score_keywords(item_ids, candidates)
    for (item, cand), value in zip(batch, got, strict=True):
        expected = pure_python_marginal(query_keywords, item_keywords, qrels, item, cand, min_grade)
        assert value == pytest.approx(expected, abs=1e-9)
        assert naive_item_reward(query_keywords, item_keywords, qrels, item, cand, min_grade=min_grade) == pytest.approx(
            expected, abs=1e-9
        )
        reference = naive_reference_f1(query_keywords, item_keywords, qrels, min_grade=min_grade)
        assert naive_item_reward(query_keywords, item_keywords, qrels, item, cand, min_grade=min_grade,
                                 reference_f1=reference) == pytest.approx(expected, abs=1e-9)
    # The same batch through the text API (parsing, then the same scores).
    texts = [", ".join(c) if _norm_set(c) else "..." for c in candidates]
    via_text = reward(item_ids, texts)
    for value, text_value, cand in zip(got, via_text, candidates, strict=True):
        assert text_value == (pytest.approx(value, abs=1e-9) if _norm_set(cand) else INVALID_REWARD)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_global_mode_is_macro_f1_change(instance) -> None:
    query_keywords, item_keywords, qrels, batch = instance
    evaluated = [q for q in query_keywords if any(g > 0 for g in qrels.get(q, {}).values())]
    if not evaluated:
        with pytest.raises(ValueError, match="global"):
            ItemReward(query_keywords, item_keywords, qrels, k_max=30, mode="global")
        return
    reward = ItemReward(query_keywords, item_keywords, qrels, k_max=30, mode="global")
    for (item, cand), value in zip(batch, reward.score_keywords([b[0] for b in batch], [b[1] for b in batch]), strict=True):
        before = pure_python_f1s(query_keywords, item_keywords, qrels)
        after = pure_python_f1s(query_keywords, {**item_keywords, item: cand}, qrels)
        macro_change = sum(after[q] for q in evaluated) / len(evaluated) - sum(before[q] for q in evaluated) / len(evaluated)
        assert value == pytest.approx(macro_change, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(instances())
def test_query_reward_equals_definition(instance) -> None:
    query_keywords, item_keywords, qrels, batch = instance
    reward = QueryReward(InvertedIndex.from_keyword_sets(item_keywords), qrels, k_max=30)
    for q, kws in query_keywords.items():
        expected = pure_python_f1s({q: kws}, item_keywords, qrels)[q]
        assert reward.score_keywords([q], [kws]) == pytest.approx([expected], abs=1e-12)


def test_budget_rule_for_item_reward() -> None:
    reward = ItemReward(QUERIES, ITEMS, QRELS, k_max=2)
    assert reward(["i1", "i1"], ["a, b, c", "a, b"])[0] == INVALID_REWARD
    assert reward.score_keywords(["i1"], [["a", "A", "a."]]) == pytest.approx([0.0])  # one distinct keyword


@pytest.mark.parametrize("strategy", ["dense", "sparse"])
def test_batches_larger_than_one_chunk(strategy: str) -> None:
    reward = ItemReward(QUERIES, ITEMS, QRELS, k_max=5, strategy=strategy)
    items = ["i1", "i4", "i1", "i2", "i1", "i3", "i4"]
    texts = ["c, d", "a", "b", "e", "a, b, c", "d", "x"]
    whole = reward(items, texts)
    reward._chunk = 2  # force several chunks / split groups
    assert reward(items, texts) == pytest.approx(whole, abs=1e-12)
    for item, text, value in zip(items, texts, whole, strict=True):
        assert value == pytest.approx(pure_python_marginal(QUERIES, ITEMS, QRELS, item, text.split(", ")), abs=1e-12)
