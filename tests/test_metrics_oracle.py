"""Oracle: our ranked and set metrics against trec_eval (ir_measures, pytrec_eval backend).

Random graded runs (seeded): qrels with grades 0-2 (and relevant items no run can
retrieve), tie-free rankings (strictly decreasing scores, so trec_eval's score sort keeps
our order), rankings shorter than k, an empty ranking. Every per-query value must agree to
1e-9. Mappings (see coevo.retrieval.metrics):

- ndcg@k      = ir_measures ``nDCG@k``  (trec_eval ndcg_cut_k: linear gains = grades)
- precision@k = ``P@k``, with min_grade g: ``P(rel=g)@k``
- recall@k    = ``R@k`` (relevance level 1); with min_grade g, ``R@k`` on qrels whose grades
  below g are set to 0 (the provider has no ``rel`` for R)
- mrr@k       = ``RR`` on the run cut at k (the provider has no RR@k); ``RR(rel=g)``
- f1@k        = the harmonic mean of the oracle's P@k and R@k
- set P/R/F1  = ``SetP`` / ``SetR`` / ``SetF`` of the whole retrieved list
"""

from __future__ import annotations

import numpy as np
import pytest

import ir_measures  # test dependencies (pyproject's `test` extra): the oracle must run, never skip
import pytrec_eval  # noqa: F401 - the backend ir_measures compares against
from ir_measures import RR, R, P, SetF, SetP, SetR, nDCG

from coevo.retrieval.metrics import DEFAULT_CUTOFFS, ranked_evaluation, ranked_metrics, set_metrics  # noqa: E402

TOL = 1e-9


def _random_case(seed: int, n_queries: int = 40, n_docs: int = 1200):
    rng = np.random.default_rng(seed)
    docs = [f"d{i:04d}" for i in range(n_docs)]
    qrels: dict[str, dict[str, int]] = {}
    rankings: dict[str, list[str]] = {}
    for qi in range(n_queries):
        q = f"q{qi:03d}"
        judged = rng.choice(n_docs, size=int(rng.integers(1, 25)), replace=False)
        grades = {docs[j]: int(rng.integers(0, 3)) for j in judged}
        grades[docs[int(judged[0])]] = int(rng.integers(1, 3))  # at least one relevant
        if qi % 7 == 0:
            grades[f"ghost{qi}"] = 2  # relevant, outside the corpus: counts in n_rel and IDCG
        qrels[q] = grades
        # Lengths from empty to past the largest cut-off; judged items mixed in so hits happen.
        length = [0, 1, 2, 4, 9, 60, 150, 1100][qi % 8]
        judged_docs = [d for d in grades if d in set(docs)]
        chosen = [d for d in judged_docs if rng.random() < 0.6]
        others = [docs[j] for j in rng.permutation(n_docs) if docs[j] not in grades][: max(0, length - len(chosen))]
        ranking = chosen + others
        rng.shuffle(ranking)
        ranking = ranking[:length]
        rankings[q] = ranking
    return qrels, rankings


def _trec_run(rankings: dict[str, list[str]], k: int | None = None) -> dict[str, dict[str, float]]:
    """Tie-free scores: the document at position p scores len - p."""
    out = {}
    for q, ranking in rankings.items():
        ranking = ranking[:k] if k is not None else ranking
        if ranking:
            out[q] = {d: float(len(ranking) - p) for p, d in enumerate(ranking)}
    return out


def _oracle(measures, qrels, run) -> dict[tuple[str, str], float]:
    return {(str(m.measure), m.query_id): float(m.value) for m in ir_measures.pytrec_eval.iter_calc(measures, qrels, run)}


def _value(oracle: dict, measure, q: str) -> float:
    # pytrec_eval leaves out queries with an empty run: every metric is 0 there.
    return oracle.get((str(measure), q), 0.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("min_grade", [None, 2])
def test_ranked_metrics_match_trec_eval(seed: int, min_grade: int | None) -> None:
    qrels, rankings = _random_case(seed)
    cutoffs = DEFAULT_CUTOFFS + (2, 7)
    ours = ranked_evaluation(rankings, qrels, cutoffs, min_grade=min_grade)
    level = min_grade or 1
    run = _trec_run(rankings)
    measures = [nDCG @ k for k in cutoffs] + [P(rel=level) @ k for k in cutoffs]
    oracle = _oracle(measures, qrels, run)
    # recall at level g: grades below g do not count as relevant
    qrels_level = {q: {d: (g if g >= level else 0) for d, g in grades.items()} for q, grades in qrels.items()}
    oracle_r = _oracle([R @ k for k in cutoffs], qrels_level, run)
    expected_queries = [q for q, grades in qrels.items() if any(g >= level for g in grades.values())]
    assert list(ours.query_ids) == expected_queries and ours.n_queries > 20
    assert any(len(rankings[q]) == 0 for q in ours.query_ids)  # an empty ranking is covered
    compared = 0
    for k in cutoffs:
        oracle_rr = _oracle([RR(rel=level)], qrels, _trec_run(rankings, k))
        for q in ours.query_ids:
            p = _value(oracle, P(rel=level) @ k, q)
            r = _value(oracle_r, R @ k, q)
            expected = {
                "ndcg": _value(oracle, nDCG @ k, q),
                "precision": p,
                "recall": r,
                "mrr": _value(oracle_rr, RR(rel=level), q),
                "f1": 2 * p * r / (p + r) if p + r > 0 else 0.0,
            }
            for name, value in expected.items():
                got = ours.per_query[f"{name}@{k}"][q]
                assert got == pytest.approx(value, abs=TOL), (name, k, q, len(rankings[q]))
                compared += 1
    assert compared == len(cutoffs) * ours.n_queries * 5
    # The means are the plain averages of those per-query values.
    means = ranked_metrics(rankings, qrels, cutoffs=cutoffs, min_grade=min_grade)
    for k in cutoffs:
        nd = np.mean([_value(oracle, nDCG @ k, q) for q in ours.query_ids])
        assert means[f"ndcg@{k}"] == pytest.approx(nd, abs=TOL)


def test_graded_ndcg_is_not_exponential_gain() -> None:
    """Documented choice: linear gains (trec_eval), which differ from 2^g - 1 on graded qrels."""
    qrels = {"q": {"a": 1, "b": 2}}
    ours = ranked_metrics({"q": ["a", "b"]}, qrels, cutoffs=(2,))["ndcg@2"]
    linear = _oracle([nDCG @ 2], qrels, _trec_run({"q": ["a", "b"]}))[("nDCG@2", "q")]
    exponential = _oracle([nDCG(gains={1: 1, 2: 3}) @ 2], qrels, _trec_run({"q": ["a", "b"]}))
    assert ours == pytest.approx(linear, abs=TOL)
    assert abs(ours - next(iter(exponential.values()))) > 1e-3


@pytest.mark.parametrize("seed", [3, 4])
def test_set_metrics_match_trec_eval(seed: int) -> None:
    qrels, rankings = _random_case(seed, n_queries=30, n_docs=300)
    ours = set_metrics({q: set(r) for q, r in rankings.items()}, qrels).per_query_values()
    oracle = _oracle([SetP, SetR, SetF], qrels, _trec_run(rankings))
    assert len(ours["f1"]) == len(qrels)
    for name, measure in (("precision", SetP), ("recall", SetR), ("f1", SetF)):
        for q, value in ours[name].items():
            assert value == pytest.approx(_value(oracle, measure, q), abs=TOL), (name, q)
