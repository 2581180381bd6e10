"""In-process BM25 ranking over generated keywords (bm25s), used to order CoGR's retrieved sets.

Each normalised keyword is one token, so a phrase matches only as a whole ("family tree"
does not match "tree"), exactly like the inverted index. Scores come from bm25s (Lucene's
BM25 variant) with the project's one BM25 parameter set, :data:`BM25_K1` = 0.9 and
:data:`BM25_B` = 0.4 (Lucene/Anserini's defaults, the same as the Lucene BM25 baseline in
:mod:`coevo.retrieval.lucene`); ties are broken by item id so rankings are reproducible.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from coevo.retrieval.keywords import normalize_keyword

# The one documented BM25 parameter set: Lucene/Anserini defaults, used by the Lucene
# baseline and by the ranking of CoGR's retrieved sets alike.
BM25_K1 = 0.9
BM25_B = 0.4


def _token_list(keywords: Iterable[str]) -> list[str]:
    if isinstance(keywords, str):
        raise TypeError("keywords must be a collection of strings, not one string")
    return list(dict.fromkeys(k for k in map(normalize_keyword, keywords) if k))


class KeywordBM25:
    """BM25 over each item's keyword set; :meth:`rank` orders candidates for a query."""

    def __init__(self, item_keywords: Mapping[str, Sequence[str]], *, k1: float = BM25_K1, b: float = BM25_B):
        import bm25s

        self.item_ids: tuple[str, ...] = tuple(item_keywords)
        self._pos = {item: i for i, item in enumerate(self.item_ids)}
        # Rank of each item id in sorted order: the deterministic tie-breaker.
        order = sorted(range(len(self.item_ids)), key=self.item_ids.__getitem__)
        self._id_rank = np.empty(len(self.item_ids), dtype=np.int64)
        self._id_rank[order] = np.arange(len(order))
        corpus = [_token_list(item_keywords[i]) for i in self.item_ids]
        self._bm25 = bm25s.BM25(k1=k1, b=b, method="lucene")
        # bm25s cannot index a corpus without any token (e.g. an untrained generator wrote no keyword).
        self._indexed = any(corpus)
        if self._indexed:
            self._bm25.index(corpus, show_progress=False)

    def scores(self, query_keywords: Iterable[str]) -> np.ndarray:
        """BM25 score of every item (item order = ``self.item_ids``)."""
        tokens = _token_list(query_keywords)
        token_ids = self._bm25.get_tokens_ids(tokens) if self._indexed else []
        if not token_ids:
            return np.zeros(len(self.item_ids), dtype=np.float32)
        return self._bm25.get_scores_from_ids(token_ids)

    def rank(
        self,
        query_keywords: Iterable[str],
        candidates: Iterable[str] | None = None,
        k: int | None = None,
    ) -> list[str]:
        """Item ids by descending BM25 score, ties by ascending item id, at most ``k``.

        ``candidates=None`` ranks every item sharing at least one keyword with the query
        (CoGR's retrieved set); otherwise exactly the given candidates are ranked (those
        sharing no keyword score 0 and come last). Unknown candidate ids are an error.
        """
        scores = self.scores(query_keywords)
        if candidates is None:
            positions = np.flatnonzero(scores > 0)
        else:
            try:
                positions = np.fromiter(
                    dict.fromkeys(self._pos[c] for c in candidates), dtype=np.int64
                )
            except KeyError as exc:
                raise KeyError(f"candidate item {exc.args[0]!r} is not in the BM25 index") from None
        if len(positions) == 0:
            return []
        order = np.lexsort((self._id_rank[positions], -scores[positions].astype(np.float64)))
        if k is not None:
            order = order[:k]
        ids = self.item_ids
        return [ids[p] for p in positions[order]]
