"""Dense retrieval over a faiss index, with exact whole-corpus ranks for rewards.

Embeddings are L2-normalised and searched by inner product (cosine similarity). The
index is a versioned artifact: a folder with the faiss file, the item ids and a manifest
(encoder name, dimension, size, content hash), written atomically and checked on load.

Exact rank (what the GRAPE reward needs): the rank of a relevant item among all N items
is ``1 + #items whose score is strictly higher``. It is computed by comparing every
corpus score against the relevant item's score, never from a truncated top-k, so an item
at rank 9,000 of 10,000 gets its true rank. Ties are resolved optimistically: items that
score exactly the same as the relevant item do not push it down (two identical vectors
both get the better rank). The relevant item's own score is read from the same matrix
product as every other score, so floating-point rounding cannot make it beat itself.
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from coevo.io import atomic_path, read_json, write_json

INDEX_FORMAT_VERSION = 1
_INDEX_FILE = "index.faiss"
_IDS_FILE = "ids.json"
_MANIFEST_FILE = "manifest.json"
# Bound the (queries x corpus) score block held in memory at once (float32 cells).
_MAX_BLOCK_CELLS = 16_000_000


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Row-wise L2 normalisation (float32 copy); all-zero rows stay zero."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def _as_matrix(x: np.ndarray, dim: int | None, what: str) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2:
        raise ValueError(f"{what}: expected a 2-d array (rows x dim), got shape {x.shape}")
    if dim is not None and x.shape[1] != dim:
        raise ValueError(f"{what}: dimension {x.shape[1]} does not match the index dimension {dim}")
    bad = np.flatnonzero(~np.isfinite(x).all(axis=1))
    if bad.size:
        raise ValueError(f"{what}: row {int(bad[0])} holds NaN or infinite values ({bad.size} rows in all)")
    return x


def content_hash(ids: Sequence[str], embeddings: np.ndarray) -> str:
    """sha256 over the ids and the float32 embedding bytes (identifies an index version)."""
    digest = hashlib.sha256()
    digest.update(json.dumps(list(ids), ensure_ascii=False).encode("utf-8"))
    digest.update(np.ascontiguousarray(embeddings, dtype=np.float32).tobytes())
    return digest.hexdigest()


class DenseIndex:
    """Flat inner-product faiss index over L2-normalised item embeddings."""

    def __init__(self, ids: list[str], index: Any, encoder: str | None = None) -> None:
        import faiss

        self.ids = ids
        self.index = index
        self.encoder = encoder
        self.row_of = {item_id: row for row, item_id in enumerate(ids)}
        # Zero-copy view of the vectors stored in the flat index (exact ranks read it).
        self._xb = faiss.rev_swig_ptr(index.get_xb(), index.ntotal * index.d).reshape(index.ntotal, index.d)

    # ---- construction -------------------------------------------------------------
    @classmethod
    def build(cls, ids: Sequence[str], embeddings: np.ndarray, encoder: str | None = None) -> DenseIndex:
        """Index ``embeddings`` (one row per id); rows are L2-normalised here."""
        import faiss

        ids = [str(i) for i in ids]
        emb = _as_matrix(embeddings, None, "item embeddings")
        if len(ids) != emb.shape[0]:
            raise ValueError(f"item embeddings: {emb.shape[0]} rows for {len(ids)} ids")
        if not ids:
            raise ValueError("item embeddings: the corpus is empty")
        seen: dict[str, int] = {}
        for row, item_id in enumerate(ids):
            if item_id in seen:
                raise ValueError(f"item ids: {item_id!r} appears twice (rows {seen[item_id]} and {row})")
            seen[item_id] = row
        index = faiss.IndexFlatIP(emb.shape[1])
        index.add(l2_normalize(emb))
        return cls(ids, index, encoder)

    @property
    def dim(self) -> int:
        return int(self.index.d)

    def __len__(self) -> int:
        return int(self.index.ntotal)

    @property
    def embeddings(self) -> np.ndarray:
        """The stored (normalised) item vectors; a read-only view, not a copy."""
        view = self._xb.view()
        view.flags.writeable = False
        return view

    def rows(self, item_ids: Sequence[str]) -> np.ndarray:
        """Row numbers of ``item_ids``; a KeyError names the first unknown id."""
        try:
            return np.fromiter((self.row_of[i] for i in item_ids), dtype=np.int64, count=len(item_ids))
        except KeyError as exc:
            raise KeyError(f"item id {exc.args[0]!r} is not in the index ({len(self)} items)") from None

    # ---- search -------------------------------------------------------------------
    def search(self, query_emb: np.ndarray, k: int) -> tuple[list[str] | list[list[str]], np.ndarray]:
        """Top-k ids and scores. A 1-d query gives flat results; a 2-d batch, one list per row."""
        single = np.asarray(query_emb).ndim == 1
        q = l2_normalize(_as_matrix(query_emb, self.dim, "query embeddings"))
        k = min(int(k), len(self))
        if k < 1:
            raise ValueError(f"search: k must be >= 1, got {k}")
        scores, rows = self.index.search(q, k)
        ids = [[self.ids[r] for r in row] for row in rows]
        return (ids[0], scores[0]) if single else (ids, scores)

    def rank_corpus(self, query_embs: np.ndarray, k: int | None = None) -> list[list[str]]:
        """Ranked item ids per query (top ``k``, or the whole corpus when k is None)."""
        ids, _ = self.search(_as_matrix(query_embs, self.dim, "query embeddings"), k or len(self))
        return ids  # type: ignore[return-value]

    def pair_scores(self, query_embs: np.ndarray, item_rows: np.ndarray) -> np.ndarray:
        """Cosine similarity of each query row with its paired item row."""
        q = l2_normalize(_as_matrix(query_embs, self.dim, "query embeddings"))
        rows = self._check_rows(item_rows, q.shape[0])
        return np.einsum("ij,ij->i", q, self._xb[rows])

    def exact_ranks(self, query_embs: np.ndarray, item_rows: np.ndarray) -> np.ndarray:
        """Exact 1-based rank of item ``item_rows[i]`` for query ``i`` among all N items.

        rank = 1 + number of items scoring strictly higher (ties count in the item's
        favour). Vectorised in query blocks so memory stays bounded for large corpora.
        """
        q = l2_normalize(_as_matrix(query_embs, self.dim, "query embeddings"))
        rows = self._check_rows(item_rows, q.shape[0])
        ranks = np.empty(q.shape[0], dtype=np.int64)
        block = max(1, _MAX_BLOCK_CELLS // max(len(self), 1))
        for start in range(0, q.shape[0], block):
            stop = min(start + block, q.shape[0])
            scores = q[start:stop] @ self._xb.T
            target = scores[np.arange(stop - start), rows[start:stop]]
            ranks[start:stop] = 1 + np.count_nonzero(scores > target[:, None], axis=1)
        return ranks

    def _check_rows(self, item_rows: np.ndarray, n_queries: int) -> np.ndarray:
        rows = np.asarray(item_rows, dtype=np.int64).reshape(-1)
        if rows.shape[0] != n_queries:
            raise ValueError(f"{rows.shape[0]} item rows for {n_queries} queries (one row per query expected)")
        if rows.size and (rows.min() < 0 or rows.max() >= len(self)):
            raise IndexError(f"item row out of range 0..{len(self) - 1}")
        return rows

    # ---- persistence --------------------------------------------------------------
    def manifest(self) -> dict[str, Any]:
        return {
            "format_version": INDEX_FORMAT_VERSION,
            "kind": "faiss.IndexFlatIP",
            "metric": "inner_product",
            "normalized": True,
            "encoder": self.encoder,
            "dim": self.dim,
            "n_items": len(self),
            "content_hash": content_hash(self.ids, self._xb),
        }

    def save(self, directory: str | Path) -> Path:
        """Write the index folder atomically (faiss file, ids, manifest)."""
        import faiss

        directory = Path(directory)
        with atomic_path(directory, is_dir=True) as tmp:
            faiss.write_index(self.index, str(tmp / _INDEX_FILE))
            write_json(tmp / _IDS_FILE, self.ids, indent=0)
            write_json(tmp / _MANIFEST_FILE, self.manifest())
        return directory

    @classmethod
    def load(cls, directory: str | Path, verify: bool = True) -> DenseIndex:
        """Load a saved index; with ``verify`` the content hash must match the manifest."""
        import faiss

        directory = Path(directory)
        for name in (_INDEX_FILE, _IDS_FILE, _MANIFEST_FILE):
            if not (directory / name).is_file():
                raise FileNotFoundError(f"{directory}: not a dense index folder ({name} is missing)")
        manifest = read_json(directory / _MANIFEST_FILE)
        if manifest.get("format_version") != INDEX_FORMAT_VERSION:
            raise ValueError(f"{directory / _MANIFEST_FILE}: format_version {manifest.get('format_version')!r}, "
                             f"expected {INDEX_FORMAT_VERSION}")
        ids = read_json(directory / _IDS_FILE)
        index = faiss.read_index(str(directory / _INDEX_FILE))
        if index.ntotal != len(ids) or index.ntotal != manifest["n_items"]:
            raise ValueError(f"{directory}: index holds {index.ntotal} vectors, ids.json {len(ids)}, "
                             f"manifest n_items {manifest['n_items']}")
        loaded = cls([str(i) for i in ids], index, manifest.get("encoder"))
        if verify and content_hash(loaded.ids, loaded._xb) != manifest["content_hash"]:
            raise ValueError(f"{directory}: content hash does not match the manifest (the index files were changed)")
        return loaded


class FrozenRetriever(ABC):
    """A frozen encoder that embeds the corpus once and ranks the whole corpus for queries.

    Subclasses embed queries (text) and items (text or images); everything else (index,
    exact ranks, similarity, rankings) is shared here.
    """

    kind: str = "dense"
    name: str = ""

    def __init__(self) -> None:
        self.index: DenseIndex | None = None

    @abstractmethod
    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        """L2-normalised float32 embeddings, one row per text."""

    @abstractmethod
    def embed_items(self, items: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """L2-normalised float32 embeddings, one row per item record."""

    @property
    def encoder_id(self) -> str:
        """Recorded in the index manifest; an index built by another encoder is refused."""
        return f"{self.kind}:{self.name}"

    def index_corpus(self, items: Sequence[Mapping[str, Any]]) -> DenseIndex:
        """Embed every item once and keep the index (``items`` need ``item_id``)."""
        ids = [str(it["item_id"]) for it in items]
        self.index = DenseIndex.build(ids, self.embed_items(items), encoder=self.encoder_id)
        return self.index

    def attach(self, index: DenseIndex) -> DenseIndex:
        """Use a saved index; it must have been built by this retriever's encoder."""
        if index.encoder != self.encoder_id:
            raise ValueError(f"index was built by encoder {index.encoder!r}, this retriever is {self.encoder_id!r}")
        self.index = index
        return index

    def _require_index(self) -> DenseIndex:
        if self.index is None:
            raise RuntimeError("the retriever has no corpus index: call index_corpus(items) or attach(index) first")
        return self.index

    def ranks(self, query_texts: Sequence[str], item_ids: Sequence[str]) -> np.ndarray:
        """Exact whole-corpus rank of ``item_ids[i]`` for ``query_texts[i]``."""
        index = self._require_index()
        return index.exact_ranks(self.embed_queries(query_texts), index.rows(item_ids))

    def similarities(self, query_texts: Sequence[str], item_ids: Sequence[str]) -> np.ndarray:
        index = self._require_index()
        return index.pair_scores(self.embed_queries(query_texts), index.rows(item_ids))

    def rank_corpus(self, query_texts: Sequence[str], k: int | None = None) -> list[list[str]]:
        index = self._require_index()
        return index.rank_corpus(self.embed_queries(query_texts), k)
