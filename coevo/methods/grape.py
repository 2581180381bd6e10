"""GRAPE: train a query rewriter by GRPO against a frozen retriever, rewarded by corpus rank.

The retriever (a sentence-transformers text encoder, or an open_clip model over images)
never changes; only the rewriter (a :class:`~coevo.models.generator.Generator`, LoRA by
default) learns. The reward is the exact rank of the relevant item among all N corpus
items (:class:`~coevo.rewards.grape.RankReward`); ``grape.reward: similarity`` is the
ablation that rewards the raw cosine similarity instead, ``reciprocal_rank`` the one that
rewards 1 / rank.

``grape.query_mode`` says what the retriever searches: the rewrite alone (``replace``, the
paper's), the query followed by the rewrite (``expand``, query2doc-style), or the query's
embedding plus ``grape.mix_weight`` times the rewrite's (``mix``; both of these prompt for
words to add). The raw-query row is the query as typed in every mode.

Score-inflation monitor: every evaluation records both ``mean_relevant_similarity`` (mean
cosine of the query with its relevant items) and ``recall@1``. A rewriter that learns to
raise every similarity at once shows the first curve rising while the second does not.

Phases over one run directory (:class:`coevo.methods.base.Method` decides what re-runs):

- ``index``       embed the corpus once with the frozen retriever; faiss index artifact
- ``raw``, ``untrained``  Recall@1/5/10, MRR@10, full MRR, NDCG@10 and the monitor pair on
                  the val split for the query as typed and for the base rewriter
- ``sft``         only with ``grape.sft_warmup``: SFT of the base rewriter on (training query ->
                  its relevant item as the retriever indexes it), evaluated on the val split
- ``train``       GRPO for ``grape.grpo.steps`` steps (from the warm start when there is one);
                  every ``eval_every`` steps the monitor evaluates the current rewriter on val
- ``trained``     the trained rewriter on the val split
The test split is read once, by :meth:`Grape.final_evaluation`.

Layout of ``run_dir``::

    stamps/<phase>.json         each finished phase's key and record (coevo.steps)
    index/                      DenseIndex of the corpus (faiss + ids + manifest)
    base_generator/             the untrained rewriter (the start of training)
    sft_generator/              the warm-started rewriter (grape.sft_warmup)
    generator/                  the trained rewriter
    train/                      TRL output folder
    monitor/step_<n>.json       monitor evaluations during training
    eval/<stage>.json           val metrics (+ example rewrites)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from coevo.config import GrapeParams, Params
from coevo.io import read_json, write_json
from coevo.methods.base import MONITOR_SPLIT, Method, Phase
from coevo.retrieval.dense import FrozenRetriever

if TYPE_CHECKING:  # types only: the generator module pulls in torch and transformers
    from coevo.models.generator import Generator

log = logging.getLogger(__name__)

RAW, UNTRAINED, SFT, TRAINED = "raw", "untrained", "sft", "trained"
EVAL_KS: tuple[int, ...] = (1, 5, 10)
N_EXAMPLES = 8  # example rewrites stored with each evaluation

SYSTEM_PROMPT = (
    "You rewrite search queries for a search engine over {corpus}. Keep the user's intent and "
    "use the words that the right {item} would be described with."
)
PLAIN_INSTRUCTION = "Answer with the rewritten query only, on one line."
# expand mode: the retriever searches the query followed by these words, so ask for words to add
# (SmolLM2-135M asked for a rewrite copies the query, which adds nothing to search).
EXPAND_SYSTEM_PROMPT = (
    "You expand search queries for a search engine over {corpus}. Add the words that the right {item} "
    "would be described with: what it does and its domain."
)
EXPAND_INSTRUCTION = "Answer with the added words only, on one line."
REASONING_INSTRUCTION = (
    "First think briefly after 'Reasoning:' (at most {max_words} words), then write the rewritten "
    "query on one line after 'Rewrite:'."
)
CORPUS_WORDS = {"text": ("tool descriptions", "tool"), "clip": ("photographs", "photo (described in English)")}


def rewrite_messages(query: str, retriever_kind: str = "text", reasoning: bool = False,
                     max_reasoning_tokens: int = 32, query_mode: str = "replace") -> list[dict[str, str]]:
    """Chat prompt asking for a rewrite, or in expand mode for words to add to the query
    (optionally after a capped reasoning section)."""
    corpus, item = CORPUS_WORDS.get(retriever_kind, CORPUS_WORDS["text"])
    expand = query_mode in ("expand", "mix")  # both add to the query: the same prompt
    instruction = (REASONING_INSTRUCTION.format(max_words=max_reasoning_tokens) if reasoning
                   else EXPAND_INSTRUCTION if expand else PLAIN_INSTRUCTION)
    system = EXPAND_SYSTEM_PROMPT if expand else SYSTEM_PROMPT
    return [
        {"role": "system", "content": system.format(corpus=corpus, item=item)},
        {"role": "user", "content": f"Query: {query.strip()}\n{instruction}"},
    ]


def make_retriever(params: GrapeParams, device: str | None = None, seed: int = 0) -> FrozenRetriever:
    """The frozen retriever named by params: ``text`` (sentence-transformers) or ``clip``."""
    if params.retriever == "text":
        from coevo.models.encoder import TextRetriever

        return TextRetriever(params.text_encoder, device=device)
    from coevo.models.clip import ClipRetriever

    return ClipRetriever(params.clip_model, pretrained=params.clip_pretrained, device=device, seed=seed)


RETRIEVER_KNOBS = ("retriever", "text_encoder", "clip_model", "clip_pretrained")
REWRITER_KNOBS = ("generator", "lora", "sampling", "reasoning", "max_reasoning_tokens", "query_mode", "mix_weight")
SFT_KNOBS = ("sft_warmup", "sft", "sft_max_examples")


class Grape(Method):
    """One GRAPE run: phases over ``run_dir`` on the processed dataset in ``dataset_dir``."""

    name = "grape"
    title = "GRAPE"
    code = ("coevo.methods.base", "coevo.methods.grape", "coevo.models", "coevo.train", "coevo.rewards.grape",
            "coevo.retrieval", "coevo.data.schema", "coevo.io", "coevo.runtime", "coevo.compute")
    table_metrics = ("recall@1", "recall@10", "mrr")
    paper_baseline = RAW

    def __init__(self, run_dir: str | Path, params: Params, dataset_dir: str | Path, *, progress: bool = False,
                 data_fingerprint: str | None = None, device: str | None = None,
                 retriever: FrozenRetriever | None = None) -> None:
        super().__init__(run_dir, params, dataset_dir, progress=progress, data_fingerprint=data_fingerprint)
        self.cfg: GrapeParams = params.grape
        self.device = device
        self._retriever = retriever  # injectable (tests, a pre-loaded model)
        self._generator = None  # the rewriter being trained, while train() runs

    # ---------------------------------------------------------------- phases
    def phases(self) -> list[Phase]:
        g = lambda *names: ("seed", *(f"grape.{n}" for n in names))  # noqa: E731
        warm = self.cfg.sft_warmup
        return [
            Phase("index", "corpus index (frozen retriever)", g(*RETRIEVER_KNOBS), ("index",)),
            Phase(RAW, "raw queries", (), ("eval/raw.json",), reads=("index",)),
            Phase(UNTRAINED, "untrained rewriter", g(*REWRITER_KNOBS), ("base_generator", "eval/untrained.json"),
                  reads=("index",)),
            *([Phase(SFT, "SFT warm start", g(*REWRITER_KNOBS, *SFT_KNOBS),
                     ("sft_generator", "eval/sft.json"), reads=(UNTRAINED,))] if warm else []),
            Phase("train", f"GRPO ({self.cfg.grpo.steps} steps, {self.cfg.reward} reward)",
                  g(*type(self.cfg).model_fields), ("train", "generator", "monitor"), reads=(SFT if warm else UNTRAINED,)),
            Phase(TRAINED, "trained rewriter", (), ("eval/trained.json",), reads=("train",)),
        ]

    def _run(self, phase: Phase) -> dict[str, Any]:
        if phase.name == "index":
            return self.build_index()
        if phase.name == "train":
            return self.train()
        if phase.name == SFT:
            return self.warm_start()
        result = self.evaluate(phase.name)
        return {"stage": phase.name, "step": result["step"], "eval": _numbers(result["splits"][MONITOR_SPLIT])}

    def queries(self, split: str) -> list[dict[str, Any]]:
        """Queries of ``split`` with at least one relevant item: {query_id, text, relevant}."""
        relevant = self.dataset.relevant(split)
        out = []
        for row in self.dataset.queries_in(split).to_dict(orient="records"):
            qid = str(row["query_id"])
            if relevant.get(qid):
                out.append({"query_id": qid, "text": str(row["text"]), "relevant": relevant[qid]})
        return out


    # ------------------------------------------------------------- artifacts
    @property
    def index_dir(self) -> Path:
        return self.run_dir / "index"

    @property
    def base_generator_dir(self) -> Path:
        return self.run_dir / "base_generator"

    @property
    def sft_generator_dir(self) -> Path:
        return self.run_dir / "sft_generator"

    @property
    def generator_dir(self) -> Path:
        return self.run_dir / "generator"

    def rewriter_dir(self, stage: str) -> Path:
        """Where the rewriter of a trained stage is saved (``sft`` or ``trained``)."""
        return self.sft_generator_dir if stage == SFT else self.generator_dir

    def eval_path(self, stage: str) -> Path:
        folder = "monitor" if stage.startswith("step_") else "eval"
        return self.run_dir / folder / f"{stage}.json"

    # ------------------------------------------------------------- retriever
    @property
    def retriever(self) -> FrozenRetriever:
        if self._retriever is None:
            self._retriever = make_retriever(self.cfg, self.device, self.seed)
        if self._retriever.index is None:
            self.build_index()
        return self._retriever

    def build_index(self) -> dict[str, Any]:
        """Embed the corpus once (or reload the saved index built by the same encoder)."""
        from coevo.retrieval.dense import DenseIndex

        if self._retriever is None:
            self._retriever = make_retriever(self.cfg, self.device, self.seed)
        retriever = self._retriever
        if (self.index_dir / "manifest.json").exists():
            retriever.attach(DenseIndex.load(self.index_dir))
        else:
            items = self.dataset.items.to_dict(orient="records")
            log.info("embedding %d corpus items with %s", len(items), retriever.encoder_id)
            self._index_corpus(retriever, items).save(self.index_dir)
        assert retriever.index is not None
        return retriever.index.manifest()

    def _index_corpus(self, retriever: FrozenRetriever, items: list[dict[str, Any]]):
        """Corpus embedding through coevo.compute for text encoders (local: the encoder's own call;
        ray: Ray Data shards, the encoder loaded once per worker; same vectors). CLIP embeds images
        in process."""
        from coevo.models.encoder import TextRetriever, item_text

        if not isinstance(retriever, TextRetriever):
            return retriever.index_corpus(items)
        from coevo.compute import embed_texts
        from coevo.retrieval.dense import DenseIndex

        emb = embed_texts(retriever.model, [item_text(it["title"], it.get("text")) for it in items],
                          compute=self.params.compute, checkpoint=retriever.name, scratch=self.run_dir / "scratch",
                          batch_size=retriever.batch_size, progress=len(items) > 256)
        return retriever.attach(DenseIndex.build([str(it["item_id"]) for it in items], emb,
                                                 encoder=retriever.encoder_id))

    # ------------------------------------------------------------- rewriter
    def _corpus_text(self) -> list[str]:
        """Text the `tiny` generator's tokenizer is trained on (ignored by real models)."""
        items = self.dataset.items
        texts = [self.dataset.item_text(i) for i in items["item_id"]]
        return texts + [q["text"] for q in self.queries("train")] + [
            m["content"] for m in rewrite_messages("x", self.cfg.retriever, self.cfg.reasoning,
                                                   query_mode=self.cfg.query_mode)]

    def base_generator(self):
        """The untrained rewriter, saved once so the untrained stage and training share it."""
        from coevo.models.generator import Generator

        if (self.base_generator_dir / "generator.json").exists():
            return Generator.load(self.base_generator_dir)
        generator = Generator.create(self.cfg.generator, lora=self.cfg.lora, seed=self.seed,
                                     corpus=self._corpus_text())
        generator.save(self.base_generator_dir)
        return generator

    def parser(self, tokenizer: Any = None):
        from coevo.rewards.grape import RewriteParser

        count = None
        if tokenizer is not None:
            def count(text: str) -> int:
                return len(tokenizer(text, add_special_tokens=False)["input_ids"])
        return RewriteParser(self.cfg.reasoning, self.cfg.max_reasoning_tokens, count)

    def completion_budget(self, base: int) -> int:
        """New tokens for a rewrite; the capped reasoning section gets its own budget on top."""
        return base + (self.cfg.max_reasoning_tokens + 8 if self.cfg.reasoning else 0)

    def _prompt(self, query: str) -> list[dict[str, str]]:
        return rewrite_messages(query, self.cfg.retriever, self.cfg.reasoning, self.cfg.max_reasoning_tokens,
                                self.cfg.query_mode)

    def rewrite(self, generator: Generator, texts: Sequence[str]) -> tuple[list[str], list[str | None]]:
        """Greedy rewrites: (raw completions, parsed rewrites or None when malformed)."""
        from coevo.compute import generate_texts

        completions = [c[0] for c in generate_texts(
            generator, [self._prompt(t) for t in texts], compute=self.params.compute,
            scratch=self.run_dir / "scratch", temperature=0.0,
            max_new_tokens=self.completion_budget(self.cfg.sampling.max_new_tokens),
            progress=len(texts) > 32, description="rewriting")]
        parser = self.parser(generator.tokenizer)
        return completions, [parser(c) for c in completions]

    # ------------------------------------------------------------ evaluation
    def searched(self, texts: Sequence[str], rewrites: Sequence[str | None]) -> list[str]:
        """What the frozen retriever searches for each query (``grape.query_mode``), as words."""
        from coevo.rewards.grape import searched_text

        return [searched_text(t, r, self.cfg.query_mode) for t, r in zip(texts, rewrites)]

    def search_embeddings(self, texts: Sequence[str], rewrites: Sequence[str | None]) -> np.ndarray:
        """What the frozen retriever searches for each query (``grape.query_mode``), as embeddings."""
        from coevo.rewards.grape import search_embeddings

        return search_embeddings(self.retriever.embed_queries, texts, rewrites, self.cfg.query_mode,
                                 self.cfg.mix_weight)

    def score_queries(self, queries: Sequence[Mapping[str, Any]], rewrites: Sequence[str | None],
                      embs: np.ndarray, *, cutoffs: Sequence[int] = EVAL_KS,
                      per_query: bool = False) -> dict[str, Any]:
        """Retrieval metrics (at ``cutoffs``) and the inflation monitor for one split's
        (rewritten) queries; with ``per_query``, also the ranked metrics' per-query values
        (``per_query``: {metric: {query_id: value}}).

        ``embs`` are what the retriever searches per query (:meth:`search_embeddings`); a
        malformed rewrite is searched as the empty string (retrieval with nothing) in replace mode
        and as the query in expand and mix mode, and counted in ``malformed_fraction``.
        """
        from coevo.retrieval.metrics import ranked_evaluation
        from coevo.rewards.grape import rank_reward

        retriever = self.retriever
        index = retriever.index
        assert index is not None
        rankings = index.rank_corpus(embs, k=max(cutoffs))
        qrels = {q["query_id"]: q["relevant"] for q in queries}
        evaluation = ranked_evaluation({q["query_id"]: r for q, r in zip(queries, rankings)}, qrels, cutoffs)
        metrics = evaluation.means()
        kept = [k for k in sorted(metrics) if k.split("@")[0] in ("recall", "mrr", "ndcg")]
        # Exact ranks and similarities of every (query, relevant item) pair.
        owners = np.concatenate([np.full(len(q["relevant"]), j) for j, q in enumerate(queries)])
        rows = index.rows([item for q in queries for item in q["relevant"]])
        ranks = index.exact_ranks(embs[owners], rows)
        sims = index.pair_scores(embs[owners], rows)
        counts = np.bincount(owners, minlength=len(queries))
        best_rank = np.full(len(queries), np.inf)
        np.minimum.at(best_rank, owners, ranks)
        return {
            **{k: metrics[k] for k in kept},
            **({"per_query": {k: evaluation.per_query[k] for k in kept}} if per_query else {}),
            "mrr": float(np.mean(1.0 / best_rank)),
            "mean_relevant_similarity": float(np.mean(np.bincount(owners, weights=sims) / counts)),
            "mean_rank_reward": float(np.mean(np.bincount(owners, weights=rank_reward(ranks, len(index))) / counts)),
            "malformed_fraction": float(np.mean([r is None for r in rewrites])),
            "n_queries": len(queries),
        }

    def evaluate(self, stage: str, *, splits: Sequence[str] = (MONITOR_SPLIT,), generator: Generator | None = None,
                 step: int | None = None, store: bool = True, cutoffs: Sequence[int] = EVAL_KS,
                 per_query: bool = False) -> dict[str, Any]:
        """Evaluate ``raw``, ``untrained``, ``trained`` (or a mid-training ``step_<n>`` with
        the given generator) on ``splits``; stored in eval/<stage>.json (monitor/ for steps)."""
        path = self.eval_path(stage)
        if store and path.exists():
            return read_json(path)
        self.require_val()
        splits = list(splits)
        if step is None:
            step = {UNTRAINED: 0, SFT: 0, TRAINED: self.cfg.grpo.steps}.get(stage)
        if stage != RAW and generator is None:
            from coevo.models.generator import Generator

            if stage == UNTRAINED:
                generator = self.base_generator()
            elif stage in (SFT, TRAINED):
                folder = self.rewriter_dir(stage)
                what = ("no warm-started rewriter (run warm_start() first)" if stage == SFT
                        else "no trained rewriter (run train() first)")
                if not (folder / "generator.json").exists():
                    raise FileNotFoundError(f"{folder}: {what}")
                generator = Generator.load(folder, trainable=False)
            else:
                raise ValueError(f"unknown GRAPE stage {stage!r} (expected raw, untrained, sft or trained)")
        self._set_threads()
        result: dict[str, Any] = {"stage": stage, "step": step, "reward": self.cfg.reward, "splits": {}}
        for split in splits:
            queries = self.queries(split)
            texts = [q["text"] for q in queries]
            if stage == RAW:
                completions, rewrites, searched = texts, list(texts), list(texts)
                embs = self.retriever.embed_queries(texts)
            else:
                completions, rewrites = self.rewrite(generator, texts)
                searched = self.searched(texts, rewrites)
                embs = self.search_embeddings(texts, rewrites)
            metrics = self.score_queries(queries, rewrites, embs, cutoffs=cutoffs, per_query=per_query)
            metrics["examples"] = [{"query": t, "completion": c, "rewrite": r, "searched": x}
                                   for t, c, r, x in list(zip(texts, completions, rewrites, searched))[:N_EXAMPLES]]
            result["splits"][split] = metrics
            if not queries:
                raise ValueError(f"{self.dataset_dir}: no {split} query has a relevant item; nothing to evaluate")
            log.info("GRAPE %s %s: recall@1=%.3f recall@10=%.3f mean_sim=%.3f", stage, split,
                     metrics["recall@1"], metrics["recall@10"], metrics["mean_relevant_similarity"])
        if store:
            write_json(path, result)
        return result

    def final_stages(self) -> tuple[str, ...]:
        return (RAW, UNTRAINED, SFT, TRAINED) if self.cfg.sft_warmup else (RAW, UNTRAINED, TRAINED)

    def chosen_stage(self) -> str:
        """The trained rewriter, or with a warm start the better on val (recall@10) of it and GRPO."""
        if not self.cfg.sft_warmup:
            return TRAINED
        val = {stage: read_json(self.eval_path(stage))["splits"][MONITOR_SPLIT]["recall@10"] for stage in (SFT, TRAINED)}
        return SFT if val[SFT] > val[TRAINED] else TRAINED

    def final_evaluation(self, split: str) -> dict[str, Any]:
        """Raw queries, the untrained, warm-started (``grape.sft_warmup``) and trained rewriter,
        evaluated once on ``split`` at the ``evaluation.cutoffs``; each row keeps its per-query
        values (``per_query``) for the paired comparisons of the final table (the phase val
        chose vs the untrained start)."""
        rows = []
        for stage in self.final_stages():
            metrics = self.evaluate(stage, splits=[split], store=False, cutoffs=self.params.evaluation.cutoffs,
                                    per_query=True)["splits"][split]
            rows.append({"label": stage, "phase": stage, "split": split, **_numbers(metrics),
                         "per_query": metrics["per_query"]})
        return {"split": split, "best_phase": self.chosen_stage(), "start_phase": UNTRAINED, "rows": rows}

    def write_reports(self, metrics_file: Path, plots_csv: Path, report_dir: Path, final: Mapping[str, Any],
                      baselines: Mapping[str, Any]) -> list[str]:
        """metrics.json (val rows, the final split's rows), the monitor CSV and plot, examples."""
        from coevo import report

        table = self.table()
        history = self.history()
        write_json(metrics_file, {"reward": self.cfg.reward, MONITOR_SPLIT: table,
                                  final["split"]: {r["label"]: r for r in final["rows"]}, "baselines": baselines})
        report.write_csv(history, plots_csv)
        if history:
            report.plot_series(
                [r["step"] for r in history],
                {"recall@1": [r["recall@1"] for r in history],
                 "mean relevant similarity": [r["mean_relevant_similarity"] for r in history]},
                report_dir / "monitor.png", xlabel="GRPO step", ylabel="recall@1",
                title=f"score-inflation monitor ({self.cfg.reward} reward)", secondary=["mean relevant similarity"],
            )
        examples = {stage: read_json(self.eval_path(stage))["splits"][MONITOR_SPLIT].get("examples", [])
                    for stage in table}
        write_json(report_dir / "examples.json", examples)
        return sorted(str(p) for p in report_dir.iterdir() if p.is_file()) + [str(metrics_file), str(plots_csv)]

    def tracking_series(self) -> list[tuple[int, dict[str, float]]]:
        """The monitor curve by GRPO step (val): Recall@1 next to mean relevant similarity."""
        return [(r["step"], {f"monitor/{k}": v for k, v in r.items() if isinstance(v, float)}) for r in self.history()]

    # ---------------------------------------------------------------- training
    def train_prompts(self) -> list[dict[str, Any]]:
        queries = self.queries("train")
        if not queries:
            raise ValueError(f"{self.dataset_dir}: no training query has a relevant item")
        return [{"prompt": self._prompt(q["text"]), "query_id": q["query_id"]} for q in queries]

    def reward_fn(self, tokenizer: Any = None):
        """The GRPO reward over training qrels: ``reward_fn(completions, query_id)``."""
        from coevo.rewards.grape import make_reward

        queries = self.queries("train")
        qrels = {q["query_id"]: list(q["relevant"]) for q in queries}
        texts = {q["query_id"]: q["text"] for q in queries} if self.cfg.query_mode != "replace" else None
        reward = make_reward(self.cfg.reward, self.retriever, qrels, self.parser(tokenizer), texts,
                             self.cfg.query_mode, self.cfg.mix_weight)

        def grape_reward(completions: list[str], query_id: list[str]) -> list[float]:
            return reward(query_id, completions)

        grape_reward.__name__ = f"{self.cfg.reward}_reward"
        return grape_reward

    def sft_examples(self, tokenizer: Any) -> list[dict[str, Any]]:
        """The warm start's rows: a training query's prompt -> its first relevant item as the
        retriever indexes it, cut at a word boundary to fit the completion budget (seeded cap)."""
        import random

        from coevo.models.generator import SFT_TARGET_SLACK, cut_to_tokens

        queries = self.queries("train")
        if self.cfg.sft_max_examples is not None and len(queries) > self.cfg.sft_max_examples:
            queries = random.Random(self.seed).sample(queries, self.cfg.sft_max_examples)
        budget = min(self.cfg.sampling.max_new_tokens, self.cfg.grpo.max_completion_length) - SFT_TARGET_SLACK
        rows = []
        for q in queries:
            item = max(q["relevant"], key=lambda i: q["relevant"][i])
            target = " ".join(self.dataset.item_text(item).split())  # as the index embeds it, on one line
            rows.append({"prompt": self._prompt(q["text"]),
                         "completion": [{"role": "assistant", "content": cut_to_tokens(target, tokenizer, budget)}]})
        return rows

    def warm_start(self) -> dict[str, Any]:
        """SFT of the base rewriter on :meth:`sft_examples`, saved, then evaluated on val."""
        import tempfile

        from coevo.train.sft import train_sft

        self._set_threads()
        generator = self.base_generator()
        examples = self.sft_examples(generator.tokenizer)
        with tempfile.TemporaryDirectory(prefix="coevo-sft-") as scratch:
            stats = train_sft(generator, examples, self.cfg.sft, scratch, self.seed, what="GRAPE SFT warm start",
                              knob="grape.sft")
        generator.save(self.sft_generator_dir)
        result = self.evaluate(SFT, generator=generator)
        return {"stage": SFT, "examples": len(examples), "sft": stats, "eval": _numbers(result["splits"][MONITOR_SPLIT])}

    def start_generator(self):
        """Where GRPO starts: the warm-started rewriter (grape.sft_warmup) or the base one."""
        from coevo.models.generator import Generator

        return Generator.load(self.sft_generator_dir) if self.cfg.sft_warmup else self.base_generator()

    def train(self) -> dict[str, Any]:
        """GRPO on the rewriter; monitor evaluations every ``eval_every`` steps (val split)."""
        from coevo.train.grpo import train_grpo

        (self.run_dir / "monitor").mkdir(parents=True, exist_ok=True)  # an output even when no step is monitored
        generator = self.start_generator()
        monitor_split = MONITOR_SPLIT
        grpo = self.cfg.grpo.model_copy(
            update={"max_completion_length": self.completion_budget(self.cfg.grpo.max_completion_length)})
        summary = train_grpo(
            generator, self.train_prompts(), self.reward_fn(generator.tokenizer), grpo,
            self.run_dir / "train", self.seed, max_steps=self.cfg.grpo.steps,
            temperature=self.cfg.sampling.temperature, top_p=self.cfg.sampling.top_p,
            callbacks=[self._monitor_callback(generator, monitor_split)], what="GRAPE GRPO", knob="grape.grpo",
            solved_at=1.0,  # the relevant item ranked first (rank and reciprocal-rank rewards alike)
        )
        generator.save(self.generator_dir)
        return summary

    def _monitor_callback(self, generator: Generator, split: str):
        from transformers import TrainerCallback

        run = self

        class InflationMonitor(TrainerCallback):
            """Evaluate the rewriter mid-training (recall@1 next to mean relevant similarity)."""

            def on_step_end(self, args, state, control, model=None, **kwargs):  # noqa: ARG002
                step = int(state.global_step)
                if step % run.cfg.eval_every == 0 and step < run.cfg.grpo.steps:
                    if model is not None:
                        generator.model = model
                    run.evaluate(f"step_{step}", splits=[split], generator=generator, step=step)
                return control

        return InflationMonitor()

    def _set_threads(self) -> None:
        from coevo.runtime import limit_cpu_threads

        limit_cpu_threads()

    def table(self) -> dict[str, dict[str, dict[str, float]]]:
        """{stage: {metric: value}} on the val split for raw / untrained / sft (a warm start) / trained."""
        return {stage: _numbers(read_json(self.eval_path(stage))["splits"][MONITOR_SPLIT])
                for stage in (RAW, UNTRAINED, SFT, TRAINED) if self.eval_path(stage).exists()}

    def history(self) -> list[dict[str, Any]]:
        """The monitor curve: one row per evaluation of the rewriter on the monitored split,
        by training step (untrained = step 0, trained = the last step)."""
        split = MONITOR_SPLIT
        rows = []
        paths = [self.eval_path(s) for s in (UNTRAINED, TRAINED)] + sorted((self.run_dir / "monitor").glob("*.json"))
        for path in [p for p in paths if p.exists()]:
            record = read_json(path)
            if record.get("step") is None or split not in record["splits"]:
                continue
            m = record["splits"][split]
            rows.append({"step": int(record["step"]), "stage": record["stage"], "split": split,
                         "recall@1": m["recall@1"], "recall@10": m["recall@10"],
                         "mean_relevant_similarity": m["mean_relevant_similarity"],
                         "mean_rank_reward": m["mean_rank_reward"], "malformed_fraction": m["malformed_fraction"]})
        return sorted(rows, key=lambda r: (r["step"], r["stage"] != TRAINED))


def monitor_shows_inflation(history: Sequence[Mapping[str, Any]], tolerance: float = 0.0) -> bool:
    """True when mean relevant similarity rose from the first to the last evaluation while
    Recall@1 did not rise (the signature of a rewriter gaming raw similarity)."""
    if len(history) < 2:
        return False
    first, last = history[0], history[-1]
    sim_up = last["mean_relevant_similarity"] - first["mean_relevant_similarity"] > tolerance
    recall_flat_or_down = last["recall@1"] - first["recall@1"] <= tolerance
    return bool(sim_up and recall_flat_or_down and not math.isnan(last["recall@1"]))


def _numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
