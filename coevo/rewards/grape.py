"""GRAPE rewards: the corpus rank of the relevant item under a frozen retriever.

rank_reward(rank, N) = 1 - 2 (rank - 1) / (N - 1): 1 when the relevant item is first,
-1 when it is last, linear in between. The rank is exact over all N items (see
``coevo.retrieval.dense``), so the reward cannot be gamed by raising every score at once,
which the similarity reward (the ablation, ``SimilarityReward``) allows.

``reciprocal_rank`` (an ablation, not the paper's) rewards 1 / rank instead: the linear rank
reward saturates on a small corpus (rank 10 of 199 still earns 0.91, against 1 for the top),
so it barely separates top-1 from top-10; 1 / rank halves the reward from the first to the
second place, which is what Recall@1 and NDCG see.

Several relevant items: the reward is the MEAN of the per-item rank rewards. A rewrite
that brings one of two relevant items to the top and leaves the other in the middle
earns 0.5, so the rewriter is pushed towards queries that retrieve all of them (the max
would ignore the others; the min would give no signal until the worst one moves).

Malformed rewrites (empty, or missing the rewrite after a reasoning section, or a
reasoning section over its token cap) get the minimum reward, -1.

What the retriever embeds depends on the query mode (:func:`search_embeddings`): ``replace``
searches the rewrite alone (the paper's); ``expand`` searches the query followed by the
rewrite (query2doc-style), so the rewriter can add words but never lose the user's; ``mix``
searches the query's unit embedding plus ``mix_weight`` times the rewrite's (a Rocchio-style
vector mix: the query stays the larger part, so a wrong guess moves the ranking less than
the concatenated text of ``expand``, where a long rewrite outweighs a short query).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from coevo.models.prompts import completion_text
from coevo.retrieval.dense import DenseIndex, FrozenRetriever, l2_normalize

MIN_REWARD = -1.0
MAX_REWARD = 1.0
REWRITE_MARKER = "Rewrite:"
REASONING_MARKER = "Reasoning:"
_LABEL = re.compile(r"^\s*(?:rewritten query|rewrite|query|search query)\s*[:\-]\s*", re.IGNORECASE)
_MARKER = re.compile(r"rewrite\s*:", re.IGNORECASE)
QUERY_MODES = ("replace", "expand", "mix")


def searched_text(query: str, rewrite: str | None, mode: str) -> str:
    """The text the frozen retriever embeds for one query: the rewrite alone (``replace``; a
    malformed rewrite searches the empty string), or the query followed by the rewrite
    (``expand``; a malformed rewrite leaves the query as typed). ``mix`` shows the same words
    as ``expand``, but embeds query and rewrite apart (:func:`search_embeddings`)."""
    if mode == "replace":
        return rewrite or ""
    if mode in ("expand", "mix"):
        return f"{query} {rewrite}" if rewrite else query
    raise ValueError(f"grape.query_mode: unknown mode {mode!r} (expected one of {', '.join(QUERY_MODES)})")


def search_embeddings(embed: Callable[[list[str]], np.ndarray], queries: Sequence[str],
                      rewrites: Sequence[str | None], mode: str, mix_weight: float = 0.0) -> np.ndarray:
    """What the frozen retriever searches for each (query, rewrite), as embeddings: ``embed`` of
    :func:`searched_text` in ``replace`` and ``expand`` mode; in ``mix`` mode the query's unit
    embedding plus ``mix_weight`` times the rewrite's (a malformed rewrite: the query alone)."""
    if len(queries) != len(rewrites):
        raise ValueError(f"{len(queries)} queries for {len(rewrites)} rewrites")
    if mode != "mix":
        return embed([searched_text(q, r, mode) for q, r in zip(queries, rewrites)])
    if not mix_weight > 0:
        raise ValueError(f"grape.mix_weight must be > 0 in mix mode, got {mix_weight!r}")
    embs = l2_normalize(embed(list(queries)))
    valid = [i for i, r in enumerate(rewrites) if r]
    if valid:
        embs[valid] += mix_weight * l2_normalize(embed([rewrites[i] for i in valid]))
    return embs


