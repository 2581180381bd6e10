"""Retrieval metrics: set P/R/F1 (CoGR's retrieved sets) and ranked MRR/NDCG/P/R/F1@k.

Conventions (the same for every method, so numbers are comparable across runs):

- ``Qrels`` maps query_id -> {item_id: grade}. An item is *relevant* when grade > 0, or
  grade >= ``min_grade`` when one is given (WANDS: ``min_grade=2`` counts only Exact).
- Queries with no relevant item are **excluded** from every macro average (their recall is
  undefined) and from the per-query values; :class:`SetMetrics` and :class:`Evaluation`
  report how many were excluded. Evaluating a set of queries none of which has a relevant
  item is an error.
- A query missing from ``retrieved`` / ``rankings`` retrieved nothing.
- Empty retrieved set: precision = recall = F1 = 0 (precision is defined as 0, not NaN).
- Per-query F1 = 2 n_tp / (n_ret + n_rel) (the harmonic mean of P and R, 0 when n_tp = 0);
  macro F1 is the mean of per-query F1, not the F1 of macro P and R.
- Ranked metrics read a ranking as given: ties in score must already be broken by the
  ranker (:class:`coevo.retrieval.bm25.KeywordBM25` breaks them by item id). A ranking
  that lists an item twice is an error.

Ranked metrics at a cut-off k (``DEFAULT_CUTOFFS`` = 1, 3, 5, 10, 100, 1000; every function
takes ``cutoffs=`` so a params list can drive it). With hits@k = relevant items among the
first k ranked and n_rel = relevant items judged for the query:

- ``precision@k`` = hits@k / k (k, not the ranking's length, even when fewer than k are
  ranked; trec_eval's ``P_k``);
- ``recall@k`` = hits@k / n_rel (relevant items absent from the corpus still count in n_rel;
  trec_eval's ``recall_k``);
- ``f1@k`` = 2 hits@k / (k + n_rel), the harmonic mean of P@k and R@k;
- ``mrr@k`` = 1 / rank of the first relevant item if it lies within k, else 0 (reciprocal
  rank of the top-k list; trec_eval's ``recip_rank`` on the run cut at k). The macro mean
  over queries is the MRR;
- ``ndcg@k`` = DCG@k / IDCG@k with **linear graded gains** (gain = grade for every
  grade > 0, whatever ``min_grade``; *not* the exponential 2^grade - 1 of Burges et al.),
  discount 1 / log2(rank + 1), and the ideal ordering of all the query's positive grades,
  relevant items outside the corpus included: trec_eval's ``ndcg_cut_k`` (ir_measures
  ``nDCG@k`` with the pytrec_eval provider), checked to 1e-9 in
  ``tests/test_metrics_oracle.py``.

Per-query values (what confidence intervals resample) come from :func:`ranked_evaluation`
and :meth:`SetMetrics.per_query_values`: ``{metric: {query_id: value}}``; the means that
:func:`ranked_metrics` returns are their plain averages.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

Qrels = Mapping[str, Mapping[str, int]]
# metric name -> {query_id: value}; the queries that count in the macro average only.
PerQuery = dict[str, dict[str, float]]

DEFAULT_CUTOFFS: tuple[int, ...] = (1, 3, 5, 10, 100, 1000)
# Kept for callers written before DEFAULT_CUTOFFS; the same cut-offs.
DEFAULT_KS: tuple[int, ...] = DEFAULT_CUTOFFS
RANKED_METRIC_NAMES: tuple[str, ...] = ("mrr", "ndcg", "precision", "recall", "f1")
SET_METRIC_NAMES: tuple[str, ...] = ("precision", "recall", "f1")


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


def metric_key(name: str, k: int) -> str:
    """``metric_key("ndcg", 10) == "ndcg@10"``: the one spelling of a ranked metric."""
    return f"{name}@{int(k)}"


def check_cutoffs(cutoffs: Iterable[int]) -> tuple[int, ...]:
    """Sorted, de-duplicated positive integer cut-offs (an error names bad input)."""
    try:
        values = sorted({int(k) for k in cutoffs})
    except (TypeError, ValueError):
        raise ValueError(f"cut-offs must be positive integers, got {cutoffs!r}") from None
    if not values or values[0] < 1:
        raise ValueError(f"cut-offs must be positive integers, got {values}")
    return tuple(values)


def mean_values(per_query: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Macro means of per-query values (metric -> mean over its queries)."""
    return {m: float(np.mean(np.fromiter(v.values(), dtype=np.float64, count=len(v)))) if v else 0.0
            for m, v in per_query.items()}


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

    def per_query_values(self) -> PerQuery:
        """``{"precision"|"recall"|"f1": {query_id: value}}`` over the evaluated queries
        (those with a relevant item), the values the macro means average."""
        rows = [r for r in self.per_query if r.n_relevant > 0]
        return {name: {r.query_id: float(getattr(r, name)) for r in rows} for name in SET_METRIC_NAMES}

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([r.__dict__ for r in self.per_query])


