"""Reference retrievers every final table carries: Lucene BM25 and the dense MiniLM retriever.

Both return per-query rankings (``{query_id: [item_id, ...]}``, best first) scored with the
project's metrics (:mod:`coevo.retrieval.metrics`), so their numbers sit beside the
methods' on the same split:

- :func:`bm25_run`: Lucene BM25 through pyserini over each item's ``title + " " + text``
  (:func:`coevo.retrieval.lucene.item_documents`), Anserini's DefaultEnglishAnalyzer
  (standard tokenizer, lower case, English stopwords removed, Porter stemming), one
  documented parameter set by default: Lucene/Anserini's k1 = 0.9, b = 0.4
  (:data:`coevo.retrieval.bm25.BM25_K1` / ``BM25_B``, also what ranks CoGR's sets).
- :func:`dense_run`: a frozen sentence-transformers encoder (offline default
  all-MiniLM-L6-v2) over items rendered ``"title: text"``, exact inner-product search over
  L2-normalised vectors (faiss ``IndexFlatIP``, :class:`coevo.retrieval.dense.DenseIndex`).

A set-retrieval method (CoGR) is compared against a ranked baseline *cut at a small k*,
never against its top-1000 taken as a set. :func:`baseline_table` therefore chooses
k* = argmax over the cut-offs of F1@k on the **val** split (ties: the smaller k), and
reports on the evaluation split (test by default): F1@k*, P@1, NDCG@5, NDCG@10, R@10,
R@100 and every ranked metric at every cut-off, each mean with a seeded percentile-
bootstrap 95% CI over queries (:func:`coevo.stats.mean_ci`), plus the number of
queries and the split. The per-query values travel with the table
(:attr:`BaselineTable.evaluation`) for paired comparisons (:func:`coevo.stats.compare`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from coevo.retrieval.bm25 import BM25_B, BM25_K1
from coevo.retrieval.lucene import ANALYZER, DEFAULT_THREADS
from coevo.retrieval.metrics import DEFAULT_CUTOFFS, Evaluation, check_cutoffs, metric_key, ranked_evaluation
from coevo.stats import DEFAULT_CONFIDENCE, DEFAULT_RESAMPLES, MeanCI, mean_cis

if TYPE_CHECKING:
    from coevo.data.schema import Dataset

Rankings = dict[str, list[str]]
METHODS: tuple[str, ...] = ("bm25", "dense")
DEFAULT_ENCODER = "all-minilm-l6-v2"
DEFAULT_DEPTH = 1000
# The headline rows after F1@k*: what tool-retrieval readers look at.
HEADLINE_METRICS: tuple[str, ...] = ("precision@1", "ndcg@5", "ndcg@10", "recall@10", "recall@100")


# ----------------------------------------------------------------------------- checks
def check_links(dataset: Dataset) -> None:
    """The links scoring relies on, as one-line errors: unique item and query ids, and
    every qrel naming a known query and a known item. (``coevo data validate`` runs the
    full Great Expectations contract; this is the cheap part a baseline cannot do without.)
    """
    name = getattr(dataset, "name", "dataset")
    items, queries, qrels = dataset.items, dataset.queries, dataset.qrels

    def few(values: Any) -> str:
        shown = list(dict.fromkeys(map(str, values)))
        return ", ".join(map(repr, shown[:5])) + (", ..." if len(shown) > 5 else "")

    for table, frame, column in (("items", items, "item_id"), ("queries", queries, "query_id")):
        ids = frame[column]
        if ids.isna().any() or (ids.astype(str).str.len() == 0).any():
            raise ValueError(f"{name}: {table}.{column} holds empty ids (run `coevo data validate` for the full report)")
        duplicated = ids[ids.duplicated()]
        if len(duplicated):
            raise ValueError(f"{name}: {table}.{column} repeats {len(duplicated)} id(s), e.g. {few(duplicated)}")
    unknown_items = qrels.loc[~qrels["item_id"].isin(set(items["item_id"])), "item_id"]
    if len(unknown_items):
        raise ValueError(
            f"{name}: {len(unknown_items)} qrels row(s) name items not in the items table, e.g. {few(unknown_items)} "
            "(run `coevo data validate` for the full report)"
        )
    unknown_queries = qrels.loc[~qrels["query_id"].isin(set(queries["query_id"])), "query_id"]
    if len(unknown_queries):
        raise ValueError(
            f"{name}: {len(unknown_queries)} qrels row(s) name queries not in the queries table, "
            f"e.g. {few(unknown_queries)} (run `coevo data validate` for the full report)"
        )


def _check_depth(k: int) -> int:
    if int(k) < 1:
        raise ValueError(f"k (documents retrieved per query) must be >= 1, got {k}")
    return int(k)


# ----------------------------------------------------------------------------- runs
def bm25_runs(
    dataset: Dataset,
    splits: Sequence[str] = ("test",),
    k1: float = BM25_K1,
    b: float = BM25_B,
    k: int = DEFAULT_DEPTH,
    *,
    threads: int | None = None,
    index_dir: str | os.PathLike | None = None,
) -> dict[str, Rankings]:
    """:func:`bm25_run` for several splits from one Lucene index: {split: rankings}."""
    from coevo.retrieval.lucene import bm25_rankings

    return bm25_rankings(
        dataset, splits, _check_depth(k), k1=k1, b=b, index_dir=index_dir,
        threads=DEFAULT_THREADS if threads is None else threads,
    )


def bm25_run(
    dataset: Dataset,
    split: str = "test",
    k1: float = BM25_K1,
    b: float = BM25_B,
    k: int = DEFAULT_DEPTH,
    *,
    threads: int | None = None,
    index_dir: str | os.PathLike | None = None,
) -> Rankings:
    """Lucene BM25 top-k item ids for every query of ``split`` (see the module notes)."""
    return bm25_runs(dataset, [split], k1, b, k, threads=threads, index_dir=index_dir)[split]


def dense_runs(
    dataset: Dataset,
    splits: Sequence[str] = ("test",),
    encoder: str = DEFAULT_ENCODER,
    k: int = DEFAULT_DEPTH,
    *,
    batch_size: int = 64,
    device: str | None = None,
) -> dict[str, Rankings]:
    """:func:`dense_run` for several splits, embedding the corpus once: {split: rankings}."""
    from coevo.models.encoder import TextRetriever

    k = _check_depth(k)
    retriever = TextRetriever(encoder, device=device, batch_size=batch_size)
    retriever.index_corpus(dataset.items[["item_id", "title", "text"]].to_dict("records"))
    out: dict[str, Rankings] = {}
    for split in dict.fromkeys(splits):
        frame = dataset.queries_in(split)
        ids = [str(q) for q in frame["query_id"]]
        rankings = retriever.rank_corpus([str(t) for t in frame["text"]], k) if ids else []
        out[split] = dict(zip(ids, (list(r) for r in rankings), strict=True))
    return out


def dense_run(
    dataset: Dataset,
    split: str = "test",
    encoder: str = DEFAULT_ENCODER,
    k: int = DEFAULT_DEPTH,
    *,
    batch_size: int = 64,
    device: str | None = None,
) -> Rankings:
    """Dense top-k item ids for every query of ``split``: the encoder (offline alias,
    hub id or folder; :func:`coevo.models.encoder.load_text_encoder`) embeds ``title: text``
    per item and the query text; faiss inner product over normalised vectors ranks them."""
    return dense_runs(dataset, [split], encoder, k, batch_size=batch_size, device=device)[split]


# ----------------------------------------------------------------------------- table
def choose_k(val: Evaluation, cutoffs: Sequence[int]) -> tuple[int, dict[int, float]]:
    """k* = argmax over ``cutoffs`` of mean F1@k on ``val`` (ties: the smaller k), and the
    F1@k of every cut-off."""
    means = val.means()
    f1 = {k: means[metric_key("f1", k)] for k in check_cutoffs(cutoffs)}
    best = max(f1.values())
    return min(k for k, v in f1.items() if v == best), f1


@dataclass(frozen=True)
class BaselineTable:
    """A baseline on one split, cut at the k chosen on val, with 95% CIs of every mean."""

    method: str
    label: str
    dataset: str
    split: str
    n_queries: int
    n_without_relevant: int
    val_split: str
    n_val_queries: int
    chosen_k: int
    val_f1: dict[int, float]
    cutoffs: tuple[int, ...]
    metrics: dict[str, MeanCI]
    params: dict[str, Any] = field(default_factory=dict)
    evaluation: Evaluation | None = field(default=None, repr=False, compare=False)

    @property
    def chosen_metric(self) -> str:
        """``"f1@<k*>"``: the F1 row, named by its val-chosen cut-off."""
        return metric_key("f1", self.chosen_k)

    def headline(self) -> dict[str, MeanCI]:
        """F1@k*, then P@1, NDCG@5, NDCG@10, R@10, R@100 (those whose cut-off was evaluated)."""
        names = [self.chosen_metric] + [m for m in HEADLINE_METRICS if m != self.chosen_metric]
        return {m: self.metrics[m] for m in names if m in self.metrics}

    def as_dict(self) -> dict[str, Any]:
        """What ``metrics.json`` holds: flat means (DVC-friendly), CIs, and what the table
        says about itself (method, parameters, split, query counts, the val choice)."""
        any_ci = next(iter(self.metrics.values()))
        return {
            "baseline": self.method,
            "label": self.label,
            "dataset": self.dataset,
            "split": self.split,
            "n_queries": self.n_queries,
            "n_without_relevant": self.n_without_relevant,
            "chosen_k": {
                "metric": self.chosen_metric,
                "k": self.chosen_k,
                "chosen_on": self.val_split,
                "n_val_queries": self.n_val_queries,
                "val_f1_at_k": {str(k): v for k, v in self.val_f1.items()},
            },
            # A list: the rows keep their order (F1@k* first) in a key-sorted JSON file.
            "headline": [
                {"metric": m, "mean": c.mean, "ci95": [c.ci_low, c.ci_high]} for m, c in self.headline().items()
            ],
            "metrics": {m: c.mean for m, c in self.metrics.items()},
            "ci95": {m: [c.ci_low, c.ci_high] for m, c in self.metrics.items()},
            "cutoffs": list(self.cutoffs),
            "bootstrap": {
                "method": any_ci.method, "resamples": any_ci.resamples, "seed": any_ci.seed,
                "confidence": any_ci.confidence, "unit": "query",
            },
            "params": self.params,
        }


def _label(method: str, params: Mapping[str, Any]) -> str:
    if method == "bm25":
        return f"BM25 (Lucene, k1={params['k1']:g}, b={params['b']:g})"
    return f"dense ({params['encoder']}, faiss)"


def baseline_table(
    dataset: Dataset,
    method: str = "bm25",
    *,
    split: str = "test",
    val_split: str = "val",
    cutoffs: Sequence[int] = DEFAULT_CUTOFFS,
    k: int = DEFAULT_DEPTH,
    k1: float = BM25_K1,
    b: float = BM25_B,
    encoder: str = DEFAULT_ENCODER,
    min_grade: int | None = None,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
    threads: int | None = None,
    index_dir: str | os.PathLike | None = None,
    batch_size: int = 64,
    device: str | None = None,
    runs: Mapping[str, Rankings] | None = None,
) -> BaselineTable:
    """Run a baseline on ``val_split`` and ``split``, choose k* on val (argmax F1@k over the
    cut-offs), and report every metric on ``split`` with seeded bootstrap CIs.

    Cut-offs above the retrieval depth ``k`` are dropped. ``runs`` ({split: rankings})
    skips retrieval (already computed rankings, e.g. from a cache). Errors: an unknown
    method, a split without a query that has a relevant item, broken qrels links.
    """
    if method not in METHODS:
        raise ValueError(f"unknown baseline {method!r}; expected one of {', '.join(METHODS)}")
    k = _check_depth(k)
    check_links(dataset)
    cut = tuple(c for c in check_cutoffs(cutoffs) if c <= k)
    if not cut:
        raise ValueError(f"every cut-off in {list(cutoffs)} exceeds the retrieval depth k={k}")
    qrels = {s: dataset.relevant(s) for s in dict.fromkeys((val_split, split))}
    for s, rel in qrels.items():
        if not rel:
            role = "choose k for F1@k on" if s == val_split else "evaluate"
            raise ValueError(f"{dataset.name}: split {s!r} has no query with a relevant item: nothing to {role}")
    if method == "bm25":
        params: dict[str, Any] = {"k1": float(k1), "b": float(b), "k": k, "analyzer": ANALYZER,
                                  "document": "title + ' ' + text"}
        if runs is None:
            runs = bm25_runs(dataset, list(qrels), k1, b, k, threads=threads, index_dir=index_dir)
    else:
        params = {"encoder": encoder, "k": k, "index": "faiss.IndexFlatIP (cosine)", "document": "title: text"}
        if runs is None:
            runs = dense_runs(dataset, list(qrels), encoder, k, batch_size=batch_size, device=device)
    evaluations = {
        s: ranked_evaluation(
            runs[s], qrels[s], cut, query_ids=list(dataset.queries_in(s)["query_id"]), min_grade=min_grade
        )
        for s in qrels
    }
    chosen, val_f1 = choose_k(evaluations[val_split], cut)
    test = evaluations[split]
    names = [metric_key(m, c) for m in ("f1", "precision", "recall", "ndcg", "mrr") for c in cut]
    cis = mean_cis(test, names, resamples=resamples, seed=seed, confidence=confidence)
    return BaselineTable(
        method=method, label=_label(method, params), dataset=str(dataset.name), split=split,
        n_queries=test.n_queries, n_without_relevant=test.n_without_relevant, val_split=val_split,
        n_val_queries=evaluations[val_split].n_queries, chosen_k=chosen, val_f1=val_f1, cutoffs=cut,
        metrics=cis, params=params, evaluation=test,
    )