def _checked_ranks(reward: str, rank: Any, n: int) -> np.ndarray:
    """``rank`` as a float array, after checking it is a 1-based rank among ``n`` >= 1 items."""
    if n < 1:
        raise ValueError(f"{reward}: corpus size must be >= 1, got {n}")
    rank_arr = np.asarray(rank, dtype=np.float64)
    if np.any(rank_arr < 1) or np.any(rank_arr > n):
        raise ValueError(f"{reward}: ranks must lie in 1..{n}")
    return rank_arr


def rank_reward(rank: Any, n: int) -> Any:
    """1 - 2 (rank - 1) / (n - 1) for 1-based ``rank`` among ``n`` items (array or scalar).

    A one-item corpus always ranks its item first: reward 1.
    """
    rank_arr = _checked_ranks("rank_reward", rank, n)
    out = np.ones_like(rank_arr) if n == 1 else 1.0 - 2.0 * (rank_arr - 1.0) / (n - 1.0)
    return float(out) if out.ndim == 0 else out


def reciprocal_rank_reward(rank: Any, n: int) -> Any:
    """1 / ``rank`` for 1-based ``rank`` among ``n`` items (array or scalar): 1 at the top, 1 / n last."""
    out = 1.0 / _checked_ranks("reciprocal_rank_reward", rank, n)
    return float(out) if out.ndim == 0 else out


@dataclass
class RewriteParser:
    """Extract the rewritten query from a completion; None when the completion is malformed.

    Without reasoning the first non-empty line is the rewrite (a leading label such as
    ``Rewritten query:`` and wrapping quotes are dropped). With reasoning the completion
    must read ``<reasoning> Rewrite: <query>``; the reasoning may be at most
    ``max_reasoning_tokens`` tokens (``count_tokens``; whitespace words by default).
    """

    reasoning: bool = False
    max_reasoning_tokens: int = 32
    count_tokens: Callable[[str], int] | None = None

    def __call__(self, completion: Any) -> str | None:
        text = completion_text(completion).strip()
        if self.reasoning:
            matches = list(_MARKER.finditer(text))
            if not matches:
                return None
            last = matches[-1]
            thought = text[: last.start()].strip()
            if thought.lower().startswith(REASONING_MARKER.lower()):
                thought = thought[len(REASONING_MARKER):].strip()
            count = self.count_tokens or (lambda s: len(s.split()))
            if count(thought) > self.max_reasoning_tokens:
                return None
            text = text[last.end():]
        for line in text.splitlines():
            line = _LABEL.sub("", line).strip().strip("\"'`").strip()
            if line:
                return line
        return None


