"""CoGR rewards: query-side F1 and item-side counterfactual (marginal) F1 change.

Both are batched: one call scores a whole GRPO batch (several groups of completions).

Budget and format rule (both sides): a completion gets -1.0 (:data:`INVALID_REWARD`) when

- it is not a keyword list: :func:`parse_keywords` in strict mode refuses it (prose, a chat
  preamble such as "Sure! Here is ...", an explanation after the list, nothing usable);
- it has more than ``k_max`` distinct keywords after normalisation;
- it was cut by the token limit (``truncated``: the last sampled token is not an end of
  sequence). A truncated list is never parsed: its last keyword may be cut in half, and
  its length says nothing about the budget. The caller passes the flags (CoGR reads them
  from the completion token ids TRL hands to reward functions); for the K_max rule to
  be reachable at all, the token budget must hold k_max + 1 keywords.

Query side (:class:`QueryReward`): the item index is frozen; the reward of a sampled
keyword set S_q is F1(q) = 2 n_tp / (n_ret + n_rel) of the items it retrieves (every item
sharing >= 1 keyword). A query with no relevant item scores 0.0.

Item side (:class:`ItemReward`): the query index (keyword -> queries) is frozen, and so is
every other item's keyword set. Replacing item i's reference set S_ref(i) by a candidate
S_i changes only the queries in Q_delta = Q_cand xor Q_ref, where Q(S) are the queries
sharing a keyword with S: a query in Q_cand - Q_ref gains item i (n_ret + 1, n_tp + rel),
a query in Q_ref - Q_cand loses it. The marginal reward is

    sum over q in Q_delta of F1_cand(q) - F1_ref(q),

computed from cached per-query counts (n_ret, n_tp, n_rel) and the per-query F1 change of
gaining / losing a relevant / non-relevant item, precomputed once. Per candidate the work
is one posting-list lookup in the query index and a weighted count over Q_cand; nothing
is rebuilt. Implementation: with w(q) = gain(q) for q outside Q_ref and w(q) = -loss(q)
inside, the reward is sum_{Q_cand} w + sum_{Q_ref} loss, which equals the Q_delta sum
(queries in both sets cancel) without ever materialising the symmetric difference.
Q_ref(i) is marked from the item's reference posting lists in the same scatter as a
GRPO group's candidates (dense path), or read from an LRU cache (sparse path).

``mode="global"`` (ablation: "optimising global F1 entangles the items' contributions").
Interpretation: the rollouts of one GRPO batch (one reward call: TRL scores a process's
whole generation batch at once) are grouped by item; the j-th rollout of
every item in the batch is swapped in *together* (joint index j: each batch item i holds
its j-th sampled set S_i^j, every other item its reference set), and each rollout j of
every item gets the same reward, the macro F1 over the train queries with a relevant item
(the queries of the query index) under joint index j. So an item's rollout is credited
with what all the other items sampled at the same position did: credit is entangled, not
an affine rescaling of the marginal reward (which GRPO's group normalisation would cancel).
A rollout that breaks the budget or format rule gets -1 and its item keeps its reference
set in the joint index. Items with fewer rollouts than others keep their reference set in
the later joint indexes. Computed from the same cached counts: per joint index, the
per-query count changes of all swapped items are added and only F1 is recomputed.
"""

from __future__ import annotations

import contextlib
import functools
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from coevo.models.prompts import completion_text
from coevo.retrieval.evaluate import keyword_set_metrics, relevance_matrix, set_counts
from coevo.retrieval.inverted_index import InvertedIndex, gather_rows
from coevo.retrieval.keywords import normalize_keyword, parse_keywords
from coevo.retrieval.metrics import Qrels, f1_array, is_relevant

INVALID_REWARD = -1.0
# Upper bound on the (candidates x queries) scratch array used to de-duplicate postings.
_SCRATCH_CELLS = 1 << 22
# Score densely when a candidate's postings exceed 1/_DENSE_FACTOR of the queries.
_DENSE_FACTOR = 64


