"""Keyword inverted index over documents (items or queries), with set retrieval.

One class serves both directions CoGR needs: keyword -> items (documents are items) and
keyword -> queries (documents are queries). Internally documents and keywords are integer
ids and the index is a pair of CSR matrices (document x keyword and its transpose, the
posting lists), so retrieval is a few numpy calls; the reward code uses the integer API
(:meth:`InvertedIndex.keyword_ids`, :meth:`InvertedIndex.postings`) directly.

On disk an index is JSON lines, one ``{"id": ..., "keywords": [...]}`` per document,
sorted by id with keywords sorted: plain text that diffs and versions well (DVC, git).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from coevo.data.readers import read_jsonl
from coevo.io import atomic_path
from coevo.retrieval.keywords import normalize_keyword


class InvertedIndex:
    """Documents and their keyword sets; keyword -> documents posting lists.

    Keywords are normalised with :func:`normalize_keyword` when the index is built and when
    it is queried through the string API, so "Family Tree" and "family tree" match.
    Duplicate keywords in a document count once; a document may have no keywords (it is
    listed but never retrieved).
    """

    def __init__(self, doc_ids: Sequence[str], vocabulary: Sequence[str], doc_keyword: sp.csr_matrix):
        self._doc_ids: tuple[str, ...] = tuple(doc_ids)
        self._vocabulary: tuple[str, ...] = tuple(vocabulary)
        self._doc_pos = {d: i for i, d in enumerate(self._doc_ids)}
        self._kw_pos = {k: i for i, k in enumerate(self._vocabulary)}
        self.doc_keyword = doc_keyword.tocsr()
        self.doc_keyword.sort_indices()
        # keyword -> documents: the posting lists, sorted by document id.
        self.keyword_doc = self.doc_keyword.T.tocsr()
        self.keyword_doc.sort_indices()

    # -- construction -------------------------------------------------------------------
    @classmethod
    def from_keyword_sets(cls, sets: Mapping[str, Sequence[str]]) -> InvertedIndex:
        """Build from ``doc_id -> keywords``; keywords are normalised, empties dropped."""
        doc_ids = list(sets)
        vocab: dict[str, int] = {}
        indptr = [0]
        indices: list[int] = []
        for doc_id in doc_ids:
            keywords = sets[doc_id]
            if isinstance(keywords, str):
                raise TypeError(f"keywords of document {doc_id!r} must be a list of strings, got one string")
            row: set[int] = set()
            for kw in keywords:
                norm = normalize_keyword(kw)
                if norm:
                    row.add(vocab.setdefault(norm, len(vocab)))
            indices.extend(sorted(row))
            indptr.append(len(indices))
        matrix = sp.csr_matrix(
            (np.ones(len(indices), dtype=np.int32), np.asarray(indices, dtype=np.int32), np.asarray(indptr, dtype=np.int64)),
            shape=(len(doc_ids), len(vocab)),
        )
        return cls(doc_ids, list(vocab), matrix)

    # -- properties ---------------------------------------------------------------------
    @property
    def doc_ids(self) -> tuple[str, ...]:
        return self._doc_ids

    @property
    def vocabulary(self) -> tuple[str, ...]:
        return self._vocabulary

    @property
    def n_docs(self) -> int:
        return len(self._doc_ids)

    def __len__(self) -> int:
        return len(self._doc_ids)

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self._doc_pos

    def doc_position(self, doc_id: str) -> int:
        try:
            return self._doc_pos[doc_id]
        except KeyError:
            raise KeyError(f"document {doc_id!r} is not in the index") from None

    def keywords_of(self, doc_id: str) -> tuple[str, ...]:
        """The document's normalised keywords, sorted."""
        row = self.doc_position(doc_id)
        ids = self.doc_keyword.indices[self.doc_keyword.indptr[row] : self.doc_keyword.indptr[row + 1]]
        return tuple(sorted(self._vocabulary[k] for k in ids))

    def keyword_sets(self) -> dict[str, tuple[str, ...]]:
        return {d: self.keywords_of(d) for d in self._doc_ids}

    # -- integer API (hot paths) --------------------------------------------------------
    def keyword_ids(self, keywords: Iterable[str], *, normalized: bool = False) -> np.ndarray:
        """Distinct integer ids of the keywords known to the index (unknown ones dropped)."""
        pos = self._kw_pos
        norm = (lambda k: k) if normalized else normalize_keyword
        ids = {pos[n] for n in map(norm, keywords) if n in pos}
        return np.fromiter(ids, dtype=np.int64, count=len(ids))

    def postings(self, keyword_ids: np.ndarray) -> np.ndarray:
        """Concatenated posting lists (document positions) of the keyword ids; may repeat."""
        indptr, indices = self.keyword_doc.indptr, self.keyword_doc.indices
        if len(keyword_ids) == 0:
            return np.empty(0, dtype=indices.dtype)
        if len(keyword_ids) == 1:
            k = int(keyword_ids[0])
            return indices[indptr[k] : indptr[k + 1]]
        return gather_rows(indptr, indices, np.asarray(keyword_ids))

    @functools.cached_property
    def position_lookup(self) -> dict[str, int]:
        """doc_id -> position as a dict that answers -1 for an unknown id (no KeyError).

        For bulk C-level lookups (``operator.itemgetter(*ids)(index.position_lookup)``)
        where a Python call per id would dominate.
        """
        return _PositionOrMissing(self._doc_pos)

    @functools.cached_property
    def posting_lists(self) -> list[np.ndarray]:
        """Per keyword id, its posting list (sorted document positions) as an array view.

        A Python list of views: hot loops index it directly, without numpy scalar overhead.
        """
        indptr, indices = self.keyword_doc.indptr.tolist(), self.keyword_doc.indices
        return [indices[a:b] for a, b in zip(indptr[:-1], indptr[1:])]

    def retrieve_positions(self, keyword_ids: np.ndarray) -> np.ndarray:
        """Sorted distinct document positions sharing at least one of the keyword ids."""
        return unique_positions(self.postings(keyword_ids), self.n_docs)

    def query_matrix(self, keyword_sets: Sequence[Iterable[str]], *, normalized: bool = False) -> sp.csr_matrix:
        """Binary (n_sets x vocabulary) matrix of keyword sets in this index's vocabulary."""
        indptr = [0]
        indices: list[np.ndarray] = []
        for kws in keyword_sets:
            ids = self.keyword_ids(kws, normalized=normalized)
            indices.append(ids)
            indptr.append(indptr[-1] + len(ids))
        flat = np.concatenate(indices) if indices else np.empty(0, dtype=np.int64)
        return sp.csr_matrix(
            (np.ones(len(flat), dtype=np.int32), flat.astype(np.int32), np.asarray(indptr, dtype=np.int64)),
            shape=(len(indptr) - 1, len(self._vocabulary)),
        )

    # -- string API ---------------------------------------------------------------------
    def retrieve(self, keywords: Iterable[str]) -> set[str]:
        """Every document that shares at least one keyword with ``keywords``."""
        if isinstance(keywords, str):
            raise TypeError("retrieve() takes a collection of keywords, not one string")
        docs = self._doc_ids
        return {docs[i] for i in self.retrieve_positions(self.keyword_ids(keywords))}

    # -- persistence --------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        """Write JSON lines (sorted by id, keywords sorted) atomically."""
        path = Path(path)
        with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
            for doc_id in sorted(self._doc_ids):
                fh.write(json.dumps({"id": doc_id, "keywords": list(self.keywords_of(doc_id))}, ensure_ascii=False))
                fh.write("\n")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> InvertedIndex:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"{path}: index file does not exist")
        sets: dict[str, list[str]] = {}
        for lineno, record in read_jsonl(path):
            if not isinstance(record.get("id"), str) or not isinstance(record.get("keywords"), list):
                raise ValueError(f"{path}: line {lineno}: expected {{\"id\": str, \"keywords\": [str, ...]}}")
            if record["id"] in sets:
                raise ValueError(f"{path}: line {lineno}: duplicate id {record['id']!r}")
            if not all(isinstance(k, str) for k in record["keywords"]):
                raise ValueError(f"{path}: line {lineno}: keywords of {record['id']!r} must be strings")
            sets[record["id"]] = record["keywords"]
        return cls.from_keyword_sets(sets)


class _PositionOrMissing(dict):
    """A position map whose missing keys read as -1."""

    def __missing__(self, key: str) -> int:
        return -1


def gather_rows(indptr: np.ndarray, indices: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Concatenate ``indices[indptr[r]:indptr[r+1]]`` for every r in ``rows`` (vectorised)."""
    starts = indptr[rows]
    lengths = indptr[rows + 1] - starts
    total = int(lengths.sum())
    if total == 0:
        return np.empty(0, dtype=indices.dtype)
    # Position j of the output reads indices[starts[row(j)] + (j - offset(row(j)))].
    offsets = np.cumsum(lengths) - lengths
    gather = np.arange(total, dtype=np.int64) + np.repeat(starts - offsets, lengths)
    return indices[gather]


def unique_positions(positions: np.ndarray, size: int) -> np.ndarray:
    """Sorted distinct values of ``positions`` (all in [0, size)): a sort when few, a mask when many."""
    if len(positions) * 16 < size:
        return np.unique(positions)
    mask = np.zeros(size, dtype=bool)
    mask[positions] = True
    return np.flatnonzero(mask)
