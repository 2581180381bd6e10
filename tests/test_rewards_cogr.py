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
@given(instances(), st.lists(st.booleans(), min_size=6, max_size=6))
def test_global_mode_rewards_the_joint_index(instance, invalid) -> None:
    """mode="global": rollout j of every batch item is swapped in together; each gets the macro
    train F1 of that joint index (rebuilt from scratch here); an invalid rollout gets -1 and its
    item keeps its reference set."""
    query_keywords, item_keywords, qrels, batch = instance
    evaluated = [q for q in query_keywords if any(g > 0 for g in qrels.get(q, {}).values())]
    if not evaluated:
        with pytest.raises(ValueError, match="global"):
            ItemReward(query_keywords, item_keywords, qrels, k_max=30, mode="global")
        return
    reward = ItemReward(query_keywords, item_keywords, qrels, k_max=30, mode="global")
    sets = [None if bad else cand for (_, cand), bad in zip(batch, invalid)]
    got = reward.score_keywords([item for item, _ in batch], sets)
    joint, seen = [], {}
    for item, _ in batch:
        joint.append(seen.get(item, 0))
        seen[item] = joint[-1] + 1
    for row, ((item, _), cand) in enumerate(zip(batch, sets, strict=True)):
        if cand is None:
            assert got[row] == INVALID_REWARD
            continue
        swapped = {i: c for (i, _), c, j in zip(batch, sets, joint) if j == joint[row] and c is not None}
        f1 = pure_python_f1s(query_keywords, {**item_keywords, **swapped}, qrels)
        assert got[row] == pytest.approx(sum(f1[q] for q in evaluated) / len(evaluated), abs=1e-9)


def _advantages(rewards: list[float]) -> list[float]:
    """GRPO's group-normalised advantages (r - mean) / std of one group."""
    mean = sum(rewards) / len(rewards)
    std = (sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1)) ** 0.5
    return [(r - mean) / std if std else 0.0 for r in rewards]


def test_global_reward_entangles_credit_and_is_not_a_rescaled_marginal() -> None:
    """Item A's rollout 0 finds its query, rollout 1 finds nothing; item B's rollout 1 finds
    two of its queries. Marginal credit rewards A's rollout 0; the global ablation credits A
    with what B sampled at the same position, so A's group is ranked the other way round and
    its GRPO advantages change sign: no positive affine map of the marginal reward does that."""
    queries = {"q1": ["x"], "q2": ["y"], "q3": ["v"]}
    items = {"A": ["unused"], "B": ["unused too"]}
    qrels = {"q1": {"A": 1}, "q2": {"B": 1}, "q3": {"B": 1}}
    batch_items = ["A", "A", "B", "B"]
    batch = ["x", "z", "w", "y, v"]
    marginal = ItemReward(queries, items, qrels, k_max=5)(batch_items, batch)
    glob = ItemReward(queries, items, qrels, k_max=5, mode="global")(batch_items, batch)
    assert marginal == pytest.approx([1.0, 0.0, 0.0, 2.0])
    assert glob == pytest.approx([1 / 3, 2 / 3, 1 / 3, 2 / 3])  # joint 0: q1 found; joint 1: q2 and q3
    assert _advantages(marginal[:2]) == pytest.approx([-a for a in _advantages(glob[:2])])
    # Entangled: A's rewards move when only B's samples change; the marginal ones do not.
    other = ["x", "z", "y, v", "w"]
    assert ItemReward(queries, items, qrels, k_max=5)(batch_items, other)[:2] == marginal[:2]
    assert ItemReward(queries, items, qrels, k_max=5, mode="global")(batch_items, other)[:2] == pytest.approx([1.0, 0.0])
    # With three rollouts per item no affine map at all fits global = a * marginal + b.
    three_items, three = ["A", "A", "A", "B", "B", "B"], ["x", "z", "x", "w", "y, v", "y, v"]
    m = ItemReward(queries, items, qrels, k_max=5)(three_items, three)[:3]
    g = ItemReward(queries, items, qrels, k_max=5, mode="global")(three_items, three)[:3]
    import numpy as np

    design = np.column_stack([m, np.ones(3)])
    _, residual, *_ = np.linalg.lstsq(design, np.asarray(g), rcond=None)
    assert residual.size and residual[0] > 1e-3


def test_truncated_and_non_list_completions_get_minus_one() -> None:
    """Cut by the token limit, prose, or a chat preamble: -1 on both sides; plain lists score."""
    query = QueryReward(InvertedIndex.from_keyword_sets(ITEMS), QRELS, k_max=3)
    item = ItemReward(QUERIES, ITEMS, QRELS, k_max=5)
    texts = ["a, c", "Sure! Here is my explanation", "Sure! Here are the keywords: a, c",
             "a, c. These keywords describe what the user wants", "Keywords: a, c", "1. a\n2. c"]
    assert query(["q1"] * 6, texts) == pytest.approx([0.8, -1, -1, -1, 0.8, 0.8])
    assert query(["q1", "q1"], ["a, c", "a, c"], truncated=[False, True]) == pytest.approx([0.8, INVALID_REWARD])
    assert item(["i1", "i1"], ["c, d", "c, d"], truncated=[True, False]) == pytest.approx([INVALID_REWARD, -2 / 3])
    assert item(["i1"], ["Certainly, c, d"]) == [INVALID_REWARD]
    with pytest.raises(ValueError, match="1 truncation flags but 2 completions"):
        query(["q1", "q1"], ["a", "b"], truncated=[True])


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
