"""Set and ranked metrics (edge cases defined in coevo.retrieval.metrics), BM25 ranking, evaluation."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coevo.retrieval.bm25 import KeywordBM25
from coevo.retrieval.evaluate import evaluate_keyword_retrieval, keyword_set_metrics
from coevo.retrieval.inverted_index import InvertedIndex
from coevo.retrieval.metrics import f1_from_counts, ranked_metrics, set_metrics, set_metrics_from_counts

QRELS = {
    "q1": {"a": 1, "b": 1, "c": 0},
    "q2": {"d": 2},
    "q3": {},  # no relevant item: excluded
    "q4": {"e": 0},  # only a grade-0 judgement: excluded
}


def test_set_metrics_hand_computed() -> None:
    m = set_metrics({"q1": {"a", "x"}, "q2": set(), "q3": {"a"}}, QRELS)
    assert (m.precision, m.recall, m.f1) == pytest.approx((0.25, 0.25, 0.25))
    assert m.n_queries == 2 and m.n_without_relevant == 2
    rows = {r.query_id: r for r in m.per_query}
    assert (rows["q1"].n_retrieved, rows["q1"].n_true_positive, rows["q1"].n_relevant) == (2, 1, 2)
    # Empty retrieved set: precision is 0 by definition, not NaN.
    assert (rows["q2"].precision, rows["q2"].recall, rows["q2"].f1) == (0.0, 0.0, 0.0)
    assert m.as_dict() == {"precision": m.precision, "recall": m.recall, "f1": m.f1}
    assert list(m.to_frame().columns)[:2] == ["query_id", "n_retrieved"]


def test_set_metrics_query_ids_min_grade_and_missing_queries() -> None:
    # q2 is absent from `retrieved`: it retrieved nothing.
    m = set_metrics({"q1": ["a", "b", "a"]}, QRELS, query_ids=["q1", "q2"])
    assert m.f1 == pytest.approx(0.5) and m.n_queries == 2
    strict = set_metrics({"q2": {"d"}}, QRELS, min_grade=2)
    assert strict.n_queries == 1 and strict.f1 == 1.0


def test_macro_f1_is_mean_of_per_query_f1() -> None:
    m = set_metrics({"q1": {"a"}, "q2": {"d", "x", "y"}}, QRELS)
    f1_q1, f1_q2 = 2 * 1 / (1 + 2), 2 * 1 / (3 + 1)
    assert m.f1 == pytest.approx((f1_q1 + f1_q2) / 2)
    assert f1_from_counts(0, 0, 0) == 0.0


def test_nothing_to_evaluate_is_an_error() -> None:
    with pytest.raises(ValueError, match="none of the 2 queries has a relevant item"):
        set_metrics({}, QRELS, query_ids=["q3", "q4"])
    with pytest.raises(ValueError, match="nothing to evaluate"):
        ranked_metrics({}, {"q": {}})
    with pytest.raises(ValueError, match="same length"):
        set_metrics_from_counts(["q"], [1, 2], [0], [1])
    with pytest.raises(ValueError, match="n_tp"):
        set_metrics_from_counts(["q"], [1], [2], [3])


def test_ranked_metrics_hand_computed() -> None:
    qrels = {"q1": {"a": 1, "b": 2, "c": 0}, "q2": {"z": 1}, "q3": {}}
    m = ranked_metrics({"q1": ["x", "a", "b", "y"], "q2": []}, qrels, ks=(1, 2, 3, 10))
    assert set(m) == {f"{n}@{k}" for n in ("mrr", "ndcg", "precision", "recall", "f1") for k in (1, 2, 3, 10)}
    half = 0.5  # q2 retrieved nothing: every metric 0 there, averaged with q1
    assert m["mrr@1"] == 0.0 and m["mrr@2"] == pytest.approx(0.5 * half) and m["mrr@10"] == pytest.approx(0.5 * half)
    idcg3 = 2 / math.log2(2) + 1 / math.log2(3)
    assert m["ndcg@3"] == pytest.approx((1 / math.log2(3) + 2 / math.log2(4)) / idcg3 * half)
    assert m["ndcg@2"] == pytest.approx((1 / math.log2(3)) / idcg3 * half)
    assert m["ndcg@1"] == 0.0
    # P@k divides by k even when the ranking is shorter than k.
    assert m["precision@10"] == pytest.approx(2 / 10 * half)
    assert m["recall@10"] == pytest.approx(1.0 * half)
    assert m["f1@10"] == pytest.approx(2 * 2 / (10 + 2) * half)
    assert m["f1@2"] == pytest.approx(2 * 1 / (2 + 2) * half)


def test_ranked_metrics_graded_ndcg_and_min_grade() -> None:
    qrels = {"q": {"a": 1, "b": 2}}
    # NDCG uses grades as gains: the better order scores 1, the swapped one less.
    assert ranked_metrics({"q": ["b", "a"]}, qrels, ks=(2,))["ndcg@2"] == pytest.approx(1.0)
    swapped = ranked_metrics({"q": ["a", "b"]}, qrels, ks=(2,))["ndcg@2"]
    assert swapped == pytest.approx((1 + 2 / math.log2(3)) / (2 + 1 / math.log2(3)))
    strict = ranked_metrics({"q": ["a", "b"]}, qrels, ks=(1, 2), min_grade=2)
    assert strict["mrr@2"] == 0.5 and strict["recall@1"] == 0.0 and strict["recall@2"] == 1.0


def test_ranked_metrics_rejects_duplicates_and_bad_ks() -> None:
    with pytest.raises(ValueError, match="'q' lists an item more than once"):
        ranked_metrics({"q": ["a", "a"]}, {"q": {"a": 1}})
    with pytest.raises(ValueError, match="positive"):
        ranked_metrics({"q": ["a"]}, {"q": {"a": 1}}, ks=(0,))


@settings(max_examples=100, deadline=None)
@given(st.permutations(list("abcdefgh")), st.dictionaries(st.sampled_from(list("abcdefgh")), st.integers(0, 3), min_size=1))
def test_ranked_metrics_bounds(ranking: list[str], grades: dict[str, int]) -> None:
    if not any(g > 0 for g in grades.values()):
        return
    m = ranked_metrics({"q": ranking}, {"q": grades}, ks=(1, 3, 8))
    assert all(0.0 <= v <= 1.0 + 1e-12 for v in m.values())
    assert m["recall@8"] == pytest.approx(1.0)  # the ranking holds every item


def test_bm25_ranks_by_score_then_item_id() -> None:
    bm25 = KeywordBM25({"i4": ["rain"], "i1": ["rain", "weather"], "i2": ["Rain"], "i3": ["snow"]})
    assert bm25.rank(["rain", "weather"]) == ["i1", "i2", "i4"]  # i2/i4 tie: by id; i3 shares nothing
    assert bm25.rank(["rain", "weather"], k=1) == ["i1"]
    assert bm25.rank(["rain"], candidates=["i3", "i4"]) == ["i4", "i3"]  # zero score last
    assert bm25.rank([]) == [] and bm25.rank(["unknown"]) == []
    with pytest.raises(KeyError, match="'zz' is not in the BM25 index"):
        bm25.rank(["rain"], candidates=["zz"])
    # Rarer keywords weigh more (IDF): snow (1 item) beats rain (3 items).
    scores = bm25.scores(["snow", "rain"])
    assert scores[bm25.item_ids.index("i3")] > scores[bm25.item_ids.index("i4")] > 0


def test_evaluate_keyword_retrieval_matches_the_definitions() -> None:
    items = {"a": ["rain", "weather"], "b": ["rain"], "c": ["snow"], "d": [], "e": ["weather", "forecast"]}
    queries = {"q1": ["rain"], "q2": ["weather", "snow"], "q3": ["nothing"], "q4": ["rain"]}
    qrels = {"q1": {"a": 1, "c": 1}, "q2": {"e": 2, "zz": 1}, "q3": {"d": 1}, "q4": {}}
    result = evaluate_keyword_retrieval(queries, items, qrels, ks=(1, 10))
    index = InvertedIndex.from_keyword_sets(items)
    expected_set = set_metrics({q: index.retrieve(k) for q, k in queries.items()}, qrels, query_ids=list(queries))
    assert {k: result[k] for k in ("precision", "recall", "f1")} == pytest.approx(expected_set.as_dict())
    bm25 = KeywordBM25(items)
    expected_ranked = ranked_metrics({q: bm25.rank(k) for q, k in queries.items()}, qrels, (1, 10))
    assert {k: v for k, v in result.items() if "@" in k} == pytest.approx(expected_ranked)
    # q2 retrieves a, c, e; "zz" is relevant but not in the corpus: it still counts in n_rel.
    rows = {r.query_id: r for r in keyword_set_metrics(queries, index, qrels).per_query}
    assert (rows["q2"].n_retrieved, rows["q2"].n_true_positive, rows["q2"].n_relevant) == (3, 1, 2)
    assert expected_set.n_queries == 3


_kw = st.lists(st.sampled_from(["a", "b", "c", "d", "e f", "G"]), max_size=4)


@settings(max_examples=150, deadline=None)
@given(
    st.dictionaries(st.sampled_from([f"i{n}" for n in range(12)]), _kw, min_size=1),
    st.dictionaries(st.sampled_from([f"q{n}" for n in range(9)]), _kw, min_size=1),
    st.data(),
    st.sampled_from([1, 2, 5, 1 << 20]),
    st.sampled_from([None, 2]),
)
def test_keyword_set_metrics_equals_python_sets_in_any_block_size(items, queries, data, mask_cells, min_grade) -> None:
    """Blocked counting (several blocks, mask or de-duplication counting) == Python sets."""
    import coevo.retrieval.evaluate as evaluate

    ids = sorted(items) + ["ghost"]  # "ghost" is judged but not indexed
    qrels = {q: data.draw(st.dictionaries(st.sampled_from(ids), st.integers(0, 2), max_size=6)) for q in queries}
    if not any(g >= (min_grade or 1) for grades in qrels.values() for g in grades.values()):
        return
    index = InvertedIndex.from_keyword_sets(items)
    expected = set_metrics({q: index.retrieve(k) for q, k in queries.items()}, qrels, list(queries), min_grade=min_grade)
    old = evaluate._MASK_CELLS
    evaluate._MASK_CELLS = mask_cells * len(items)  # queries per block: mask_cells
    try:
        got = keyword_set_metrics(queries, index, qrels, min_grade=min_grade)
    finally:
        evaluate._MASK_CELLS = old
    assert got.per_query == expected.per_query


def test_default_cutoffs_and_the_older_ks_name() -> None:
    from coevo.retrieval.metrics import DEFAULT_CUTOFFS

    assert DEFAULT_CUTOFFS == (1, 3, 5, 10, 100, 1000)
    qrels = {"q": {"a": 1}}
    m = ranked_metrics({"q": ["x", "a"]}, qrels)
    assert set(m) == {f"{n}@{k}" for n in ("mrr", "ndcg", "precision", "recall", "f1") for k in DEFAULT_CUTOFFS}
    assert ranked_metrics({"q": ["x", "a"]}, qrels, ks=(2,)) == ranked_metrics({"q": ["x", "a"]}, qrels, cutoffs=[2, 2])
    assert ranked_metrics({"q": ["x", "a"]}, qrels, (2,))["mrr@2"] == 0.5  # positional, as older callers pass it
    with pytest.raises(TypeError, match="not both"):
        ranked_metrics({"q": ["a"]}, qrels, cutoffs=(1,), ks=(1,))
    with pytest.raises(ValueError, match="positive integers"):
        ranked_metrics({"q": ["a"]}, qrels, cutoffs=("x",))


def test_per_query_values_average_to_the_means() -> None:
    from coevo.retrieval.metrics import ranked_evaluation

    qrels = {"q1": {"a": 1, "b": 2}, "q2": {"z": 1}, "q3": {"c": 0}}
    ev = ranked_evaluation({"q1": ["b", "x", "a"], "q2": ["y"]}, qrels, cutoffs=(1, 3))
    assert ev.query_ids == ("q1", "q2") and ev.n_queries == 2 and ev.n_without_relevant == 1
    assert ev.per_query["precision@1"] == {"q1": 1.0, "q2": 0.0}
    assert ev.per_query["recall@3"] == {"q1": 1.0, "q2": 0.0}
    assert ev.per_query["mrr@3"]["q1"] == 1.0
    assert ev.means() == pytest.approx(ranked_metrics({"q1": ["b", "x", "a"], "q2": ["y"]}, qrels, cutoffs=(1, 3)))
    assert list(ev.values("f1@3")) == [pytest.approx(2 * 2 / (3 + 2)), 0.0]
    with pytest.raises(KeyError, match="ndcg@5"):
        ev.values("ndcg@5")
    sets = set_metrics({"q1": {"a"}, "q2": {"z", "y"}}, qrels).per_query_values()
    assert sets["f1"] == {"q1": pytest.approx(2 / 3), "q2": pytest.approx(2 / 3)}
    assert set(sets) == {"precision", "recall", "f1"} and "q3" not in sets["recall"]


def test_keyword_evaluation_per_query_and_one_bm25_parameter_set() -> None:
    from coevo.retrieval.bm25 import BM25_B, BM25_K1

    assert (BM25_K1, BM25_B) == (0.9, 0.4)
    items = {"a": ["rain", "weather"], "b": ["rain"], "c": ["snow"]}
    queries = {"q1": ["rain"], "q2": ["snow"], "q3": ["rain"]}
    qrels = {"q1": {"a": 1}, "q2": {"c": 1}, "q3": {}}
    ev = evaluate_keyword_retrieval(queries, items, qrels, cutoffs=(1, 5), per_query=True)
    assert ev.query_ids == ("q1", "q2")
    assert ev.per_query["f1"] == {"q1": pytest.approx(2 / 3), "q2": 1.0}
    assert ev.means() == pytest.approx(evaluate_keyword_retrieval(queries, items, qrels, (1, 5)))
    assert set(ev.per_query) == {"precision", "recall", "f1"} | {f"{m}@{k}" for m in ("mrr", "ndcg", "precision", "recall", "f1") for k in (1, 5)}
    bm25 = KeywordBM25(items)
    assert (bm25._bm25.k1, bm25._bm25.b) == (0.9, 0.4)
