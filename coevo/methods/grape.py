"""GRAPE: train a query rewriter by GRPO against a frozen retriever, rewarded by corpus rank.

The retriever (a sentence-transformers text encoder, or an open_clip model over images)
never changes; only the rewriter (a :class:`~coevo.models.generator.Generator`, LoRA by
default) learns. The reward is the exact rank of the relevant item among all N corpus
items (:class:`~coevo.rewards.grape.RankReward`); ``grape.reward: similarity`` is the
ablation that rewards the raw cosine similarity instead.

Score-inflation monitor: every evaluation records both ``mean_relevant_similarity`` (mean
cosine of the query with its relevant items) and ``recall@1``. A rewriter that learns to
raise every similarity at once shows the first curve rising while the second does not.

Phases over one run directory, each idempotent (a finished phase returns its stored
result, so a crashed run resumes and an orchestrator can wrap each phase in a task):

- ``build_index()``     embed the corpus once with the frozen retriever; faiss index artifact
- ``evaluate(stage)``   Recall@1/5/10, MRR@10, full MRR, NDCG@10 and the monitor pair on
                        the val and test splits; stages ``raw`` (the query as typed),
                        ``untrained`` (the base rewriter), ``trained``
- ``train()``           GRPO for ``grape.grpo.steps`` steps; every ``eval_every`` steps the
                        monitor evaluates the current rewriter on the val split
- ``run()``             all of the above; ``history()`` the monitor curve

Layout of ``run_dir``::

    index/                      DenseIndex of the corpus (faiss + ids + manifest)
    base_generator/             the untrained rewriter (the start of training)
    generator/                  the trained rewriter
    train/                      TRL output folder; train/summary.json when done
    eval/<stage>.json           metrics per split (+ example rewrites)
    metrics.json                raw / untrained / trained table (written by run())
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from coevo.config import GrapeParams, Params
from coevo.io import read_json, write_json
from coevo.retrieval.dense import FrozenRetriever

log = logging.getLogger(__name__)

RAW, UNTRAINED, TRAINED = "raw", "untrained", "trained"
EVAL_SPLITS: tuple[str, ...] = ("val", "test")
EVAL_KS: tuple[int, ...] = (1, 5, 10)
N_EXAMPLES = 8  # example rewrites stored with each evaluation

SYSTEM_PROMPT = (
    "You rewrite search queries for a search engine over {corpus}. Keep the user's intent and "
    "use the words that the right {item} would be described with."
)
PLAIN_INSTRUCTION = "Answer with the rewritten query only, on one line."
REASONING_INSTRUCTION = (
    "First think briefly after 'Reasoning:' (at most {max_words} words), then write the rewritten "
    "query on one line after 'Rewrite:'."
)
CORPUS_WORDS = {"text": ("tool descriptions", "tool"), "clip": ("photographs", "photo (described in English)")}


def rewrite_messages(query: str, retriever_kind: str = "text", reasoning: bool = False,
                     max_reasoning_tokens: int = 32) -> list[dict[str, str]]:
    """Chat prompt asking for a rewrite (optionally after a capped reasoning section)."""
    corpus, item = CORPUS_WORDS.get(retriever_kind, CORPUS_WORDS["text"])
    instruction = (REASONING_INSTRUCTION.format(max_words=max_reasoning_tokens) if reasoning
                   else PLAIN_INSTRUCTION)
    return [
        {"role": "system", "content": SYSTEM_PROMPT.format(corpus=corpus, item=item)},
        {"role": "user", "content": f"Query: {query.strip()}\n{instruction}"},
    ]


def make_retriever(params: GrapeParams, device: str | None = None, seed: int = 0) -> FrozenRetriever:
    """The frozen retriever named by params: ``text`` (sentence-transformers) or ``clip``."""
    if params.retriever == "text":
        from coevo.models.encoder import TextRetriever

        return TextRetriever(params.text_encoder, device=device)
    from coevo.models.clip import ClipRetriever

    return ClipRetriever(params.clip_model, pretrained=params.clip_pretrained, device=device, seed=seed)


class GrapeRun:
    """One GRAPE run: phases over ``run_dir`` on the processed dataset in ``dataset_dir``."""

    def __init__(self, run_dir: str | Path, params: Params | GrapeParams, dataset_dir: str | Path,
                 seed: int | None = None, device: str | None = None,
                 retriever: FrozenRetriever | None = None) -> None:
        if isinstance(params, Params):
            seed = params.seed if seed is None else seed
            params = params.grape
        self.run_dir = Path(run_dir)
        self.params: GrapeParams = params
        self.dataset_dir = Path(dataset_dir)
        self.seed = 42 if seed is None else seed
        self.device = device
        self._retriever = retriever  # injectable (tests, a pre-loaded model)
        self._dataset = None
        self._generator = None  # the rewriter being trained, while train() runs

    # ------------------------------------------------------------------ data
    @property
    def dataset(self):
        if self._dataset is None:
            from coevo.data.schema import Dataset

            self._dataset = Dataset.load(self.dataset_dir)
        return self._dataset

    def queries(self, split: str) -> list[dict[str, Any]]:
        """Queries of ``split`` with at least one relevant item: {query_id, text, relevant}."""
        relevant = self.dataset.relevant(split)
        out = []
        for row in self.dataset.queries_in(split).to_dict(orient="records"):
            qid = str(row["query_id"])
            if relevant.get(qid):
                out.append({"query_id": qid, "text": str(row["text"]), "relevant": relevant[qid]})
        return out

    def eval_splits(self) -> list[str]:
        splits = [s for s in EVAL_SPLITS if self.queries(s)]
        if not splits:
            raise ValueError(f"{self.dataset_dir}: no val or test query has a relevant item; nothing to evaluate")
        return splits

    # ------------------------------------------------------------- artifacts
    @property
    def index_dir(self) -> Path:
        return self.run_dir / "index"

    @property
    def base_generator_dir(self) -> Path:
        return self.run_dir / "base_generator"

    @property
    def generator_dir(self) -> Path:
        return self.run_dir / "generator"

    def eval_path(self, stage: str) -> Path:
        return self.run_dir / "eval" / f"{stage}.json"

    # ------------------------------------------------------------- retriever
    @property
    def retriever(self) -> FrozenRetriever:
        if self._retriever is None:
            self._retriever = make_retriever(self.params, self.device, self.seed)
        if self._retriever.index is None:
            self.build_index()
        return self._retriever

    def build_index(self) -> dict[str, Any]:
        """Embed the corpus once (or reload the saved index built by the same encoder)."""
        from coevo.retrieval.dense import DenseIndex

        if self._retriever is None:
            self._retriever = make_retriever(self.params, self.device, self.seed)
        retriever = self._retriever
        if (self.index_dir / "manifest.json").exists():
            retriever.attach(DenseIndex.load(self.index_dir))
        else:
            items = self.dataset.items.to_dict(orient="records")
            log.info("embedding %d corpus items with %s", len(items), retriever.encoder_id)
            retriever.index_corpus(items).save(self.index_dir)
        assert retriever.index is not None
        return retriever.index.manifest()

    # ------------------------------------------------------------- rewriter
    def _corpus_text(self) -> list[str]:
        """Text the `tiny` generator's tokenizer is trained on (ignored by real models)."""
        items = self.dataset.items
        texts = [self.dataset.item_text(i) for i in items["item_id"]]
        return texts + [q["text"] for q in self.queries("train")] + [
            m["content"] for m in rewrite_messages("x", self.params.retriever, self.params.reasoning)]

    def base_generator(self):
        """The untrained rewriter, saved once so the untrained stage and training share it."""
        from coevo.models.generator import Generator

        if (self.base_generator_dir / "generator.json").exists():
            return Generator.load(self.base_generator_dir)
        generator = Generator.create(self.params.generator, lora=self.params.lora, seed=self.seed,
                                     corpus=self._corpus_text())
        generator.save(self.base_generator_dir)
        return generator

    def parser(self, tokenizer: Any = None):
        from coevo.rewards.grape import RewriteParser

        count = None
        if tokenizer is not None:
            def count(text: str) -> int:
                return len(tokenizer(text, add_special_tokens=False)["input_ids"])
        return RewriteParser(self.params.reasoning, self.params.max_reasoning_tokens, count)

    def completion_budget(self, base: int) -> int:
        """New tokens for a rewrite; the capped reasoning section gets its own budget on top."""
        return base + (self.params.max_reasoning_tokens + 8 if self.params.reasoning else 0)

    def _prompt(self, query: str) -> list[dict[str, str]]:
        return rewrite_messages(query, self.params.retriever, self.params.reasoning, self.params.max_reasoning_tokens)

    def rewrite(self, generator: Any, texts: Sequence[str]) -> tuple[list[str], list[str | None]]:
        """Greedy rewrites: (raw completions, parsed rewrites or None when malformed)."""
        completions = [c[0] for c in generator.generate(
            [self._prompt(t) for t in texts], temperature=0.0,
            max_new_tokens=self.completion_budget(self.params.sampling.max_new_tokens),
            progress=len(texts) > 32, description="rewriting")]
        parser = self.parser(generator.tokenizer)
        return completions, [parser(c) for c in completions]

    # ------------------------------------------------------------ evaluation
    def score_queries(self, queries: Sequence[Mapping[str, Any]], rewrites: Sequence[str | None]) -> dict[str, float]:
        """Retrieval metrics and the inflation monitor for one split's (rewritten) queries.

        A malformed rewrite is searched as the empty string (retrieval with nothing), and
        counted in ``malformed_fraction``.
        """
        from coevo.retrieval.metrics import ranked_metrics
        from coevo.rewards.grape import rank_reward

        retriever = self.retriever
        index = retriever.index
        assert index is not None
        embs = retriever.embed_queries([r if r else "" for r in rewrites])
        rankings = index.rank_corpus(embs, k=max(EVAL_KS))
        qrels = {q["query_id"]: q["relevant"] for q in queries}
        metrics = ranked_metrics({q["query_id"]: r for q, r in zip(queries, rankings)}, qrels, ks=EVAL_KS)
        # Exact ranks and similarities of every (query, relevant item) pair.
        owners = np.concatenate([np.full(len(q["relevant"]), j) for j, q in enumerate(queries)])
        rows = index.rows([item for q in queries for item in q["relevant"]])
        ranks = index.exact_ranks(embs[owners], rows)
        sims = index.pair_scores(embs[owners], rows)
        counts = np.bincount(owners, minlength=len(queries))
        best_rank = np.full(len(queries), np.inf)
        np.minimum.at(best_rank, owners, ranks)
        return {
            **{k: metrics[k] for k in sorted(metrics) if k.split("@")[0] in ("recall", "mrr", "ndcg")},
            "mrr": float(np.mean(1.0 / best_rank)),
            "mean_relevant_similarity": float(np.mean(np.bincount(owners, weights=sims) / counts)),
            "mean_rank_reward": float(np.mean(np.bincount(owners, weights=rank_reward(ranks, len(index))) / counts)),
            "malformed_fraction": float(np.mean([r is None for r in rewrites])),
            "n_queries": len(queries),
        }

    def evaluate(self, stage: str, *, splits: Sequence[str] | None = None, generator: Any = None,
                 step: int | None = None) -> dict[str, Any]:
        """Evaluate ``raw``, ``untrained``, ``trained`` (or a mid-training ``step_<n>`` with
        the given generator); stored in eval/<stage>.json and returned as is on a re-run."""
        path = self.eval_path(stage)
        if path.exists():
            return read_json(path)
        splits = list(splits or self.eval_splits())
        if step is None:
            step = {UNTRAINED: 0, TRAINED: self.params.grpo.steps}.get(stage)
        if stage != RAW and generator is None:
            from coevo.models.generator import Generator

            if stage == UNTRAINED:
                generator = self.base_generator()
            elif stage == TRAINED:
                if not (self.generator_dir / "generator.json").exists():
                    raise FileNotFoundError(f"{self.generator_dir}: no trained rewriter (run train() first)")
                generator = Generator.load(self.generator_dir, trainable=False)
            else:
                raise ValueError(f"unknown GRAPE stage {stage!r} (expected raw, untrained or trained)")
        self._set_threads()
        result: dict[str, Any] = {"stage": stage, "step": step, "reward": self.params.reward, "splits": {}}
        for split in splits:
            queries = self.queries(split)
            texts = [q["text"] for q in queries]
            if stage == RAW:
                completions, rewrites = texts, list(texts)
            else:
                completions, rewrites = self.rewrite(generator, texts)
            metrics = self.score_queries(queries, rewrites)
            metrics["examples"] = [{"query": t, "completion": c, "rewrite": r}
                                   for t, c, r in list(zip(texts, completions, rewrites))[:N_EXAMPLES]]
            result["splits"][split] = metrics
            log.info("GRAPE %s %s: recall@1=%.3f recall@10=%.3f mean_sim=%.3f", stage, split,
                     metrics["recall@1"], metrics["recall@10"], metrics["mean_relevant_similarity"])
        write_json(path, result)
        return result

    # ---------------------------------------------------------------- training
    def train_prompts(self) -> list[dict[str, Any]]:
        queries = self.queries("train")
        if not queries:
            raise ValueError(f"{self.dataset_dir}: no training query has a relevant item")
        return [{"prompt": self._prompt(q["text"]), "query_id": q["query_id"]} for q in queries]

    def reward_fn(self, tokenizer: Any = None):
        """The GRPO reward over training qrels: ``reward_fn(completions, query_id)``."""
        from coevo.rewards.grape import make_reward

        qrels = {q["query_id"]: list(q["relevant"]) for q in self.queries("train")}
        reward = make_reward(self.params.reward, self.retriever, qrels, self.parser(tokenizer))

        def grape_reward(completions: list[str], query_id: list[str]) -> list[float]:
            return reward(query_id, completions)

        grape_reward.__name__ = f"{self.params.reward}_reward"
        return grape_reward

    def train(self) -> dict[str, Any]:
        """GRPO on the rewriter; monitor evaluations every ``eval_every`` steps (val split)."""
        from coevo.train.grpo import train_grpo

        summary_path = self.run_dir / "train" / "summary.json"
        if summary_path.exists() and (self.generator_dir / "generator.json").exists():
            return read_json(summary_path)
        # Monitor evaluations left by an interrupted run belong to a model that no longer exists.
        for stale in (self.run_dir / "eval").glob("step_*.json"):
            stale.unlink()
        generator = self.base_generator()
        monitor_split = self.eval_splits()[0]
        grpo = self.params.grpo.model_copy(
            update={"max_completion_length": self.completion_budget(self.params.grpo.max_completion_length)})
        summary = train_grpo(
            generator, self.train_prompts(), self.reward_fn(generator.tokenizer), grpo,
            self.run_dir / "train", self.seed, max_steps=self.params.grpo.steps,
            temperature=self.params.sampling.temperature, top_p=self.params.sampling.top_p,
            callbacks=[self._monitor_callback(generator, monitor_split)],
        )
        generator.save(self.generator_dir)
        write_json(summary_path, summary)
        return summary

    def _monitor_callback(self, generator: Any, split: str):
        from transformers import TrainerCallback

        run = self

        class InflationMonitor(TrainerCallback):
            """Evaluate the rewriter mid-training (recall@1 next to mean relevant similarity)."""

            def on_step_end(self, args, state, control, model=None, **kwargs):  # noqa: ARG002
                step = int(state.global_step)
                if step % run.params.eval_every == 0 and step < run.params.grpo.steps:
                    if model is not None:
                        generator.model = model
                    run.evaluate(f"step_{step}", splits=[split], generator=generator, step=step)
                return control

        return InflationMonitor()

    def _set_threads(self) -> None:
        import torch

        if not torch.cuda.is_available():
            torch.set_num_threads(1)  # shared CPUs; the models here are small

    # ---------------------------------------------------------------- pipeline
    def run(self) -> dict[str, Any]:
        """build_index -> evaluate raw / untrained -> train -> evaluate trained; metrics.json."""
        self.build_index()
        for stage in (RAW, UNTRAINED):
            self.evaluate(stage)
        train_summary = self.train()
        self.evaluate(TRAINED)
        table = self.table()
        write_json(self.run_dir / "metrics.json", {"reward": self.params.reward, "stages": table,
                                                   "train": train_summary, "monitor": self.history()})
        return table

    def table(self) -> dict[str, dict[str, dict[str, float]]]:
        """{stage: {split: {metric: value}}} for raw / untrained / trained (examples dropped)."""
        out: dict[str, dict[str, dict[str, float]]] = {}
        for stage in (RAW, UNTRAINED, TRAINED):
            if self.eval_path(stage).exists():
                splits = read_json(self.eval_path(stage))["splits"]
                out[stage] = {s: {k: v for k, v in m.items() if k != "examples"} for s, m in splits.items()}
        return out

    def history(self) -> list[dict[str, Any]]:
        """The monitor curve: one row per evaluation of the rewriter on the monitored split,
        by training step (untrained = step 0, trained = the last step)."""
        folder = self.run_dir / "eval"
        if not folder.exists():
            return []
        split = self.eval_splits()[0]
        rows = []
        for path in folder.glob("*.json"):
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
