"""Search with a trained retriever: one :class:`Retriever` per method, from a run or from files.

A retriever is what a finished run serves, and nothing else: the generator of the phase
chosen on val, the index it searches, the items table and the few settings query time needs.

- **CoGR**: the query generator writes keywords (greedy, parsed, at most ``k_max``); the items
  sharing at least one keyword with them are retrieved from the learned item index and ranked
  by BM25 over the items' keywords (ties by item id), exactly as the evaluation ranks them.
- **GRAPE**: the trained rewriter rewrites the query (greedy); the frozen retriever (a text
  encoder or CLIP, a reference: the weights are not copied) embeds the rewrite and searches the
  corpus index. A malformed rewrite is searched as the empty string, as in the evaluation. A
  run trained with ``grape.query_mode: expand`` searches the query followed by the rewrite (the
  query alone when the rewrite was malformed), ``mix`` the query's embedding plus ``mix_weight``
  times the rewrite's; the record's ``rewrite`` is what the rewriter wrote.
- **CoHyDE**: the rewriter writes a tool description (greedy); the co-trained encoder of the
  chosen stage embeds it and searches that encoder's faiss index.

``search(queries, k)`` returns one record per query, ``{query, keywords|rewrite|description,
results: [{item_id, title, score}]}``; ``evaluate(dataset, split)`` scores the retriever on a
split with the library's metrics (per-query values, for intervals and paired tests). Both
generate the way the method's own evaluation does (same prompts, greedy decoding, same batch
size and query order), so ``evaluate`` on the test split reproduces the flow's final row.

On disk (a folder, or the artifacts of the MLflow model) a retriever is a few named files,
:data:`FILES`: ``manifest.json`` (method, data set, phase, the settings query time needs),
``params.json`` (every param the run was trained with, for provenance), ``items.parquet``,
``generator/`` (LoRA adapters or full weights as safetensors, tokenizer, and the base model's
name), ``index`` (CoGR: the item keyword index, JSON lines; GRAPE and CoHyDE: a faiss index
folder) and, for CoHyDE, ``encoder/`` (sentence-transformers, safetensors). Query time reads
only the manifest's settings, never the params schema, so a model logged months ago still
loads after the params evolved.

Building from a run directory goes through the method classes (the chosen phase, its
generator, keywords, encoder and index); this module is the one place outside
``coevo/methods`` that knows which of a method's parts a served model needs.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, TYPE_CHECKING

import numpy as np
import pandas as pd

from coevo.io import read_json, write_json, write_parquet

if TYPE_CHECKING:  # types only: importing them here would pull in heavy libraries or cycles
    from coevo.config import Params
    from coevo.data.schema import Dataset
    from coevo.methods.base import Method
    from coevo.models.generator import Generator

FORMAT_VERSION = 1
FILES = {
    "manifest": "manifest.json",
    "params": "params.json",
    "items": "items.parquet",
    "generator": "generator",
    "index": "index",
    "encoder": "encoder",
}
DEFAULT_K = 10
MAX_QUERY_CHARS = 2000
# Query generation batch on CPU (the methods' own default; 64 on CUDA for CoGR).
CPU_BATCH = 16


class QueryError(ValueError):
    """A query or a search argument is unusable (empty, too long, not a string, bad k)."""


def check_queries(queries: Any, *, max_queries: int | None = None) -> list[str]:
    """The queries as a list of non-empty strings; a :class:`QueryError` names the first bad one."""
    if isinstance(queries, str):
        queries = [queries]
    try:
        queries = list(queries)
    except TypeError:
        raise QueryError(f"queries must be a list of strings, got {type(queries).__name__}") from None
    if not queries:
        raise QueryError("no query given")
    if max_queries is not None and len(queries) > max_queries:
        raise QueryError(f"{len(queries)} queries in one request; at most {max_queries} are accepted "
                         "(send them in smaller batches)")
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise QueryError(f"query {i}: expected a string, got {type(q).__name__} ({q!r})")
        if not q.strip():
            raise QueryError(f"query {i}: empty string (a query needs at least one non-space character)")
        if len(q) > MAX_QUERY_CHARS:
            raise QueryError(f"query {i}: {len(q)} characters; at most {MAX_QUERY_CHARS} are accepted")
    return queries


def check_k(k: Any, *, allow_all: bool = False) -> int | None:
    if k is None and allow_all:
        return None
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= int(k) <= 1000:
        raise QueryError(f"k must be an integer between 1 and 1000, got {k!r}")
    return int(k)


def _generation_batch() -> int:
    import torch

    return 64 if torch.cuda.is_available() else CPU_BATCH


class Retriever(ABC):
    """A trained retriever: ``search(queries, k)`` and ``evaluate(dataset, split)``."""

    method: ClassVar[str]
    #: the key of what the generator wrote, in every search record
    generated: ClassVar[str]
    #: what that is, for the MLflow model's output schema: one string, or a list of strings
    generated_is_list: ClassVar[bool] = False
    #: whether it may be null (GRAPE: a malformed rewrite)
    generated_nullable: ClassVar[bool] = False
    #: the pip packages query time imports beyond torch/transformers/mlflow (the MLflow model's requirements)
    requirements: ClassVar[tuple[str, ...]] = ()

    def __init__(self, manifest: Mapping[str, Any], items: pd.DataFrame, generator: Generator | None,
                 params: Mapping[str, Any] | None = None) -> None:
        self.manifest = dict(manifest)
        self.settings: dict[str, Any] = dict(self.manifest["settings"])
        self.items = items.reset_index(drop=True)
        self.titles = dict(zip(self.items["item_id"].astype(str), self.items["title"].astype(str)))
        self.generator = generator  # None for a method that serves without a language model
        self.params = dict(params or {})
        self._lock = threading.Lock()  # one generation at a time (a served model answers requests in threads)

    # -------------------------------------------------------------------- query time
    @abstractmethod
    def generate(self, queries: Sequence[str]) -> list[Any]:
        """What the generator writes for each query (keywords, a rewrite or a description)."""

    @abstractmethod
    def rank(self, generated: Sequence[Any], k: int | None) -> list[list[tuple[str, float]]]:
        """Ranked (item_id, score) pairs per query, best first, at most ``k`` (None: all)."""

    def searched(self, queries: Sequence[str], generated: Sequence[Any]) -> Sequence[Any]:
        """What :meth:`rank` is given for each query: what the generator wrote (the default), or a
        method's own combination of it with the query (CoHyDE's ``encode``)."""
        return generated

    def search(self, queries: Sequence[str] | str, k: int | None = DEFAULT_K) -> list[dict[str, Any]]:
        """One record per query: ``{query, <generated>, results: [{item_id, title, score}]}``."""
        queries = check_queries(queries)
        k = check_k(k, allow_all=True)
        with self._lock:
            generated = self.generate(queries)
            ranked = self.rank(self.searched(queries, generated), k)
        return [
            {"query": q, self.generated: g,
             "results": [{"item_id": i, "title": self.titles.get(i, ""), "score": float(s)} for i, s in hits]}
            for q, g, hits in zip(queries, generated, ranked)
        ]

    # -------------------------------------------------------------------- evaluation
    def evaluation_queries(self, dataset: Dataset, split: str) -> list[tuple[str, str]]:
        """(query_id, text) of ``split`` in the order the method's own evaluation generates them."""
        relevant = dataset.relevant(split)
        frame = dataset.queries_in(split)
        return [(str(q), str(t)) for q, t in zip(frame["query_id"], frame["text"]) if str(q) in relevant]

    def evaluate(self, dataset: Dataset, split: str = "test", cutoffs: Sequence[int] | None = None):
        """An :class:`~coevo.retrieval.metrics.Evaluation` of this retriever on ``split``:
        per-query values of every metric (CoGR adds the set precision, recall and F1)."""
        from coevo.retrieval.metrics import ranked_evaluation

        cut = self._cutoffs(cutoffs)
        pairs = self.evaluation_queries(dataset, split)
        qrels = dataset.relevant(split)
        if not any(q in qrels for q, _ in pairs):
            raise ValueError(f"{dataset.name}: no {split} query has a relevant item; nothing to evaluate")
        with self._lock:
            texts = [t for _, t in pairs]
            generated = self.searched(texts, self.generate(texts))
            return self._evaluation([q for q, _ in pairs], generated, qrels, cut, ranked_evaluation)

    def _evaluation(self, query_ids, generated, qrels, cutoffs, ranked_evaluation):
        rankings = self.rank(generated, max(cutoffs))
        return ranked_evaluation({q: [i for i, _ in r] for q, r in zip(query_ids, rankings)}, qrels, cutoffs,
                                 query_ids=[q for q in query_ids if q in qrels])

    def _cutoffs(self, cutoffs: Sequence[int] | None) -> tuple[int, ...]:
        from coevo.retrieval.metrics import DEFAULT_CUTOFFS, check_cutoffs

        return check_cutoffs(cutoffs or self.manifest.get("cutoffs") or DEFAULT_CUTOFFS)

    # -------------------------------------------------------------------- description
    @property
    def name(self) -> str:
        """``coevo-<method>-<dataset>``: the registered model name of this retriever."""
        return f"coevo-{self.method}-{self.manifest['dataset']}"

    def describe(self) -> str:
        m = self.manifest
        return (f"{m['method']} on {m['dataset']}: phase {m['phase']} (chosen on val), generator {m['generator']}, "
                f"{len(self.items)} items")

    # -------------------------------------------------------------------- files
    def save(self, dest: str | Path) -> dict[str, Path]:
        """Write the retriever's files into ``dest`` (a new or empty folder); returns {name: path}."""
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        if any(dest.iterdir()):
            raise FileExistsError(f"{dest}: folder is not empty")
        files = {name: dest / FILES[name] for name in ("manifest", "params", "items", "index")}
        write_json(files["manifest"], self.manifest)
        write_json(files["params"], self.params)
        write_parquet(files["items"], self.items)
        if self.generator is not None:
            files["generator"] = dest / FILES["generator"]
            self.generator.save(files["generator"])
        self._save_index(files["index"])
        files.update(self._save_extra(dest))
        return files

    @abstractmethod
    def _save_index(self, path: Path) -> None: ...

    def _save_extra(self, dest: Path) -> dict[str, Path]:
        return {}

    @classmethod
    def load(cls, files: Mapping[str, str | Path] | str | Path) -> "Retriever":
        """A retriever from its files: {name: path} (an MLflow model's artifacts) or a folder."""
        if not isinstance(files, Mapping):
            folder = Path(files)
            files = {name: folder / file for name, file in FILES.items() if (folder / file).exists()}
        files = {k: Path(v) for k, v in files.items()}
        if "manifest" not in files or not files["manifest"].exists():
            raise FileNotFoundError(f"not a coevo retriever: no {FILES['manifest']} among {sorted(map(str, files.values()))}")
        manifest = read_json(files["manifest"])
        if manifest.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{files['manifest']}: format_version {manifest.get('format_version')!r}, "
                             f"this coevo reads {FORMAT_VERSION}")
        method = manifest.get("method")
        try:
            retriever = retriever_class(str(method))
        except ValueError as exc:
            raise ValueError(f"{files['manifest']}: {exc}") from None
        items = pd.read_parquet(files["items"])
        generator = None
        if "generator" in files and files["generator"].exists():
            from coevo.models.generator import Generator

            generator = Generator.load(files["generator"], trainable=False)
        params = read_json(files["params"]) if "params" in files and files["params"].exists() else {}
        return retriever._load(manifest, items, generator, params, files)

    @classmethod
    @abstractmethod
    def _load(cls, manifest, items, generator, params, files) -> "Retriever": ...


