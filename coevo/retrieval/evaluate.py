"""Evaluate keyword retrieval: set P/R/F1 over retrieved sets plus BM25-ranked metrics.

The set part never materialises Python sets of item ids: per-query counts n_ret and n_tp
come from the posting lists and a reusable boolean mask (:func:`set_counts`, about a CPU
second for 15,000 queries over 40,000 items). Turning qrels (dicts of item ids) into
document positions (:func:`relevance_matrix`) costs more than that at 1,000 judgements per
query: it is vectorised, done once per evaluation, and can be passed in to reuse.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import scipy.sparse as sp

from coevo.retrieval.inverted_index import InvertedIndex, gather_rows
from coevo.retrieval.metrics import (
    Evaluation,
    Qrels,
    SetMetrics,
    ranked_evaluation,
    resolve_cutoffs,
    set_metrics_from_counts,
)


# Item ids mapped to positions per operator.itemgetter call.
_LOOKUP_CHUNK = 1 << 20


def relevance_matrix(
    query_ids: Sequence[str], index: InvertedIndex, qrels: Qrels, min_grade: int | None = None
) -> tuple[sp.csr_matrix, np.ndarray]:
    """(queries x indexed documents) binary relevance, and n_rel per query.

    n_rel counts every relevant item in ``qrels``, also items absent from the index (they
    can never be retrieved, and still count against recall). Within a row, documents keep
    the order of ``qrels`` (the CSR indices are not sorted).

    Vectorised: the qrels item ids are flattened (list.extend, a C loop) and mapped to
    positions by ``operator.itemgetter`` calls (C loops of dict lookups, no Python call
    per pair); grades are read (numpy.fromiter) only for queries that hold a
    non-relevant judgement; counting and the CSR layout are numpy on the flat arrays.
    """
    n_queries = len(query_ids)
    threshold = 0 if min_grade is None else min_grade
    items: list[str] = []
    counts = np.zeros(n_queries, dtype=np.int64)
    # Grades are read only for queries with a non-relevant judgement (min() is one C loop).
    mixed_rows: list[int] = []
    mixed_grades = []
    for row, q in enumerate(query_ids):
        grades = qrels.get(q)
        if grades:
            items.extend(grades)
            counts[row] = len(grades)
            values = grades.values()
            if not (min(values) >= threshold if min_grade is not None else min(values) > 0):
                mixed_rows.append(row)
                mixed_grades.append(values)
    if not items:
        empty = sp.csr_matrix((n_queries, index.n_docs), dtype=np.int8)
        return empty, np.zeros(n_queries, dtype=np.int64)
    rows = np.repeat(np.arange(n_queries, dtype=np.int64), counts)
    relevant = np.ones(len(items), dtype=bool)
    if mixed_rows:
        starts = np.cumsum(counts) - counts
        for row, values in zip(mixed_rows, mixed_grades, strict=True):
            grades_row = np.fromiter(values, dtype=np.float64, count=int(counts[row]))
            relevant[starts[row] : starts[row] + counts[row]] = (
                grades_row >= threshold if min_grade is not None else grades_row > 0
            )
    n_rel = np.bincount(rows[relevant], minlength=n_queries).astype(np.int64)
    positions = _lookup(items, index.position_lookup)
    keep = relevant & (positions >= 0)  # -1: relevant item absent from the index
    indptr = np.zeros(n_queries + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows[keep], minlength=n_queries), out=indptr[1:])
    matrix = sp.csr_matrix(
        (np.ones(int(indptr[-1]), dtype=np.int8), positions[keep].astype(np.int32), indptr),
        shape=(n_queries, index.n_docs),
    )
    return matrix, n_rel


def _lookup(ids: list[str], position_of: dict[str, int]) -> np.ndarray:
    """Positions of ids: ``operator.itemgetter`` calls (C loops of dict lookups)."""
    out = np.empty(len(ids), dtype=np.int64)
    for start in range(0, len(ids), _LOOKUP_CHUNK):  # chunks bound the temporary tuples
        chunk = ids[start : start + _LOOKUP_CHUNK]
        found = operator.itemgetter(*chunk)(position_of)
        out[start : start + len(chunk)] = np.fromiter(found if len(chunk) > 1 else (found,), dtype=np.int64, count=len(chunk))
    return out


# Queries per block in set_counts: the (block x documents) mask stays about 1 MiB.
_MASK_CELLS = 1 << 20


def set_counts(query_matrix: sp.csr_matrix, index: InvertedIndex, relevance: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray]:
    """n_ret and n_tp per query row, from keyword overlap against ``index``.

    Queries go in blocks: every posting of the block's keywords is scattered into a
    reusable (block x documents) boolean mask in one call; n_ret counts the marks per row
    (or, when the block's postings are few, the distinct marked cells), n_tp the marks on
    each row's relevant documents; the same scatter clears the mask. Linear in the
    posting-list lengths; a handful of numpy calls per block, none per keyword.
    """
    n_queries, n_docs = query_matrix.shape[0], index.n_docs
    n_ret = np.zeros(n_queries, dtype=np.int64)
    n_tp = np.zeros(n_queries, dtype=np.int64)
    if n_queries == 0 or n_docs == 0:
        return n_ret, n_tp
    q_indptr, q_indices = query_matrix.indptr, query_matrix.indices.astype(np.int64)
    r_indptr, r_indices = relevance.indptr, relevance.indices.astype(np.int64)
    k_indptr, k_indices = index.keyword_doc.indptr, index.keyword_doc.indices.astype(np.int64)
    block = max(1, min(n_queries, _MASK_CELLS // n_docs))
    mask = np.zeros(block * n_docs, dtype=bool)
    for first in range(0, n_queries, block):
        last = min(first + block, n_queries)
        size = last - first
        keywords = q_indices[q_indptr[first] : q_indptr[last]]
        per_query = np.diff(q_indptr[first : last + 1])
        per_kw = k_indptr[keywords + 1] - k_indptr[keywords]
        total = int(per_kw.sum())
        if total == 0:
            continue
        # Cell (row, document) of every posting: row * n_docs + document.
        cells = gather_rows(k_indptr, k_indices, keywords)
        row_of_kw = np.repeat(np.arange(size, dtype=np.int64), per_query)
        cells += np.repeat(row_of_kw * n_docs, per_kw)
        mask[cells] = True
        if total * 16 < size * n_docs:  # few postings: de-duplicate them rather than scan the mask
            n_ret[first:last] = np.bincount(np.unique(cells) // n_docs, minlength=size)
        else:
            n_ret[first:last] = np.count_nonzero(mask[: size * n_docs].reshape(size, n_docs), axis=1)
        rel_rows = np.repeat(np.arange(size, dtype=np.int64), np.diff(r_indptr[first : last + 1]))
        rel_cells = r_indices[r_indptr[first] : r_indptr[last]] + rel_rows * n_docs
        n_tp[first:last] = np.bincount(rel_rows[mask[rel_cells]], minlength=size)
        mask[cells] = False
    return n_ret, n_tp


def keyword_set_metrics(
    query_keywords: Mapping[str, Iterable[str]],
    item_index: InvertedIndex,
    qrels: Qrels,
    *,
    query_ids: Sequence[str] | None = None,
    min_grade: int | None = None,
    relevance: tuple[sp.csr_matrix, np.ndarray] | None = None,
) -> SetMetrics:
    """Set P/R/F1 of every query's retrieved set (items sharing >= 1 keyword).

    ``relevance``: the result of :func:`relevance_matrix` for the same queries and the same
    item order, to reuse across evaluations (qrels do not change between CoGR phases, and
    turning them into positions is most of an evaluation's cost).
    """
    queries = list(query_keywords) if query_ids is None else list(query_ids)
    qm = item_index.query_matrix([query_keywords.get(q, ()) for q in queries])
    if relevance is None:
        relevance = relevance_matrix(queries, item_index, qrels, min_grade)
    elif relevance[0].shape != (len(queries), item_index.n_docs):
        raise ValueError(
            f"relevance matrix has shape {relevance[0].shape}, expected {(len(queries), item_index.n_docs)}"
        )
    relevance, n_rel = relevance
    n_ret, n_tp = set_counts(qm, item_index, relevance)
    return set_metrics_from_counts(queries, n_ret, n_tp, n_rel)


def keyword_retrieval_evaluation(
    query_keywords: Mapping[str, Sequence[str]],
    item_keywords: Mapping[str, Sequence[str]],
    qrels: Qrels,
    cutoffs: Sequence[int] | None = None,
    *,
    ks: Sequence[int] | None = None,
    query_ids: Sequence[str] | None = None,
    min_grade: int | None = None,
    k1: float | None = None,
    b: float | None = None,
) -> Evaluation:
    """CoGR's evaluation with per-query values: "precision", "recall", "f1" of the
    retrieved sets, plus "mrr@k", "ndcg@k", "precision@k", "recall@k", "f1@k" of the
    retrieved set ranked by BM25 over the items' keywords (ties by item id), at each
    cut-off (default :data:`coevo.retrieval.metrics.DEFAULT_CUTOFFS`; ``ks`` is the older
    name of ``cutoffs``).

    ``query_ids`` defaults to the queries in ``query_keywords``; queries without a
    relevant item are excluded (see :mod:`coevo.retrieval.metrics`). ``k1``/``b``: the
    ranking BM25's parameters (default the project's one set, k1=0.9, b=0.4).
    """
    from coevo.retrieval.bm25 import BM25_B, BM25_K1, KeywordBM25

    cut = resolve_cutoffs(cutoffs, ks)
    queries = list(query_keywords) if query_ids is None else list(query_ids)
    item_index = InvertedIndex.from_keyword_sets(item_keywords)
    # The qrels are converted once; the set metrics and the choice of ranked queries share it.
    relevance = relevance_matrix(queries, item_index, qrels, min_grade)
    set_part = keyword_set_metrics(
        query_keywords, item_index, qrels, query_ids=queries, min_grade=min_grade, relevance=relevance
    )
    bm25 = KeywordBM25(item_keywords, k1=BM25_K1 if k1 is None else k1, b=BM25_B if b is None else b)
    k_max = max(cut)
    # Only queries that count in the average need a ranking.
    rankings = {
        q: bm25.rank(query_keywords.get(q, ()), candidates=None, k=k_max)
        for q, n_rel in zip(queries, relevance[1].tolist(), strict=True)
        if n_rel > 0
    }
    ranked = ranked_evaluation(rankings, qrels, cut, query_ids=queries, min_grade=min_grade)
    return Evaluation({**set_part.per_query_values(), **ranked.per_query}, ranked.query_ids, ranked.n_without_relevant)


def evaluate_keyword_retrieval(
    query_keywords: Mapping[str, Sequence[str]],
    item_keywords: Mapping[str, Sequence[str]],
    qrels: Qrels,
    ks: Sequence[int] | None = None,
    *,
    cutoffs: Sequence[int] | None = None,
    query_ids: Sequence[str] | None = None,
    min_grade: int | None = None,
    per_query: bool = False,
    k1: float | None = None,
    b: float | None = None,
) -> dict[str, float] | Evaluation:
    """The means of :func:`keyword_retrieval_evaluation` (metric -> macro mean), or, with
    ``per_query=True``, the :class:`~coevo.retrieval.metrics.Evaluation` itself (per-query
    values, the query ids and their means)."""
    if ks is not None and cutoffs is not None:
        raise TypeError("give cutoffs or ks (its older name), not both")
    evaluation = keyword_retrieval_evaluation(
        query_keywords, item_keywords, qrels, cutoffs if cutoffs is not None else ks,
        query_ids=query_ids, min_grade=min_grade, k1=k1, b=b,
    )
    return evaluation if per_query else evaluation.means()
