"""What CoGR's two generators see: the item's text, and the query with search-result snippets.

The CoGR paper measures it (its Table 4): without item descriptions F1 falls from 0.3963 to
0.3759; with search-result snippets in the query prompt it rises to 0.4379, its best variant.

- ``cogr.item_context``: ``description`` (title and description) or ``title_only``.
- ``cogr.query_context``: ``none`` or ``search_results``: the query prompt lists the top-k items
  of a first-stage Lucene BM25 over the items' title + text (the BM25 baseline's documents,
  k1 0.9, b 0.4), each as "title: description cut to max_chars". Snippets come from the corpus
  alone, never from the qrels, and are a pure function of (items, query text, knobs): the
  method (SFT, GRPO, evaluation) and serving (``coevo search``, the pyfunc model) build their
  prompts here, so both see the same snippets.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from coevo.models.prompts import SYSTEM_PROMPTS, Messages, item_messages, query_messages

SEARCH_RESULTS_NOTE = " The query comes with search results that may or may not be relevant; use them only where they help."


def _text(value: Any) -> str:
    return "" if value is None or value != value else " ".join(str(value).split())


def snippet(title: str, description: str, max_chars: int) -> str:
    """``title: description`` with the description cut at a word within ``max_chars`` (`` ...`` marks a cut)."""
    description = _text(description)
    if len(description) > max_chars:
        description = description[:max_chars].rsplit(" ", 1)[0] + " ..."
    title = _text(title)
    return f"{title}: {description}" if description else title


def query_prompt(query: str, results: Sequence[str] = (), system_prompt: str = "full") -> Messages:
    """The query side's prompt: :func:`coevo.models.prompts.query_messages` with the system prompt
    ``cogr.system_prompt`` names, plus numbered search results when there are any
    (``query_context = search_results``)."""
    system = SYSTEM_PROMPTS[system_prompt][0]
    if not results:
        return query_messages(query, system)
    listed = "\n".join(f"{n}. {r}" for n, r in enumerate(results, 1))
    return [
        {"role": "system", "content": system + SEARCH_RESULTS_NOTE},
        {"role": "user", "content": f"Query: {query.strip()}\nSearch results:\n{listed}\nKeywords:"},
    ]


def item_prompt(title: str, description: str, item_context: str, system_prompt: str = "full") -> Messages:
    """The item side's prompt: title and description, or the title alone (``title_only``)."""
    return item_messages(title, "" if item_context == "title_only" else description,
                         system=SYSTEM_PROMPTS[system_prompt][1])


def item_description(description: str, item_context: str) -> str:
    """The description the item side may use (seeds included): empty with ``title_only``."""
    return "" if item_context == "title_only" else description


class SearchResults:
    """Top-k snippets per query text from Lucene BM25 over the items (``title + text``).

    One Lucene index per instance, built on first use in a temporary folder (or ``index_dir``)."""

    def __init__(self, items: pd.DataFrame, k: int, max_chars: int, *, index_dir: Path | None = None) -> None:
        self.items = items
        self.k, self.max_chars = int(k), int(max_chars)
        self._index_dir = index_dir
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._snippet = {str(i): snippet(t, x, self.max_chars)
                         for i, t, x in zip(items["item_id"], items["title"], items["text"], strict=True)}

    @classmethod
    def from_params(cls, items: pd.DataFrame, cogr: Any, **kwargs: Any) -> "SearchResults | None":
        """The snippets ``cogr`` (the params section, or its dict) asks for; None with query_context = none."""
        cfg = cogr if isinstance(cogr, Mapping) else cogr.model_dump(mode="json")
        if cfg.get("query_context", "none") != "search_results":
            return None
        return cls(items, cfg["search_results"]["k"], cfg["search_results"]["max_chars"], **kwargs)

    def _index(self) -> Path:
        from coevo.retrieval.lucene import build_lucene_index

        if self._index_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="coevo-cogr-snippets-")
            self._index_dir = Path(self._tmp.name) / "index"
        if not any(self._index_dir.glob("segments_*")):  # a complete Lucene index has a segments file
            docs = ((str(i), f"{_text(t)} {_text(x)}".strip())
                    for i, t, x in zip(self.items["item_id"], self.items["title"], self.items["text"], strict=True))
            build_lucene_index(docs, self._index_dir)
        return self._index_dir

    def for_texts(self, texts: Sequence[str]) -> list[list[str]]:
        """The snippets of each query text, best first (a query BM25 finds nothing for gets none)."""
        from coevo.retrieval.lucene import search

        unique = list(dict.fromkeys(texts))
        hits = search(self._index(), {str(n): t for n, t in enumerate(unique)}, k=self.k)
        by_text = {t: [self._snippet[i] for i in hits[str(n)]] for n, t in enumerate(unique)}
        return [by_text[t] for t in texts]