def run_manifest(method: str, run: Method, phase: str, generator: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest of a retriever served from phase ``phase`` of ``run`` (a Method): what and whence."""
    cutoffs = getattr(run.params.evaluation, "cutoffs", None)
    return {
        "format_version": FORMAT_VERSION,
        "method": method,
        "dataset": run.dataset.name,
        "phase": phase,
        "phase_key": run.key(phase),
        "data_fingerprint": run.data_fingerprint,
        "generator": generator,
        "seed": run.params.seed,
        "cutoffs": list(cutoffs) if cutoffs else None,
        "settings": dict(settings),
        # two val queries: the logged model's input example
        "examples": [str(t) for t in run.dataset.queries_in("val")["text"].head(2)],
    }


def items_table(dataset: Dataset) -> pd.DataFrame:
    """The items a retriever returns (id, title, text)."""
    items = dataset.items
    return pd.DataFrame({"item_id": items["item_id"].astype(str), "title": items["title"].astype(str),
                         "text": items["text"]})


# ======================================================================== CoGR
class CoGRRetriever(Retriever):
    """Query generator -> keywords -> learned item index -> items ranked by BM25 over keywords."""

    method = "cogr"
    generated = "keywords"
    generated_is_list = True
    requirements = ("bm25s",)

    def __init__(self, manifest, items, generator, item_keywords: Mapping[str, Sequence[str]], params=None) -> None:
        super().__init__(manifest, items, generator, params)
        from coevo.retrieval.bm25 import KeywordBM25

        from coevo.methods.cogr_context import SearchResults

        self.item_keywords = {str(i): list(k) for i, k in item_keywords.items()}
        self.bm25 = KeywordBM25(self.item_keywords)
        self._position = {item: i for i, item in enumerate(self.bm25.item_ids)}
        # The method's query context (cogr.query_context): the same BM25 snippets its evaluation put in the
        # prompts. A model saved before the setting existed had none.
        self.search_results = SearchResults.from_params(self.items, self.settings.get("context", {}))

    def generate(self, queries: Sequence[str]) -> list[list[str]]:
        # The method's keyword generation (CoGR._generate_keywords, local backend): greedy,
        # parsed, normalised, cut at k_max, from the method's own query prompts.
        from coevo.methods.cogr_context import query_prompt
        from coevo.retrieval.keywords import parse_keywords

        snippets = self.search_results.for_texts(queries) if self.search_results else [() for _ in queries]
        system_prompt = self.settings.get("context", {}).get("system_prompt", "full")  # older models: full
        outputs = self.generator.generate(
            [query_prompt(q, s, system_prompt) for q, s in zip(queries, snippets)], batch_size=_generation_batch(),
            temperature=0.0, max_new_tokens=self.settings["max_new_tokens"], seed=self.manifest["seed"],
            progress=False, description="query keywords")
        return [list(parse_keywords(out[0]).keywords[: self.settings["k_max"]]) for out in outputs]

    def rank(self, generated: Sequence[Sequence[str]], k: int | None) -> list[list[tuple[str, float]]]:
        out = []
        for keywords in generated:
            scores = self.bm25.scores(keywords)
            ranked = self.bm25.rank(keywords, candidates=None, k=k)
            out.append([(i, float(scores[self._position[i]])) for i in ranked])
        return out

    def evaluation_queries(self, dataset: Dataset, split: str) -> list[tuple[str, str]]:
        # CoGR.evaluate generates for every query of the split, sorted by id.
        frame = dataset.queries_in(split)
        text = dict(zip(frame["query_id"].astype(str), frame["text"].astype(str)))
        return [(q, text[q]) for q in sorted(text)]

    def _evaluation(self, query_ids, generated, qrels, cutoffs, ranked_evaluation):
        from coevo.retrieval.evaluate import keyword_retrieval_evaluation

        keywords = dict(zip(query_ids, generated))
        return keyword_retrieval_evaluation(keywords, self.item_keywords, qrels, cutoffs,
                                            query_ids=[q for q in query_ids if q in qrels])

    def _save_index(self, path: Path) -> None:
        from coevo.retrieval.inverted_index import InvertedIndex

        InvertedIndex.from_keyword_sets(self.item_keywords).save(path)

    @classmethod
    def _load(cls, manifest, items, generator, params, files) -> "CoGRRetriever":
        from coevo.retrieval.inverted_index import InvertedIndex

        index = InvertedIndex.load(files["index"])
        return cls(manifest, items, generator, {d: list(k) for d, k in index.keyword_sets().items()}, params)

    @classmethod
    def from_run(cls, run_dir: Path, params: Params, dataset_dir: Path) -> "CoGRRetriever":
        from coevo.methods.cogr import CoGR, QUERY

        run = CoGR(run_dir, params, dataset_dir)
        phase = run.best_phase()
        index = run.phase_index(phase)
        generator = run.generators(index)[QUERY]
        cfg = params.cogr
        settings = {"k_max": cfg.k_max, "max_new_tokens": cfg.sampling.max_new_tokens,
                    "context": {"query_context": cfg.query_context, "item_context": cfg.item_context,
                                "system_prompt": cfg.system_prompt,
                                "search_results": cfg.search_results.model_dump(mode="json")}}
        manifest = run_manifest("cogr", run, phase, cfg.generator, settings)
        return cls(manifest, items_table(run.dataset), generator, run.keywords(index)["items"],
                   params.model_dump(mode="json"))


# ======================================================================== dense (GRAPE, CoHyDE)
class _DenseRetriever(Retriever):
    requirements = ("faiss-cpu", "sentence-transformers")

    def __init__(self, manifest, items, generator, index: Any, params=None) -> None:
        super().__init__(manifest, items, generator, params)
        self.index = index

    @abstractmethod
    def embed(self, texts: Sequence[str]) -> np.ndarray: ...

    def _embed_generated(self, generated: Sequence[Any]) -> np.ndarray:
        return self.embed([g if isinstance(g, str) else "" for g in generated])  # malformed: the empty string

    def rank(self, generated: Sequence[Any], k: int | None) -> list[list[tuple[str, float]]]:
        ids, scores = self.index.search(self._embed_generated(generated), k or len(self.index))
        return [[(i, float(s)) for i, s in zip(row_ids, row_scores)] for row_ids, row_scores in zip(ids, scores)]

    def _evaluation(self, query_ids, generated, qrels, cutoffs, ranked_evaluation):
        """Ranked metrics at the cut-offs, plus ``mrr``: the reciprocal of the exact whole-corpus
        rank of the best-ranked relevant item (GRAPE's full MRR)."""
        from coevo.retrieval.metrics import Evaluation

        embs = self._embed_generated(generated)
        ids, _ = self.index.search(embs, max(cutoffs))
        counted = [q for q in query_ids if q in qrels]
        ranked = ranked_evaluation(dict(zip(query_ids, ids)), qrels, cutoffs, query_ids=counted)
        row_of = {q: j for j, q in enumerate(query_ids)}
        mrr = {}
        for q in ranked.query_ids:
            relevant = [i for i, g in qrels[q].items() if g > 0 and i in self.index.row_of]
            if not relevant:
                mrr[q] = 0.0
                continue
            ranks = self.index.exact_ranks(np.repeat(embs[row_of[q]][None, :], len(relevant), axis=0),
                                           self.index.rows(relevant))
            mrr[q] = float(1.0 / ranks.min())
        return Evaluation({**ranked.per_query, "mrr": mrr}, ranked.query_ids, ranked.n_without_relevant)

    def _save_index(self, path: Path) -> None:
        self.index.save(path)


class GrapeRetriever(_DenseRetriever):
    """Trained rewriter -> rewrite -> frozen retriever (text encoder or CLIP) -> corpus index."""

    method = "grape"
    generated = "rewrite"
    generated_nullable = True  # null: the rewrite was malformed

    def __init__(self, manifest, items, generator, index, frozen: Any = None, params=None) -> None:
        super().__init__(manifest, items, generator, index, params)
        self.frozen = frozen if frozen is not None else self._frozen_retriever()
        self.frozen.attach(index)

    def _frozen_retriever(self):
        spec = self.settings["retriever"]
        if spec["kind"] == "text":
            from coevo.models.encoder import TextRetriever

            return TextRetriever(spec["text_encoder"])
        from coevo.models.clip import ClipRetriever

        return ClipRetriever(spec["clip_model"], pretrained=spec.get("clip_pretrained"), seed=self.manifest["seed"])

    @property
    def query_mode(self) -> str:
        """grape.query_mode of the served run (models registered before the knob existed replace)."""
        return self.settings.get("query_mode", "replace")

    def generate(self, queries: Sequence[str]) -> list[str | None]:
        # Grape.rewrite (local backend): greedy completion, parsed; None when malformed.
        from coevo.methods.grape import rewrite_messages
        from coevo.rewards.grape import RewriteParser

        s = self.settings
        mode = self.query_mode
        outputs = self.generator.generate(
            [rewrite_messages(q, s["retriever"]["kind"], s["reasoning"], s["max_reasoning_tokens"], mode)
             for q in queries],
            batch_size=CPU_BATCH, temperature=0.0, max_new_tokens=s["max_new_tokens"], progress=False,
            description="rewriting")
        tokenizer = self.generator.tokenizer

        def count(text: str) -> int:
            return len(tokenizer(text, add_special_tokens=False)["input_ids"])

        parser = RewriteParser(s["reasoning"], s["max_reasoning_tokens"], count)
        return [parser(out[0]) for out in outputs]  # None for a malformed rewrite, as the record shows it

    def searched(self, queries: Sequence[str], generated: Sequence[str | None]) -> list[Any]:
        # grape.query_mode: the rewrite alone (replace; a malformed one searches the empty string), the
        # query followed by it (expand), or the pair, embedded apart and mixed (mix), as Grape's evaluation.
        from coevo.rewards.grape import searched_text

        if self.query_mode == "mix":
            return list(zip(queries, generated))
        return [searched_text(q, r, self.query_mode) for q, r in zip(queries, generated)]

    def _embed_generated(self, generated: Sequence[Any]) -> np.ndarray:
        if self.query_mode != "mix":
            return super()._embed_generated(generated)
        from coevo.rewards.grape import search_embeddings

        queries, rewrites = zip(*generated) if generated else ((), ())
        return search_embeddings(self.embed, queries, rewrites, "mix", self.settings["mix_weight"])

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self.frozen.embed_queries(list(texts))

    @classmethod
    def _load(cls, manifest, items, generator, params, files) -> "GrapeRetriever":
        from coevo.retrieval.dense import DenseIndex

        return cls(manifest, items, generator, DenseIndex.load(files["index"]), params=params)

    @classmethod
    def from_run(cls, run_dir: Path, params: Params, dataset_dir: Path) -> "GrapeRetriever":
        from coevo.methods.grape import TRAINED, Grape
        from coevo.models.generator import Generator

        run = Grape(run_dir, params, dataset_dir)
        phase = run.best_phase()
        if phase != TRAINED or not run.is_done(TRAINED):
            raise FileNotFoundError(f"{run_dir}: the GRAPE run has not finished training (last phase: {phase}); "
                                    "run the train stage first")
        cfg = params.grape
        phase = run.chosen_stage()  # with a warm start, the better on val of it and GRPO
        generator = Generator.load(run.rewriter_dir(phase), trainable=False)
        frozen = run.retriever  # the frozen retriever with the run's corpus index attached
        settings = {
            "retriever": {"kind": cfg.retriever, "text_encoder": cfg.text_encoder, "clip_model": cfg.clip_model,
                          "clip_pretrained": cfg.clip_pretrained},
            "reasoning": cfg.reasoning, "max_reasoning_tokens": cfg.max_reasoning_tokens,
            "query_mode": cfg.query_mode, "mix_weight": cfg.mix_weight,
            "max_new_tokens": run.completion_budget(cfg.sampling.max_new_tokens),
        }
        manifest = run_manifest("grape", run, phase, cfg.generator, settings)
        return cls(manifest, items_table(run.dataset), generator, frozen.index, frozen=frozen,
                   params=params.model_dump(mode="json"))


class CoHyDERetriever(_DenseRetriever):
    """Rewriter -> tool description -> co-trained encoder -> that encoder's faiss index."""

    method = "cohyde"
    generated = "description"

    def __init__(self, manifest, items, generator, index, encoder: Any, params=None) -> None:
        super().__init__(manifest, items, generator, index, params)
        self.encoder = encoder

    def generate(self, queries: Sequence[str]) -> list[str]:
        # CoHyDE.describe (local backend): one greedy description per query.
        from coevo.methods.cohyde import rewriter_messages

        outputs = self.generator.generate(
            [rewriter_messages(q) for q in queries], num_return_sequences=1, batch_size=CPU_BATCH, temperature=0.0,
            max_new_tokens=self.settings["max_new_tokens"], seed=self.manifest["seed"], progress=False,
            description="describing")
        return [out[0] for out in outputs]

    def searched(self, queries: Sequence[str], generated: Sequence[str]) -> list[str]:
        from coevo.methods.cohyde import searched_text

        encode = self.settings.get("encode", "description")  # models registered before the knob encode it alone
        return [searched_text(q, d, encode) for q, d in zip(queries, generated)]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        from coevo.rewards.cohyde import encode_texts

        return encode_texts(self.encoder, list(texts))

    def _save_extra(self, dest: Path) -> dict[str, Path]:
        path = dest / FILES["encoder"]
        self.encoder.save(str(path))
        return {"encoder": path}

    @classmethod
    def _load(cls, manifest, items, generator, params, files) -> "CoHyDERetriever":
        from coevo.models.encoder import load_text_encoder
        from coevo.retrieval.dense import DenseIndex

        return cls(manifest, items, generator, DenseIndex.load(files["index"]),
                   load_text_encoder(str(files["encoder"])), params)

    @classmethod
    def from_run(cls, run_dir: Path, params: Params, dataset_dir: Path) -> "CoHyDERetriever":
        from coevo.methods import cohyde

        run = cohyde.CoHyDE(run_dir, params, dataset_dir)
        phase = run.best_phase()
        encoder_stage, generator_stage = run.stages(phase)
        if generator_stage is None:
            raise ValueError(f"CoHyDE phase {phase!r} has no rewriter to serve (expected hyde or round_<r>)")
        generator = run.rewriter(generator_stage)
        encoder = run.encoder(encoder_stage)
        index = run.index(encoder_stage)
        cfg = params.cohyde
        settings = {"max_new_tokens": cfg.max_new_tokens, "encoder_stage": encoder_stage,
                    "generator_stage": generator_stage, "encode": cfg.encode}
        manifest = run_manifest("cohyde", run, phase, cfg.generator, settings)
        return cls(manifest, items_table(run.dataset), generator, index, encoder, params.model_dump(mode="json"))


def retriever_class(method: str) -> type[Retriever]:
    """The retriever of a registered method (its spec's ``retriever``)."""
    from coevo.methods import spec_of

    return spec_of(method).retriever_class()


# ======================================================================== opening a model
def from_run(method: str, run_dir: str | Path, params: Params, dataset_dir: str | Path) -> Retriever:
    """The retriever of a finished run: the phase chosen on val, with its generator and index.

    ``params`` must be those the run was trained with (each phase's key covers its params and
    the data), otherwise its phases do not count as finished.
    """
    retriever = retriever_class(method)
    run_dir, dataset_dir = Path(run_dir), Path(dataset_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: run directory does not exist")
    from coevo.methods.base import PhaseNotReady

    try:
        return retriever.from_run(run_dir, params, dataset_dir)
    except PhaseNotReady as exc:
        raise FileNotFoundError(
            f"{exc}. If the run did finish, it was trained with other params or data than these: pass the same "
            "--params / --set (and --data) it was trained with"
        ) from None


def method_of_run_dir(run_dir: Path) -> str | None:
    """``<root>/models/<method>/<dataset>`` (the pipeline's layout) names its method."""
    from coevo.methods import SPECS

    parent = Path(run_dir).resolve().parent.name
    return parent if parent in SPECS else None