@dataclass
class _RetrievalReward:
    """Shared machinery: parse, embed valid rewrites in one batch, score each relevant pair."""

    retriever: FrozenRetriever
    qrels: Mapping[str, Sequence[str]]
    parser: RewriteParser = field(default_factory=RewriteParser)
    # expand or mix mode: each query's text, searched with its rewrite (None: replace mode)
    query_texts: Mapping[str, str] | None = None
    query_mode: str = "replace"
    mix_weight: float = 0.0
    last_stats: dict[str, float] = field(default_factory=dict, init=False)

    __name__ = "grape_reward"  # TRL names reward columns after the callable

    def __post_init__(self) -> None:
        index = self._index()
        self._rows: dict[str, np.ndarray] = {}
        for query_id, item_ids in self.qrels.items():
            if not item_ids:
                raise ValueError(f"qrels: query {query_id!r} has no relevant item")
            self._rows[str(query_id)] = index.rows([str(i) for i in item_ids])
        if self.query_mode not in QUERY_MODES:
            raise ValueError(f"grape.query_mode: unknown mode {self.query_mode!r} "
                             f"(expected one of {', '.join(QUERY_MODES)})")
        if (self.query_texts is None) != (self.query_mode == "replace"):
            raise ValueError(f"{self.query_mode} mode: query texts are needed with expand and mix, "
                             "and only with them")
        if self.query_texts is not None:
            missing = sorted(set(map(str, self.qrels)) - set(map(str, self.query_texts)))
            if missing:
                raise KeyError(f"{self.query_mode} mode: no query text for query id {missing[0]!r}")

    def _index(self) -> DenseIndex:
        if self.retriever.index is None:
            raise RuntimeError("the retriever has no corpus index: build or attach it before making a reward")
        return self.retriever.index

    def _pair_values(self, index: DenseIndex, query_embs: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """One value per (query embedding, relevant item row) pair, from the corpus ``index``."""
        raise NotImplementedError

    def __call__(self, query_ids: Sequence[str], completions: Sequence[Any], **_: Any) -> list[float]:
        if len(query_ids) != len(completions):
            raise ValueError(f"{len(query_ids)} query ids for {len(completions)} completions")
        rewards = np.full(len(completions), MIN_REWARD, dtype=np.float64)
        rewrites = [self.parser(c) for c in completions]
        valid = [i for i, r in enumerate(rewrites) if r]
        for i in valid:
            if str(query_ids[i]) not in self._rows:
                raise KeyError(f"query id {query_ids[i]!r} has no qrels")
        if valid:
            texts = self.query_texts or {}
            embs = search_embeddings(self.retriever.embed_queries, [texts.get(str(query_ids[i]), "") for i in valid],
                                     [rewrites[i] for i in valid], self.query_mode, self.mix_weight)
            # One (query, relevant item) pair per row; several relevant items repeat the query.
            owners = np.concatenate([np.full(len(self._rows[str(query_ids[i])]), j) for j, i in enumerate(valid)])
            rows = np.concatenate([self._rows[str(query_ids[i])] for i in valid])
            values = self._pair_values(self._index(), embs[owners], rows)
            sums = np.bincount(owners, weights=values, minlength=len(valid))
            counts = np.bincount(owners, minlength=len(valid))
            rewards[valid] = np.clip(sums / counts, MIN_REWARD, MAX_REWARD)
        self.last_stats = {"malformed_fraction": 1.0 - len(valid) / max(len(completions), 1),
                           "reward_mean": float(rewards.mean()) if len(rewards) else 0.0}
        return rewards.tolist()


@dataclass
class RankReward(_RetrievalReward):
    """GRPO reward: mean over relevant items of rank_reward(exact corpus rank, N)."""

    __name__ = "rank_reward"

    def _pair_values(self, index: DenseIndex, query_embs: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return rank_reward(index.exact_ranks(query_embs, rows), len(index))


@dataclass
class ReciprocalRankReward(_RetrievalReward):
    """Ablation: mean over relevant items of 1 / (exact corpus rank)."""

    __name__ = "reciprocal_rank_reward"

    def _pair_values(self, index: DenseIndex, query_embs: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return reciprocal_rank_reward(index.exact_ranks(query_embs, rows), len(index))


@dataclass
class SimilarityReward(_RetrievalReward):
    """Ablation: mean cosine similarity of the relevant items (inflatable, see module doc)."""

    __name__ = "similarity_reward"

    def _pair_values(self, index: DenseIndex, query_embs: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return index.pair_scores(query_embs, rows).astype(np.float64)


def make_reward(kind: str, retriever: FrozenRetriever, qrels: Mapping[str, Sequence[str]],
                parser: RewriteParser | None = None, query_texts: Mapping[str, str] | None = None,
                query_mode: str | None = None, mix_weight: float = 0.0) -> _RetrievalReward:
    """``rank`` (GRAPE), ``reciprocal_rank`` or ``similarity`` (ablations); with ``query_texts``,
    rewrites are scored with their query's text, in ``query_mode`` (default ``expand``: each
    searched after its query's text; ``mix``: see :func:`search_embeddings`)."""
    classes = {"rank": RankReward, "reciprocal_rank": ReciprocalRankReward, "similarity": SimilarityReward}
    if kind not in classes:
        raise ValueError(f"grape.reward: unknown reward {kind!r} (expected one of {', '.join(classes)})")
    mode = query_mode or ("replace" if query_texts is None else "expand")
    return classes[kind](retriever, qrels, parser or RewriteParser(), query_texts, mode, mix_weight)