@functools.cache
def _blas_controller() -> Any:
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()  # inspects the loaded libraries once (milliseconds)


@contextlib.contextmanager
def _single_thread_blas() -> Iterator[None]:
    """Hold BLAS to one thread around the reward's small matrix-vector products.

    A threaded OpenBLAS call on a busy machine costs tens of times the CPU of the
    single-threaded product; the limit is local (a few microseconds to set and undo per
    batch), never a process-wide environment variable.
    """
    with _blas_controller().limit(limits=1, user_api="blas"):
        yield


def parse_within_budget(completion: Any, k_max: int, truncated: bool = False) -> tuple[str, ...] | None:
    """Normalised keywords of a completion, or None (reward -1) when it was cut by the token
    limit, is not a keyword list (strict :func:`parse_keywords`) or exceeds the budget."""
    if truncated:
        return None
    parsed = parse_keywords(completion_text(completion), strict=True)
    if not parsed.ok or len(parsed.keywords) > k_max:
        return None
    return parsed.keywords


def _parse_batch(completions: Sequence[Any], k_max: int, truncated: Sequence[bool] | None) -> list[tuple[str, ...] | None]:
    if truncated is None:
        truncated = [False] * len(completions)
    elif len(truncated) != len(completions):
        raise ValueError(f"{len(truncated)} truncation flags but {len(completions)} completions")
    return [parse_within_budget(c, k_max, bool(t)) for c, t in zip(completions, truncated, strict=True)]


def distinct_normalized(keywords: Iterable[str]) -> list[str]:
    """Normalised, non-empty, de-duplicated keywords, order kept."""
    if isinstance(keywords, str):
        raise TypeError("a keyword set must be a collection of strings, not one string")
    return list(dict.fromkeys(k for k in map(normalize_keyword, keywords) if k))


class QueryReward:
    """F1 of a sampled query keyword set against the frozen item index.

    Call with ``(query_ids, completions)``; returns one float per completion.
    """

    def __init__(self, item_index: InvertedIndex, qrels: Qrels, k_max: int, *, min_grade: int | None = None):
        if k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {k_max}")
        self.item_index = item_index
        self.k_max = k_max
        # Relevant item positions per query, from one vectorised qrels conversion.
        query_ids = list(qrels)
        relevance, n_rel = relevance_matrix(query_ids, item_index, qrels, min_grade)
        self._query_row = {q: row for row, q in enumerate(query_ids)}
        self._rel_indptr = relevance.indptr
        self._rel_indices = relevance.indices
        self._n_rel_of = n_rel.tolist()
        self._mask = np.zeros(item_index.n_docs, dtype=bool)

    def f1(self, query_id: str, keywords: Iterable[str], *, normalized: bool = False) -> float:
        """F1 of one keyword set (no budget rule)."""
        row = self._query_row.get(query_id)
        n_rel = 0 if row is None else self._n_rel_of[row]
        if n_rel == 0:
            return 0.0
        index = self.item_index
        postings_of = index.posting_lists
        lists = [postings_of[k] for k in index.keyword_ids(keywords, normalized=normalized).tolist()]
        if not lists:
            return 0.0
        # Mark the retrieved items in a reusable mask (posting lists as views, no copies).
        mask = self._mask
        for postings in lists:
            mask[postings] = True
        n_ret = int(np.count_nonzero(mask))
        n_tp = int(np.count_nonzero(mask[self._rel_indices[self._rel_indptr[row] : self._rel_indptr[row + 1]]]))
        for postings in lists:
            mask[postings] = False
        return 2.0 * n_tp / (n_ret + n_rel)

    def score_keywords(
        self, query_ids: Sequence[str], keyword_sets: Sequence[Sequence[str] | None], *, normalized: bool = False
    ) -> list[float]:
        """Rewards of already parsed sets (None = unparseable); the budget rule applies.

        ``normalized=True`` promises the sets are normalised and de-duplicated already
        (as :func:`parse_keywords` returns them), skipping that work.
        """
        if len(query_ids) != len(keyword_sets):
            raise ValueError(f"{len(query_ids)} query ids but {len(keyword_sets)} keyword sets")
        out = []
        for q, kws in zip(query_ids, keyword_sets, strict=True):
            if kws is None:
                out.append(INVALID_REWARD)
                continue
            if not normalized:
                kws = distinct_normalized(kws)
            out.append(INVALID_REWARD if len(kws) > self.k_max else self.f1(q, kws, normalized=True))
        return out

    def __call__(self, query_ids: Sequence[str], completions: Sequence[Any],
                 truncated: Sequence[bool] | None = None) -> list[float]:
        """Rewards of raw completions; ``truncated[i]`` True: cut by the token limit (-1)."""
        if len(query_ids) != len(completions):
            raise ValueError(f"{len(query_ids)} query ids but {len(completions)} completions")
        return self.score_keywords(query_ids, _parse_batch(completions, self.k_max, truncated), normalized=True)