@dataclass(frozen=True)
class Evaluation:
    """Per-query metric values of one system on one query set, and their means.

    ``per_query`` maps a metric name (``"ndcg@10"``, ``"f1"``, ...) to {query_id: value};
    every metric covers the same ``query_ids`` (the queries with a relevant item).
    """

    per_query: PerQuery
    query_ids: tuple[str, ...]
    n_without_relevant: int = 0

    @property
    def n_queries(self) -> int:
        return len(self.query_ids)

    def means(self) -> dict[str, float]:
        return mean_values(self.per_query)

    def values(self, metric: str) -> np.ndarray:
        """One metric's values in ``query_ids`` order (a KeyError names known metrics)."""
        try:
            column = self.per_query[metric]
        except KeyError:
            raise KeyError(f"metric {metric!r} was not evaluated (have: {', '.join(self.per_query)})") from None
        return np.fromiter((column[q] for q in self.query_ids), dtype=np.float64, count=len(self.query_ids))

    def merged(self, other: Evaluation) -> Evaluation:
        """This evaluation with ``other``'s metrics added (same queries required)."""
        if set(self.query_ids) != set(other.query_ids):
            raise ValueError("cannot merge evaluations of different query sets")
        return Evaluation({**self.per_query, **other.per_query}, self.query_ids, self.n_without_relevant)


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
    excluded from the averages and counted in ``n_without_relevant``. Per-query values:
    :meth:`SetMetrics.per_query_values`.
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


def resolve_cutoffs(cutoffs: Sequence[int] | None, ks: Sequence[int] | None = None) -> tuple[int, ...]:
    """``cutoffs`` (or ``ks``, its older name; not both), default :data:`DEFAULT_CUTOFFS`, checked."""
    if cutoffs is not None and ks is not None:
        raise TypeError("give cutoffs or ks (its older name), not both")
    chosen = cutoffs if cutoffs is not None else ks if ks is not None else DEFAULT_CUTOFFS
    return check_cutoffs(chosen)


def ranked_evaluation(
    rankings: Mapping[str, Sequence[str]],
    qrels: Qrels,
    cutoffs: Sequence[int] | None = None,
    *,
    ks: Sequence[int] | None = None,
    query_ids: Iterable[str] | None = None,
    min_grade: int | None = None,
) -> Evaluation:
    """Per-query MRR/NDCG/P/R/F1 at each cut-off (keys like ``"ndcg@10"``); see the module notes.

    ``cutoffs`` defaults to :data:`DEFAULT_CUTOFFS` (``ks`` is its older name). ``query_ids``
    defaults to every query in ``qrels``; queries without a relevant item are left out.
    """
    cut = resolve_cutoffs(cutoffs, ks)
    k_max = cut[-1]
    k_idx = np.asarray(cut) - 1
    discounts = 1.0 / np.log2(np.arange(2, k_max + 2))
    queries = _evaluation_queries(qrels, query_ids)
    evaluated: list[str] = []
    rows: dict[str, list[np.ndarray]] = {m: [] for m in RANKED_METRIC_NAMES}
    k_arr = np.asarray(cut, dtype=np.float64)
    for q in queries:
        grades = qrels.get(q, {})
        # One C loop over the grades (queries can have thousands of judgements).
        grade_values = np.fromiter(grades.values(), dtype=np.float64, count=len(grades))
        n_rel = int(np.count_nonzero(grade_values >= min_grade if min_grade is not None else grade_values > 0))
        if n_rel == 0:
            continue
        evaluated.append(q)
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
        hits_k = np.cumsum(hit)[k_idx].astype(np.float64)
        dcg_k = np.cumsum(gain * discounts)[k_idx]
        ideal = np.sort(grade_values[grade_values > 0])[::-1][:k_max]
        idcg_cum = np.cumsum(ideal * discounts[: len(ideal)])
        idcg_k = idcg_cum[np.minimum(k_idx, len(idcg_cum) - 1)]
        first = int(np.argmax(hit)) + 1 if hit.any() else 0
        rows["mrr"].append(np.where((first > 0) & (first <= k_arr), 1.0 / max(first, 1), 0.0))
        rows["ndcg"].append(np.divide(dcg_k, idcg_k, out=np.zeros_like(dcg_k), where=idcg_k > 0))
        rows["precision"].append(hits_k / k_arr)
        rows["recall"].append(hits_k / n_rel)
        rows["f1"].append(2.0 * hits_k / (k_arr + n_rel))
    if not evaluated:
        raise ValueError(f"none of the {len(queries)} queries has a relevant item: nothing to evaluate")
    per_query: PerQuery = {}
    for name in RANKED_METRIC_NAMES:
        table = np.vstack(rows[name])  # (queries x cut-offs)
        for col, k in enumerate(cut):
            per_query[metric_key(name, k)] = dict(zip(evaluated, table[:, col].tolist(), strict=True))
    return Evaluation(per_query, tuple(evaluated), len(queries) - len(evaluated))


def ranked_metrics(
    rankings: Mapping[str, Sequence[str]],
    qrels: Qrels,
    cutoffs: Sequence[int] | None = None,
    *,
    ks: Sequence[int] | None = None,
    query_ids: Iterable[str] | None = None,
    min_grade: int | None = None,
) -> dict[str, float]:
    """Macro MRR/NDCG/P/R/F1 at each cut-off, keys like ``"ndcg@10"``: the means of
    :func:`ranked_evaluation` (which also gives the per-query values)."""
    return ranked_evaluation(rankings, qrels, cutoffs, ks=ks, query_ids=query_ids, min_grade=min_grade).means()
