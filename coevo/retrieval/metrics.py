"""Retrieval metrics: set P/R/F1 (CoGR's retrieved sets) and ranked MRR/NDCG/P/R/F1@k.

Conventions (the same for every method, so numbers are comparable across runs):

- ``Qrels`` maps query_id -> {item_id: grade}. An item is *relevant* when grade > 0, or
  grade >= ``min_grade`` when one is given (WANDS: ``min_grade=2`` counts only Exact).
- Queries with no relevant item are **excluded** from every macro average (their recall is
  undefined); :class:`SetMetrics` reports how many were excluded. Evaluating a set of
  queries none of which has a relevant item is an error.
- A query missing from ``retrieved`` / ``rankings`` retrieved nothing.
- Empty retrieved set: precision = recall = F1 = 0 (precision is defined as 0, not NaN).
- Per-query F1 = 2 n_tp / (n_ret + n_rel) (the harmonic mean of P and R, 0 when n_tp = 0);
  macro F1 is the mean of per-query F1, not the F1 of macro P and R.
- Ranked metrics read a ranking as given: ties in score must already be broken by the
  ranker (:class:`coevo.retrieval.bm25.KeywordBM25` breaks them by item id). A ranking
  that lists an item twice is an error.
- P@k = hits@k / k (k, not the ranking's length, even when fewer than k are ranked);
  R@k = hits@k / n_rel; F1@k = 2 hits@k / (k + n_rel); MRR@k = 1 / rank of the first
  relevant item within k, else 0; NDCG@k uses linear graded gains (gain = grade for every
  grade > 0, whatever ``min_grade``), discount 1/log2(rank + 1), and the ideal ordering of
  all the query's positive grades (trec_eval's convention).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

Qrels = Mapping[str, Mapping[str, int]]

DEFAULT_KS: tuple[int, ...] = (10, 100, 1000)
RANKED_METRIC_NAMES: tuple[str, ...] = ("mrr", "ndcg", "precision", "recall", "f1")


def is_relevant(grade: int, min_grade: int | None = None) -> bool:
    return grade >= min_grade if min_grade is not None else grade > 0


def relevant_sets(qrels: Qrels, min_grade: int | None = None) -> dict[str, set[str]]:
    """query_id -> set of relevant item ids (possibly empty)."""
    return {q: {i for i, g in items.items() if is_relevant(g, min_grade)} for q, items in qrels.items()}


def f1_from_counts(n_ret: float, n_tp: float, n_rel: float) -> float:
    """F1 = 2 n_tp / (n_ret + n_rel), 0 when both are 0."""
    den = n_ret + n_rel
    return 2.0 * n_tp / den if den > 0 else 0.0


def f1_array(n_ret: np.ndarray, n_tp: np.ndarray, n_rel: np.ndarray) -> np.ndarray:
    """Vectorised :func:`f1_from_counts`."""
    den = np.asarray(n_ret, dtype=np.float64) + n_rel
    out = np.zeros(den.shape, dtype=np.float64)
    np.divide(2.0 * np.asarray(n_tp, dtype=np.float64), den, out=out, where=den > 0)
    return out


@dataclass(frozen=True)
class QuerySetRow:
    query_id: str
    n_retrieved: int
    n_relevant: int
    n_true_positive: int
    precision: float
    recall: float
    f1: float


@dataclass(frozen=True)
class SetMetrics:
    """Macro set metrics over the queries that have at least one relevant item."""

    precision: float
    recall: float
    f1: float
    n_queries: int
    n_without_relevant: int
    per_query: tuple[QuerySetRow, ...]

    def as_dict(self) -> dict[str, float]:
        return {"precision": self.precision, "recall": self.recall, "f1": self.f1}

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([r.__dict__ for r in self.per_query])


def set_metrics_from_counts(
    query_ids: Sequence[str], n_ret: Sequence[int], n_tp: Sequence[int], n_rel: Sequence[int]
) -> SetMetrics:
    """Set metrics from per-query counts (the fast path used by indexes and rewards)."""
    n_ret_a = np.asarray(n_ret, dtype=np.int64)
    n_tp_a = np.asarray(n_tp, dtype=np.int64)
    n_rel_a = np.asarray(n_rel, dtype=np.int64)
    if not (len(query_ids) == len(n_ret_a) == len(n_tp_a) == len(n_rel_a)):
        raise ValueError("query_ids, n_ret, n_tp and n_rel must have the same length")
    if np.any(n_tp_a > np.minimum(n_ret_a, n_rel_a)) or np.any(n_tp_a < 0):
        raise ValueError("n_tp must lie between 0 and min(n_ret, n_rel) for every query")
    precision = np.zeros(len(n_ret_a))
    np.divide(n_tp_a, n_ret_a, out=precision, where=n_ret_a > 0)
    recall = np.zeros(len(n_ret_a))
    np.divide(n_tp_a, n_rel_a, out=recall, where=n_rel_a > 0)
    f1 = f1_array(n_ret_a, n_tp_a, n_rel_a)
    evaluated = n_rel_a > 0
    n_eval = int(evaluated.sum())
    if n_eval == 0:
        raise ValueError(f"none of the {len(query_ids)} queries has a relevant item: nothing to evaluate")
    rows = tuple(
        QuerySetRow(q, int(r), int(rel), int(tp), float(p), float(rc), float(f))
        for q, r, rel, tp, p, rc, f in zip(query_ids, n_ret_a, n_rel_a, n_tp_a, precision, recall, f1, strict=True)
    )
    return SetMetrics(
        precision=float(precision[evaluated].mean()),
        recall=float(recall[evaluated].mean()),
        f1=float(f1[evaluated].mean()),
        n_queries=n_eval,
        n_without_relevant=len(query_ids) - n_eval,
        per_query=rows,
    )


def _evaluation_queries(qrels: Qrels, query_ids: Iterable[str] | None) -> list[str]:
    return list(qrels) if query_ids is None else list(dict.fromkeys(query_ids))


def set_metrics(
    retrieved: Mapping[str, Collection[str]],
    qrels: Qrels,
    query_ids: Iterable[str] | None = None,
    *,
    min_grade: int | None = None,
) -> SetMetrics:
    """Macro P/R/F1 of retrieved *sets* (order ignored, duplicates count once).

    ``query_ids`` defaults to every query in ``qrels``; queries without a relevant item are
    excluded from the averages and counted in ``n_without_relevant``.
    """
    queries = _evaluation_queries(qrels, query_ids)
    rel = relevant_sets({q: qrels.get(q, {}) for q in queries}, min_grade)
    n_ret, n_tp, n_rel = [], [], []
    for q in queries:
        got = retrieved.get(q, ())
        got = got if isinstance(got, (set, frozenset)) else set(got)
        n_ret.append(len(got))
        n_rel.append(len(rel[q]))
        n_tp.append(len(got & rel[q]))
    return set_metrics_from_counts(queries, n_ret, n_tp, n_rel)


def ranked_metrics(
    rankings: Mapping[str, Sequence[str]],
    qrels: Qrels,
    ks: Sequence[int] = DEFAULT_KS,
    *,
    query_ids: Iterable[str] | None = None,
    min_grade: int | None = None,
) -> dict[str, float]:
    """Macro MRR/NDCG/P/R/F1 at each k, keys like ``"ndcg@10"``; see the module notes."""
    ks = sorted({int(k) for k in ks})
    if not ks or ks[0] < 1:
        raise ValueError(f"ks must be positive integers, got {ks}")
    k_max = ks[-1]
    k_arr = np.asarray(ks)
    discounts = 1.0 / np.log2(np.arange(2, k_max + 2))
    sums = {f"{m}@{k}": 0.0 for m in RANKED_METRIC_NAMES for k in ks}
    n_eval = 0
    queries = _evaluation_queries(qrels, query_ids)
    for q in queries:
        grades = qrels.get(q, {})
        # One C loop over the grades (queries can have thousands of judgements).
        grade_values = np.fromiter(grades.values(), dtype=np.float64, count=len(grades))
        n_rel = int(np.count_nonzero(grade_values >= min_grade if min_grade is not None else grade_values > 0))
        if n_rel == 0:
            continue
        n_eval += 1
        ranking = list(rankings.get(q, ()))
        if len(set(ranking)) != len(ranking):
            raise ValueError(f"ranking of query {q!r} lists an item more than once")
        top = ranking[:k_max]
        hit = np.zeros(k_max, dtype=bool)
        gain = np.zeros(k_max)
        for pos, item in enumerate(top):
            g = grades.get(item, 0)
            if g > 0:
                gain[pos] = g
                hit[pos] = is_relevant(g, min_grade)
        hits_cum = np.cumsum(hit)
        dcg_cum = np.cumsum(gain * discounts)
        ideal = np.sort(grade_values[grade_values > 0])[::-1][:k_max]
        idcg_cum = np.cumsum(ideal * discounts[: len(ideal)])
        first = int(np.argmax(hit)) + 1 if hit.any() else math.inf
        hits_k = hits_cum[k_arr - 1]
        for k, h in zip(ks, hits_k, strict=True):
            sums[f"mrr@{k}"] += 1.0 / first if first <= k else 0.0
            idcg = idcg_cum[min(k, len(idcg_cum)) - 1]
            sums[f"ndcg@{k}"] += dcg_cum[k - 1] / idcg if idcg > 0 else 0.0
            sums[f"precision@{k}"] += h / k
            sums[f"recall@{k}"] += h / n_rel
            sums[f"f1@{k}"] += 2.0 * h / (k + n_rel)
    if n_eval == 0:
        raise ValueError(f"none of the {len(queries)} queries has a relevant item: nothing to evaluate")
    return {name: float(total / n_eval) for name, total in sums.items()}