class ItemReward:
    """Counterfactual reward of a sampled item keyword set against the frozen query index.

    Call with ``(item_ids, completions)``; returns one float per completion. ``item_ids``
    must be items of ``item_keywords`` (the current reference sets); an item may repeat
    (a GRPO group) and the batch may mix items. ``mode="global"`` scores the batch jointly
    (the module docstring): pass a whole GRPO batch in one call, in TRL's order.
    """

    def __init__(
        self,
        query_keywords: Mapping[str, Sequence[str]],
        item_keywords: Mapping[str, Sequence[str]],
        qrels: Qrels,
        k_max: int,
        mode: Literal["marginal", "global"] = "marginal",
        *,
        min_grade: int | None = None,
        ref_cache_size: int = 4096,
        strategy: Literal["auto", "dense", "sparse"] = "auto",
    ):
        if mode not in ("marginal", "global"):
            raise ValueError(f"mode must be 'marginal' or 'global', got {mode!r}")
        if k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {k_max}")
        if strategy not in ("auto", "dense", "sparse"):
            raise ValueError(f"strategy must be 'auto', 'dense' or 'sparse', got {strategy!r}")
        self.k_max = k_max
        self.mode = mode
        self.strategy = strategy
        self.query_index = InvertedIndex.from_keyword_sets(query_keywords)
        self.item_index = InvertedIndex.from_keyword_sets(item_keywords)
        queries = self.query_index.doc_ids
        relevance, n_rel = relevance_matrix(queries, self.item_index, qrels, min_grade)
        qm = self.item_index.query_matrix([self.query_index.keywords_of(q) for q in queries], normalized=True)
        n_ret, n_tp = set_counts(qm, self.item_index, relevance)
        self.n_ret, self.n_tp, self.n_rel = n_ret, n_tp, n_rel
        self.f1_ref = f1_array(n_ret, n_tp, n_rel)
        # F1 change of each query when it gains / loses a non-relevant / relevant item.
        # (Entries for impossible moves, e.g. losing from n_ret = 0, are never read.)
        lose_ret = np.maximum(n_ret - 1, 0)
        self._gain = np.stack([f1_array(n_ret + 1, n_tp, n_rel), f1_array(n_ret + 1, n_tp + 1, n_rel)]) - self.f1_ref
        self._loss = np.stack([f1_array(lose_ret, n_tp, n_rel), f1_array(lose_ret, np.maximum(n_tp - 1, 0), n_rel)]) - self.f1_ref
        # item -> queries it is relevant to (positions in the query index)
        self._item_rel = relevance.T.tocsr()
        self._item_rel.sort_indices()
        self.n_evaluated = int(np.count_nonzero(n_rel > 0))
        if mode == "global" and self.n_evaluated == 0:
            raise ValueError("mode='global' needs at least one query with a relevant item")
        # Item keyword id -> query keyword id (-1: no query uses that keyword).
        qpos = {k: i for i, k in enumerate(self.query_index.vocabulary)}
        self._query_kw_pos = qpos
        self._item_kw_to_query_kw = np.fromiter(
            (qpos.get(k, -1) for k in self.item_index.vocabulary), dtype=np.int64, count=len(self.item_index.vocabulary)
        )
        self._ref_cache: OrderedDict[int, tuple[np.ndarray, float]] = OrderedDict()
        self._ref_cache_size = ref_cache_size
        n_q = max(self.query_index.n_docs, 1)
        self._chunk = max(1, min(512, _SCRATCH_CELLS // n_q))
        self._dedup = np.zeros(self._chunk * n_q, dtype=np.int64)
        self._mark_ref = np.zeros(self._chunk * n_q, dtype=bool)
        self._mark_rel = np.zeros(self._chunk * n_q, dtype=bool)
        self._rel_mark = np.zeros(n_q, dtype=bool)
        self._dense_buffer: np.ndarray | None = None
        self._kq_indptr = self.query_index.keyword_doc.indptr
        self._gain0 = np.ascontiguousarray(self._gain[0])
        self._gain1 = np.ascontiguousarray(self._gain[1])
        self._neg_loss1 = -self._loss[1]
        self._kq_indices64 = self.query_index.keyword_doc.indices.astype(np.int64)
        # Per item, its reference keywords as query-keyword ids (item keywords no query uses dropped).
        dk = self.item_index.doc_keyword
        mapped = self._item_kw_to_query_kw[dk.indices]
        kept = np.concatenate([[0], np.cumsum(mapped >= 0)])
        self._ref_kw_indptr = kept[dk.indptr]
        self._ref_kw_indices = mapped[mapped >= 0]
        self._neg_loss0_minus_gain0 = -self._loss[0] - self._gain[0]

    # -- reference sets -----------------------------------------------------------------
    def _reference(self, item_pos: int) -> tuple[np.ndarray, np.ndarray, float]:
        """(Q_ref(i) as query positions, queries i is relevant to, sum of losses over Q_ref).

        Q_ref(i) and its loss sum are cached (LRU): a GRPO group, and every later group for
        the same item in this phase, reuses them.
        """
        rel = self._item_rel.indices[self._item_rel.indptr[item_pos] : self._item_rel.indptr[item_pos + 1]]
        cached = self._ref_cache.get(item_pos)
        if cached is not None:
            self._ref_cache.move_to_end(item_pos)
            return cached[0], rel, cached[1]
        dk = self.item_index.doc_keyword
        kw = self._item_kw_to_query_kw[dk.indices[dk.indptr[item_pos] : dk.indptr[item_pos + 1]]]
        q_ref = self.query_index.retrieve_positions(kw[kw >= 0]).astype(np.int32)
        mark = self._rel_mark
        mark[rel] = True
        is_rel = mark[q_ref]
        mark[rel] = False
        loss_sum = float(self._loss[is_rel.astype(np.int64), q_ref].sum())
        self._ref_cache[item_pos] = (q_ref, loss_sum)
        if len(self._ref_cache) > self._ref_cache_size:
            self._ref_cache.popitem(last=False)
        return q_ref, rel, loss_sum

    def reference_queries(self, item_id: str) -> tuple[str, ...]:
        """Q_ref(i): the queries that retrieve item i under its reference keywords."""
        q_ref, _, _ = self._reference(self.item_index.doc_position(item_id))
        ids = self.query_index.doc_ids
        return tuple(ids[p] for p in q_ref)

    # -- scoring ------------------------------------------------------------------------
    def _marginal(self, item_pos: np.ndarray, kw_ids: list[list[int]]) -> np.ndarray:
        """Marginal rewards for candidates (item position, query-keyword ids), batched.

        Two exact strategies, chosen by density: when candidates' postings cover a good
        share of all queries, each GRPO group is scored densely (a 0/1 mask over the
        queries dotted with the item's weight vector w); otherwise sparsely (only the de-duplicated
        (candidate, query) pairs are touched).
        """
        indptr = self._kq_indptr
        n_q = self.query_index.n_docs
        out = np.empty(len(item_pos), dtype=np.float64)
        if self.strategy == "auto":
            sample = kw_ids[:16]
            mean_len = sum(int(indptr[k + 1] - indptr[k]) for ids in sample for k in ids) / max(len(sample), 1)
            dense = mean_len * _DENSE_FACTOR >= n_q
        else:
            dense = self.strategy == "dense"
        if dense:
            order = np.argsort(item_pos, kind="stable")
            bounds = np.flatnonzero(np.diff(item_pos[order])) + 1
            for group in np.split(order, bounds):
                for start in range(0, len(group), self._chunk):  # bounds the (rows x queries) matrix
                    rows = group[start : start + self._chunk]
                    out[rows] = self._marginal_dense_group(int(item_pos[rows[0]]), [kw_ids[r] for r in rows])
            return out
        arrays = [np.asarray(ids, dtype=np.int64) for ids in kw_ids]
        for start in range(0, len(item_pos), self._chunk):
            stop = min(start + self._chunk, len(item_pos))
            out[start:stop] = self._marginal_chunk(item_pos[start:stop], arrays[start:stop])
        return out

    def _marginal_dense_group(self, item_pos: int, kw_ids: list[list[int]]) -> np.ndarray:
        """All candidates of one item: reward_r = (cand_r - ref) . w over all queries.

        Rows 0..G-1 of a 0/1 (queries) matrix mark each candidate's Q_cand, row G marks
        Q_ref; w(q) is the gain of adding item i to q outside Q_ref and minus the loss of
        removing it inside. Then cand_r . w = sum of w over Q_cand and ref . w = -(sum of
        losses over Q_ref), so one matrix-vector product gives every reward. All rows
        are filled by a single scatter of the concatenated posting lists (duplicates
        collapse) and cleared by the same scatter, so no (rows x queries) memset.
        """
        n_q = self.query_index.n_docs
        n_rows = len(kw_ids) + 1
        ref_kw = self._ref_kw_indices[self._ref_kw_indptr[item_pos] : self._ref_kw_indptr[item_pos + 1]].tolist()
        flat: list[int] = []
        lengths: list[int] = []
        for ids in kw_ids:
            flat.extend(ids)
            lengths.append(len(ids))
        flat.extend(ref_kw)
        lengths.append(len(ref_kw))
        kw = np.array(flat, dtype=np.int64)
        indptr = self._kq_indptr
        per_kw = indptr[kw + 1] - indptr[kw]
        # Flat cell (row, query) of every posting: row * n_q + query.
        cells = gather_rows(indptr, self._kq_indices64, kw)
        cells += np.repeat(np.repeat(np.arange(0, n_rows * n_q, n_q, dtype=np.int64), lengths), per_kw)
        if self._dense_buffer is None or self._dense_buffer.shape[0] < n_rows:
            self._dense_buffer = np.zeros((max(n_rows, 9), n_q))
        marks = self._dense_buffer[:n_rows]  # contiguous rows; all zero between calls
        flat_marks = marks.reshape(-1)
        flat_marks[cells] = 1.0
        try:
            ref = marks[-1]
            w = self._gain0 + ref * self._neg_loss0_minus_gain0
            rel = self._item_rel.indices[self._item_rel.indptr[item_pos] : self._item_rel.indptr[item_pos + 1]]
            if len(rel):
                w[rel] = np.where(ref[rel] > 0, self._neg_loss1[rel], self._gain1[rel])
            # BLAS gemv: the caller holds BLAS to one thread (see _single_thread_blas).
            scores = marks @ w
        finally:
            flat_marks[cells] = 0.0
        return scores[:-1] - scores[-1]

    def _marginal_chunk(self, item_pos: np.ndarray, kw_ids: list[np.ndarray]) -> np.ndarray:
        n, n_q = len(item_pos), self.query_index.n_docs
        slots, slot_of_row = np.unique(item_pos, return_inverse=True)
        # Mark Q_ref and the relevant queries of each distinct item in this chunk.
        const = np.empty(len(slots))
        ref_keys, rel_keys = [], []
        for s, pos in enumerate(slots):
            q_ref, rel, loss_sum = self._reference(int(pos))
            const[s] = loss_sum
            ref_keys.append(q_ref + s * n_q)
            rel_keys.append(rel.astype(np.int64) + s * n_q)
        ref_keys_a = np.concatenate(ref_keys)
        rel_keys_a = np.concatenate(rel_keys)
        self._mark_ref[ref_keys_a] = True
        self._mark_rel[rel_keys_a] = True
        try:
            # All candidates' postings in one gather: (row, query) pairs, possibly repeated.
            lengths = np.fromiter((len(k) for k in kw_ids), dtype=np.int64, count=n)
            flat_kw = np.concatenate(kw_ids) if lengths.sum() else np.empty(0, dtype=np.int64)
            kd = self.query_index.keyword_doc
            per_kw = kd.indptr[flat_kw + 1] - kd.indptr[flat_kw]
            rows = np.repeat(np.repeat(np.arange(n, dtype=np.int64), lengths), per_kw)
            queries = gather_rows(kd.indptr, kd.indices, flat_kw).astype(np.int64)
            # De-duplicate (row, query) without sorting: one write wins per key.
            keys = rows * n_q + queries
            order = np.arange(len(keys), dtype=np.int64)
            self._dedup[keys] = order
            first = self._dedup[keys] == order
            u_rows, u_queries = rows[first], queries[first]
            mark_keys = slot_of_row[u_rows] * n_q + u_queries
            rel_flag = self._mark_rel[mark_keys].astype(np.int64)
            w = np.where(
                self._mark_ref[mark_keys], -self._loss[rel_flag, u_queries], self._gain[rel_flag, u_queries]
            )
            return np.bincount(u_rows, weights=w, minlength=n) + const[slot_of_row]
        finally:
            self._mark_ref[ref_keys_a] = False
            self._mark_rel[rel_keys_a] = False

    def score_keywords(
        self, item_ids: Sequence[str], keyword_sets: Sequence[Sequence[str] | None], *, normalized: bool = False
    ) -> list[float]:
        """Rewards of already parsed sets (None = unparseable); the budget rule applies.

        ``normalized=True`` promises the sets are normalised and de-duplicated already.
        """
        if len(item_ids) != len(keyword_sets):
            raise ValueError(f"{len(item_ids)} item ids but {len(keyword_sets)} keyword sets")
        positions = np.fromiter((self.item_index.doc_position(i) for i in item_ids), dtype=np.int64, count=len(item_ids))
        rewards = np.full(len(item_ids), INVALID_REWARD)
        valid: list[int] = []
        kw_ids: list[list[int]] = []
        position_of = self._query_kw_pos.get
        for row, kws in enumerate(keyword_sets):
            if kws is None:
                continue
            if not normalized:
                kws = distinct_normalized(kws)
            if len(kws) > self.k_max:
                continue
            valid.append(row)
            kw_ids.append([k for k in map(position_of, kws) if k is not None])
        if self.mode == "global":
            rewards[valid] = self._global_joint(positions, valid, kw_ids)
        elif valid:
            with _single_thread_blas():
                rewards[valid] = self._marginal(positions[valid], kw_ids)
        return rewards.tolist()

    def global_f1(self) -> float:
        """Macro F1 over the evaluated train queries under the reference sets."""
        return float(self.f1_ref[self.n_rel > 0].sum()) / self.n_evaluated

    def _global_joint(self, positions: np.ndarray, valid: list[int], kw_ids: list[list[int]]) -> np.ndarray:
        """``mode="global"``: each valid row's reward is the global train F1 of its joint index.

        Row r is its item's j-th rollout in the batch (j = how many rows of the same item come
        before it); joint index j swaps in the j-th valid set of every item at once.
        """
        seen: dict[int, int] = {}
        joint = np.empty(len(positions), dtype=np.int64)
        for row, pos in enumerate(positions.tolist()):
            joint[row] = seen.get(pos, 0)
            seen[pos] = joint[row] + 1
        out = np.empty(len(valid), dtype=np.float64)
        if not valid:
            return out
        n_q = self.query_index.n_docs
        evaluated = self.n_rel > 0
        rel_mark = self._rel_mark
        valid_joint = joint[valid]
        for j in np.unique(valid_joint).tolist():
            d_ret = np.zeros(n_q, dtype=np.int64)
            d_tp = np.zeros(n_q, dtype=np.int64)
            members = np.flatnonzero(valid_joint == j)
            for k in members.tolist():
                item_pos = int(positions[valid[k]])
                q_ref, rel, _ = self._reference(item_pos)
                q_cand = self.query_index.retrieve_positions(np.asarray(kw_ids[k], dtype=np.int64))
                gained = np.setdiff1d(q_cand, q_ref, assume_unique=True)
                lost = np.setdiff1d(q_ref, q_cand, assume_unique=True)
                rel_mark[rel] = True
                d_ret[gained] += 1
                d_tp[gained] += rel_mark[gained]
                d_ret[lost] -= 1
                d_tp[lost] -= rel_mark[lost]
                rel_mark[rel] = False
            f1 = f1_array(self.n_ret + d_ret, self.n_tp + d_tp, self.n_rel)
            out[members] = float(f1[evaluated].sum()) / self.n_evaluated
        return out

    def __call__(self, item_ids: Sequence[str], completions: Sequence[Any],
                 truncated: Sequence[bool] | None = None) -> list[float]:
        """Rewards of raw completions; ``truncated[i]`` True: cut by the token limit (-1)."""
        if len(item_ids) != len(completions):
            raise ValueError(f"{len(item_ids)} item ids but {len(completions)} completions")
        return self.score_keywords(item_ids, _parse_batch(completions, self.k_max, truncated), normalized=True)


def naive_item_reward(
    query_keywords: Mapping[str, Sequence[str]],
    item_keywords: Mapping[str, Sequence[str]],
    qrels: Qrels,
    item_id: str,
    candidate: Sequence[str],
    *,
    min_grade: int | None = None,
    reference_f1: Sequence[float] | np.ndarray | None = None,
) -> float:
    """Reference implementation of the marginal reward: rebuild the item index with the
    candidate set and re-evaluate every query (what :class:`ItemReward` avoids).

    ``reference_f1``: the per-query F1 under the unchanged ``item_keywords``, in
    ``query_keywords`` order (:func:`naive_reference_f1`); computed here when None. A caller
    scoring many candidates against one reference computes it once (bench/rewards.py).
    """
    if item_id not in item_keywords:
        raise KeyError(f"item {item_id!r} is not in item_keywords")
    queries = list(query_keywords)
    if not _has_relevant(queries, qrels, min_grade):
        return 0.0
    if reference_f1 is None:
        reference_f1 = naive_reference_f1(query_keywords, item_keywords, qrels, min_grade=min_grade)
    before = np.asarray(reference_f1, dtype=np.float64)
    if before.shape != (len(queries),):
        raise ValueError(f"reference_f1 has shape {before.shape}; expected one F1 per query ({len(queries)})")
    after = naive_reference_f1(query_keywords, {**item_keywords, item_id: list(candidate)}, qrels, min_grade=min_grade)
    return float(np.sum(after - before))


def naive_reference_f1(
    query_keywords: Mapping[str, Sequence[str]],
    item_keywords: Mapping[str, Sequence[str]],
    qrels: Qrels,
    *,
    min_grade: int | None = None,
) -> np.ndarray:
    """Per-query set F1 (``query_keywords`` order) against an item index built from scratch.

    A query without a relevant item scores 0.0 (all of them when none has one).
    """
    if not _has_relevant(list(query_keywords), qrels, min_grade):
        return np.zeros(len(query_keywords), dtype=np.float64)
    index = InvertedIndex.from_keyword_sets(item_keywords)
    rows = keyword_set_metrics(query_keywords, index, qrels, query_ids=list(query_keywords), min_grade=min_grade).per_query
    return np.asarray([r.f1 for r in rows], dtype=np.float64)


def _has_relevant(queries: Sequence[str], qrels: Qrels, min_grade: int | None) -> bool:
    return any(is_relevant(g, min_grade) for q in queries for g in qrels.get(q, {}).values())
