"""CoHyDE: co-train a HyDE rewriter (tool descriptions) and a dense encoder, as idempotent phases.

Phases over one run directory (:class:`coevo.methods.base.Method` decides what re-runs;
inside a round every step is checkpointed, so an interrupted round resumes at its last step):

- ``raw``         the raw encoder on the raw query (val)
- ``s1a``         fine-tune the encoder on (query, tool) pairs, tools in random formats
- ``s1b``         warm the rewriter by next-token training on the tool corpus (5 formats), or
                  (``warmup_data: query_pairs``) by SFT on training queries -> their tools;
                  ``s1b_warmup: false`` skips it (the "without S1b" ablation)
- ``hyde``        vanilla HyDE: the untrained rewriter's description under the S1a encoder (val)
- ``round_<r>``   S2 one greedy description per training query; S3 train the encoder on
                  (description, tool) pairs only, starting from the S1a encoder (``s3_init:
                  s1a``, the default: the paper "retrains" it each round) or from the previous
                  round's (``previous_round``); S4 sample ``num_samples`` descriptions at
                  ``sample_temperature``, score each by NDCG@5 under the new encoder, DPO on
                  best vs worst (ties dropped)
Every evaluation reports NDCG@5 and Recall@5 per group (G1, G2, G3) and overall on the val
split (early stopping and round selection); the test split is read once, by
:meth:`CoHyDE.final_evaluation`. Rewriter stages encode what ``encode`` says (below). A round is
evaluated with its own rewriter and encoder, or, for the paper's ablations
(``eval_pairing``), its rewriter with the S1a encoder or the untrained rewriter with its
encoder (:data:`PAIRINGS`). ``encode`` says what the encoder embeds for a query: the
description alone (the paper) or the query followed by it (HyDE's rule); S3, S4, every
evaluation and serving (:meth:`CoHyDE.stages`, :func:`searched_text`) share it.

Layout of ``run_dir``::

    base_generator/            the untrained rewriter (shared start of S1b and vanilla HyDE)
    s1a/encoder/ s1a/index/ s1a/s1a.json   encoder checkpoint, its faiss corpus index, the training record
    s1b/generator/ s1b/s1b.json
    round_<r>/s2.json                          round_<r>_s2: one description per training query
    round_<r>/encoder/ index/ s3.json          round_<r>_s3: the encoder trained on them, its index
    round_<r>/s4_samples.json s4.json pairs.json   round_<r>_s4: sampled descriptions, their scores, DPO pairs
    round_<r>/generator/ dpo.json              round_<r>_dpo: the DPO rewriter
    eval/<stage>.json          val metrics (+ example descriptions)
    stamps/<phase>.json        each finished phase's key and record (coevo.steps)

A round is five phases (S2, S3, S4, DPO, then ``round_<r>``: its val evaluation), each stamped and
keyed like any other: a run killed inside a round resumes at the sub-phase it was in, and a knob
re-runs only the sub-phases that read it (``cohyde.dpo_beta`` keeps S2-S4 of round 1;
``cohyde.eval_pairing`` re-runs the evaluations only).
"""

from __future__ import annotations

import logging
import random
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from coevo.config import CoHyDEParams, Params
from coevo.data.render import FORMATS, render_tool
from coevo.io import jsonable, read_json, write_json
from coevo.methods.base import MONITOR_SPLIT, Method, Phase, PhaseNotReady

if TYPE_CHECKING:
    from coevo.config import CoHyDEEarlyStopping

log = logging.getLogger(__name__)

REWRITER_SYSTEM = (
    "You write documentation for API tools. Given a user request, write the description of the "
    "one tool that would serve it: the tool name, the API name and what the API does. "
    "Answer with the description only."
)
METRIC_KS = (5,)
RAW, S1A, HYDE = "raw", "s1a", "hyde"
# Warm-up texts are cut here: long parameter lists add memory and time, not tool vocabulary.
WARMUP_MAX_TOKENS = 256


def rewriter_messages(query: str) -> list[dict[str, str]]:
    """The rewriter's chat prompt for one user query."""
    return [
        {"role": "system", "content": REWRITER_SYSTEM},
        {"role": "user", "content": f"Request: {' '.join(query.split())}\nTool description:"},
    ]


def searched_text(query: str, description: str, encode: str) -> str:
    """What the encoder embeds for one query under ``cohyde.encode``: the description (the
    paper), or the query, a new line and the description (HyDE's rule: the query's own words
    stay, so a weak rewriter can add vocabulary but not lose the user's)."""
    if encode == "description":
        return description
    if encode == "query_and_description":
        return f"{' '.join(query.split())}\n{description}".rstrip()
    raise ValueError(f"unknown cohyde.encode {encode!r}: expected description or query_and_description")


def query_group(group: object) -> str:
    """Group prefix used for reporting: ``G1_instruction`` -> ``G1`` (missing -> ``all``)."""
    if not isinstance(group, str) or not group.strip():
        return "all"
    return group.split("_", 1)[0]


def round_stage(r: int) -> str:
    return f"round_{r}"


ROUND_PARTS = ("s2", "s3", "s4", "dpo")


def sub_phase(r: int, part: str) -> str:
    """A sub-phase of round r: ``round_<r>_s2`` (S2), ``_s3``, ``_s4``, ``_dpo``; the round's own name
    (``round_<r>``) is its val evaluation, the stage reports and serving name."""
    if part not in ROUND_PARTS:
        raise ValueError(f"unknown round part {part!r}: expected one of {', '.join(ROUND_PARTS)}")
    return f"{round_stage(r)}_{part}"


def parse_round_phase(name: str) -> tuple[int, str]:
    """``round_2_s3`` -> (2, "s3"); ``round_2`` -> (2, "eval")."""
    head, _, rest = name.partition("_")
    number, _, part = rest.partition("_")
    if head != "round" or not number.isdigit() or (part and part not in ROUND_PARTS):
        raise ValueError(f"not a CoHyDE round phase: {name!r}")
    return int(number), part or "eval"


ENCODER_KNOBS = ("encoder", "index_format")
S1A_KNOBS = (*ENCODER_KNOBS, "encoder_training", "max_train_queries")
REWRITER_KNOBS = ("generator", "lora", "warmup", "warmup_data", "warmup_formats_per_item", "warmup_max_examples",
                  "max_train_queries", "s1b_warmup")
# (encoder stage, rewriter stage) a round is evaluated with, by cohyde.eval_pairing ("round" = the
# round's own; HYDE's rewriter is the untrained one of vanilla HyDE).
PAIRINGS = {"co_trained": ("round", "round"), "trained_rewriter_s1a_encoder": (S1A, "round"),
            "vanilla_rewriter_co_trained_encoder": ("round", HYDE)}


class CoHyDE(Method):
    """One CoHyDE run: phases over ``run_dir`` on the processed dataset in ``dataset_dir``."""

    name = "cohyde"
    title = "CoHyDE"
    code = ("coevo.methods.base", "coevo.methods.cohyde", "coevo.models", "coevo.train", "coevo.rewards.cohyde",
            "coevo.retrieval", "coevo.data.schema", "coevo.data.render", "coevo.io", "coevo.runtime",
            "coevo.compute")
    plan_params = ("cohyde.rounds", "cohyde.early_stopping")
    table_metrics = ("ndcg@5", "recall@5")
    paper_baseline = S1A

    def __init__(self, run_dir: str | Path, params: Params, dataset_dir: str | Path, *, progress: bool = False,
                 data_fingerprint: str | None = None, device: str | None = None) -> None:
        super().__init__(run_dir, params, dataset_dir, progress=progress, data_fingerprint=data_fingerprint)
        self.cfg: CoHyDEParams = params.cohyde
        self.device = device
        self._items: dict[str, dict[str, Any]] | None = None
        self._encoders: dict[str, Any] = {}
        self._indexes: dict[str, Any] = {}
        self._loaded_generator: tuple[str, Any] | None = None

    @property
    def early_stopping_params(self) -> CoHyDEEarlyStopping:
        return self.cfg.early_stopping

    # ---------------------------------------------------------------- phases
    def phases(self) -> list[Phase]:
        c = lambda *names: ("seed", *(f"cohyde.{n}" for n in names))  # noqa: E731
        out = [
            Phase(RAW, "raw encoder", c(*ENCODER_KNOBS), ("raw", "eval/raw.json")),
            Phase(S1A, "S1a encoder", c(*S1A_KNOBS), ("s1a", "eval/s1a.json")),
            Phase("s1b", "S1b rewriter warm-up" if self.cfg.s1b_warmup else "S1b skipped (ablation)",
                  c(*REWRITER_KNOBS), ("base_generator", "s1b")),
            Phase(HYDE, "vanilla HyDE", c("max_new_tokens", "encode"), ("eval/hyde.json",), reads=(S1A, "s1b"),
                  monitored=True),
        ]
        for r in range(1, self.cfg.rounds + 1):
            out += self._round_phases(r, c)
        return out

    def _round_phases(self, r: int, c: Callable[..., tuple[str, ...]]) -> list[Phase]:
        """Round ``r`` as five phases, each keyed by the knobs it reads (the rest reach it through
        ``reads``): S2, S3, S4, DPO, then the round's val evaluation under ``eval_pairing``.

        The rewriter comes from S1b or the previous round's DPO; S3 starts from the S1a encoder or
        the previous round's (``s3_init``). S2 is stoppable: early stopping skips whole rounds."""
        stage = round_stage(r)
        s2, s3, s4, dpo = (sub_phase(r, part) for part in ROUND_PARTS)
        rewriter = "s1b" if r == 1 else sub_phase(r - 1, "dpo")
        encoder_start = S1A if r == 1 or self.cfg.s3_init == "s1a" else sub_phase(r - 1, "s3")
        return [
            Phase(s2, f"round {r} S2 descriptions", c("max_new_tokens", "max_train_queries"), (f"{stage}/s2.json",),
                  reads=(rewriter,), stoppable=True, resumable=True),
            Phase(s3, f"round {r} S3 encoder", c("encoder_training", "encode", "index_format", "max_train_queries"),
                  (f"{stage}/encoder", f"{stage}/index", f"{stage}/s3.json"), reads=(s2, encoder_start),
                  resumable=True),
            Phase(s4, f"round {r} S4 samples and pairs",
                  c("num_samples", "sample_temperature", "max_new_tokens", "encode", "max_train_queries"),
                  (f"{stage}/s4_samples.json", f"{stage}/s4.json", f"{stage}/pairs.json"), reads=(s3, rewriter),
                  resumable=True),
            Phase(dpo, f"round {r} DPO", c("dpo", "dpo_beta"), (f"{stage}/generator", f"{stage}/dpo.json"),
                  reads=(s4, rewriter), resumable=True),
            # The pairing may evaluate with the S1a encoder or vanilla HyDE's rewriter; after HyDE, whose score
            # the rounds must beat.
            Phase(stage, f"round {r}", c("eval_pairing", "encode", "max_new_tokens"), (f"eval/{stage}.json",),
                  reads=(dpo, s3, S1A, HYDE), monitored=True),
        ]

    def _run(self, phase: Phase) -> dict[str, Any]:
        if phase.name == S1A:
            self.s1a()
        elif phase.name == "s1b":
            return self.s1b()
        elif phase.name.startswith("round_"):
            r, part = parse_round_phase(phase.name)
            if part != "eval":  # S2, S3, S4, DPO: the record is what the step wrote
                return {"s2": self.s2, "s3": self.s3, "s4": self.s4, "dpo": self.dpo}[part](r)
        overall = self.evaluate(phase.name)["splits"][MONITOR_SPLIT]["overall"]
        return {"stage": phase.name, "eval": {k: float(v) for k, v in overall.items()}}

    @property
    def items(self) -> dict[str, dict[str, Any]]:
        """item_id -> row (dict), in corpus order."""
        if self._items is None:
            frame = self.dataset.items
            self._items = {str(row["item_id"]): row for row in frame.to_dict(orient="records")}
        return self._items

    def _queries(self, split: str) -> list[dict[str, Any]]:
        """Queries of ``split`` that have at least one relevant item: {query_id, text, group, relevant}."""
        relevant = self.dataset.relevant(split)
        frame = self.dataset.queries_in(split)
        out = []
        for row in frame.to_dict(orient="records"):
            qid = str(row["query_id"])
            rel = {str(i): int(g) for i, g in relevant.get(qid, {}).items() if int(g) > 0}
            if rel:
                out.append({"query_id": qid, "text": str(row["text"]), "group": row.get("group"), "relevant": rel})
        return out

    def train_queries(self) -> list[dict[str, Any]]:
        queries = self._queries("train")
        if len(queries) < 2:
            raise ValueError(f"{self.dataset_dir}: CoHyDE needs at least 2 training queries with relevant tools, "
                             f"found {len(queries)}")
        cap = self.cfg.max_train_queries
        if cap is not None and len(queries) > cap:
            # A seeded subset that keeps the query order (the cap is for CPU-sized runs).
            keep = sorted(random.Random(self.seed).sample(range(len(queries)), cap))
            queries = [queries[i] for i in keep]
        return queries

    def _render(self, item_id: str, fmt: str) -> str:
        try:
            row = self.items[item_id]
        except KeyError:
            raise KeyError(f"{self.dataset_dir}: qrels name item {item_id!r}, "
                           "which is not in the items table") from None
        return render_tool(row, fmt)

    def _pairs(self, anchors: Sequence[tuple[str, Mapping[str, int]]], salt: int) -> list[tuple[str, str]]:
        """(anchor, tool in a random format) for every relevant tool of every anchor."""
        rng = random.Random(self.seed * 1000 + salt)
        return [(text, self._render(item_id, rng.choice(FORMATS)))
                for text, relevant in anchors for item_id in sorted(relevant)]

    # ------------------------------------------------------------- artifacts
    def _stage_dir(self, stage: str) -> Path:
        return self.run_dir / stage

    def _encoder_dir(self, stage: str) -> Path:
        return self._stage_dir(stage) / "encoder"

    def _generator_dir(self, stage: str) -> Path:
        return self.run_dir / "base_generator" if stage in (HYDE, "base") else self._stage_dir(stage) / "generator"

    def encoder(self, stage: str):
        """The encoder of a stage: ``raw`` is the named model, others load their checkpoint."""
        if stage not in self._encoders:
            from coevo.models.encoder import load_text_encoder

            name = self.cfg.encoder if stage == RAW else str(self._encoder_dir(stage))
            self._encoders = {stage: load_text_encoder(name, device=self.device)}  # keep one in memory
        return self._encoders[stage]

    def index(self, stage: str):
        """The corpus index of an encoder stage; built and saved (versioned) on first use."""
        from coevo.retrieval.dense import DenseIndex

        if stage in self._indexes:
            return self._indexes[stage]
        path = self._stage_dir(stage) / "index"
        encoder_id = f"cohyde:{stage}:{self.cfg.index_format}"
        index = DenseIndex.load(path) if (path / "manifest.json").exists() else None
        if index is None or index.encoder != encoder_id or index.ids != list(self.items):
            # Missing, or built from another rendering or corpus: rebuild it.
            from coevo.compute import embed_texts

            ids = list(self.items)
            texts = [self._render(i, self.cfg.index_format) for i in ids]
            log.info("indexing %d tools with the %s encoder", len(ids), stage)
            # local: the encoder's own call; ray: Ray Data shards, the checkpoint loaded once per worker
            emb = embed_texts(self.encoder(stage), texts, compute=self.params.compute,
                              checkpoint=self.cfg.encoder if stage == RAW else str(self._encoder_dir(stage)),
                              progress=len(texts) > 256)
            index = DenseIndex.build(ids, emb, encoder=encoder_id)
            index.save(path)
        self._indexes = {stage: index}
        return index

    def _base_generator(self):
        from coevo.models.generator import Generator

        path = self._generator_dir("base")
        if (path / "generator.json").exists():
            return Generator.load(path)
        corpus = [self._render(i, fmt) for i in self.items for fmt in FORMATS]
        corpus += [q["text"] for q in self.train_queries()]
        generator = Generator.create(self.cfg.generator, lora=self.cfg.lora, seed=self.seed, corpus=corpus)
        generator.save(path)
        return generator

    def rewriter(self, stage: str):
        """The rewriter of a stage (one kept in memory; trained in place, then re-keyed)."""
        from coevo.models.generator import Generator

        stage = "base" if stage == HYDE else stage
        if self._loaded_generator is None or self._loaded_generator[0] != stage:
            generator = self._base_generator() if stage == "base" else Generator.load(self._generator_dir(stage))
            self._loaded_generator = (stage, generator)
        return self._loaded_generator[1]

    def _set_threads(self) -> None:
        from coevo.runtime import limit_cpu_threads

        limit_cpu_threads()

    # ---------------------------------------------------------------- phases
    def s1a(self) -> dict[str, Any]:
        """S1a: fine-tune the encoder on (query, tool) pairs; build its index."""
        from coevo.train.encoder import train_encoder

        self._set_threads()
        queries = self.train_queries()
        pairs = self._pairs([(q["text"], q["relevant"]) for q in queries], salt=1)
        encoder = self.encoder(RAW)
        stats = train_encoder(encoder, pairs, self.cfg.encoder_training, self._encoder_dir(S1A), self.seed,
                              what="S1a encoder", knob="cohyde.encoder_training")
        self._encoders = {}
        index = self.index(S1A)
        result = {"stage": S1A, "train_queries": len(queries), "encoder": stats, "index": index.manifest()}
        write_json(self._stage_dir(S1A) / "s1a.json", result)  # the training record beside its encoder (reports)
        return result

    def s1b(self) -> dict[str, Any]:
        """S1b: next-token warm-up of the rewriter on the tool corpus rendered in several formats.

        With ``s1b_warmup: false`` (the "without S1b" ablation) the untrained rewriter is
        saved as S1b's, so the rounds start from it."""
        from coevo.train.sft import train_sft

        self._set_threads()
        generator = self.rewriter("base")
        if not self.cfg.s1b_warmup:
            generator.save(self._generator_dir("s1b"))
            result = {"stage": "s1b", "examples": 0, "skipped": "cohyde.s1b_warmup = false (ablation)"}
            write_json(self._stage_dir("s1b") / "s1b.json", result)
            return result
        self._loaded_generator = None  # trained in place below: no longer the base rewriter
        rows = (self.warmup_pairs(generator.tokenizer) if self.cfg.warmup_data == "query_pairs"
                else [{"text": t} for t in self.warmup_texts()])
        with tempfile.TemporaryDirectory(prefix="coevo-sft-") as scratch:
            stats = train_sft(generator, rows, self.cfg.warmup, scratch, self.seed,
                              max_length=WARMUP_MAX_TOKENS, what="S1b warm-up", knob="cohyde.warmup")
        generator.save(self._generator_dir("s1b"))
        self._loaded_generator = ("s1b", generator)
        result = {"stage": "s1b", "data": self.cfg.warmup_data, "examples": len(rows), "sft": jsonable(stats)}
        write_json(self._stage_dir("s1b") / "s1b.json", result)
        return result

    def _capped(self, rows: list[Any], rng: random.Random) -> list[Any]:
        """``rows`` cut to ``warmup_max_examples`` by a seeded draw that keeps their order."""
        cap = self.cfg.warmup_max_examples
        if cap is not None and len(rows) > cap:
            rows = [rows[i] for i in sorted(rng.sample(range(len(rows)), cap))]
        return rows

    def warmup_texts(self) -> list[str]:
        """S1b's rows in the paper: every tool in ``warmup_formats_per_item`` renderings (capped)."""
        rng = random.Random(self.seed * 1000 + 2)
        per_item = self.cfg.warmup_formats_per_item
        texts = [self._render(item_id, fmt) for item_id in self.items
                 for fmt in (FORMATS if per_item == len(FORMATS) else rng.sample(FORMATS, per_item))]
        return self._capped(texts, rng)

    def warmup_pairs(self, tokenizer: Any) -> list[dict[str, Any]]:
        """S1b's rows with ``warmup_data: query_pairs``: every training query's rewriter prompt ->
        its most relevant tool as the index embeds it (``index_format``), cut to the description
        budget at a word boundary. Its cap is ``warmup_max_examples``, not ``max_train_queries``."""
        from coevo.models.generator import SFT_TARGET_SLACK, cut_to_tokens

        budget = max(1, self.cfg.max_new_tokens - SFT_TARGET_SLACK)
        rows = []
        for q in self._queries("train"):
            tool = min(q["relevant"], key=lambda i: (-q["relevant"][i], i))  # highest grade, then id
            target = cut_to_tokens(self._render(tool, self.cfg.index_format), tokenizer, budget)
            rows.append({"prompt": rewriter_messages(q["text"]),
                         "completion": [{"role": "assistant", "content": target}]})
        return self._capped(rows, random.Random(self.seed * 1000 + 3))

    def describe(self, generator, queries: Sequence[Mapping[str, Any]], *, what: str) -> list[str]:
        """One greedy description per query (S2 and evaluation)."""
        from coevo.compute import generate_texts

        outs = generate_texts(generator, [rewriter_messages(q["text"]) for q in queries], compute=self.params.compute,
                              scratch=self.run_dir / "scratch", num_return_sequences=1, temperature=0.0,
                              max_new_tokens=self.cfg.max_new_tokens, seed=self.seed, description=what)
        return [o[0] for o in outs]

    def _round_inputs(self, r: int) -> tuple[str, str, str]:
        """(stage, previous generator stage, encoder stage S3 starts from); earlier phases run first.

        S3 starts from the S1a encoder in every round (``s3_init: s1a``) or from the previous
        round's (``previous_round``, chained)."""
        if r < 1:
            raise ValueError(f"rounds are numbered from 1, got {r}")
        if r == 1:
            return round_stage(1), "s1b", S1A
        prev = round_stage(r - 1)
        return round_stage(r), prev, S1A if self.cfg.s3_init == "s1a" else prev

    def s2(self, r: int) -> dict[str, Any]:
        """S2 of round r: one greedy description per training query with the current rewriter."""
        stage, prev_gen, _ = self._round_inputs(r)
        self._set_threads()
        queries = self.train_queries()
        descriptions = self.describe(self.rewriter(prev_gen), queries, what=f"{stage} S2")
        write_json(self._stage_dir(stage) / "s2.json",
                   {"query_ids": [q["query_id"] for q in queries], "descriptions": descriptions})
        return {"stage": stage, "descriptions": len(descriptions),
                "empty_descriptions": sum(not d.strip() for d in descriptions)}

    def s3(self, r: int) -> dict[str, Any]:
        """S3 of round r: train the encoder (from S1a or the previous round, ``s3_init``) on
        (description, tool) pairs only; re-index."""
        from coevo.train.encoder import train_encoder

        stage, _, prev_enc = self._round_inputs(r)
        descriptions = read_json(self._stage_dir(stage) / "s2.json")["descriptions"]
        self._set_threads()
        queries = self.train_queries()
        # Empty generations carry no text to train on; they still count in S4 and evaluation.
        anchors = [(searched_text(q["text"], d, self.cfg.encode), q["relevant"])
                   for d, q in zip(descriptions, queries) if d.strip()]
        pairs = self._pairs(anchors, salt=10 + r)
        if len(pairs) < 2:
            raise ValueError(f"{stage} S3: only {len(pairs)} (description, tool) pairs; the rewriter produced "
                             "empty descriptions for almost every query")
        encoder = self.encoder(prev_enc)
        stats = train_encoder(encoder, pairs, self.cfg.encoder_training, self._encoder_dir(stage), self.seed + r,
                              what=f"{stage} S3 encoder", knob="cohyde.encoder_training")
        self._encoders, self._indexes = {}, {}
        result = {"encoder": stats, "index": self.index(stage).manifest(),
                  "empty_descriptions": len(descriptions) - len(anchors)}
        write_json(self._stage_dir(stage) / "s3.json", result)
        return result

    def s4(self, r: int) -> dict[str, Any]:
        """S4 of round r: ``num_samples`` descriptions per query at ``sample_temperature``, the
        NDCG@5 of each under the round's new encoder, and the DPO pairs mined from them."""
        from coevo.compute import generate_texts
        from coevo.rewards.cohyde import mine_dpo_pairs, score_descriptions

        stage, prev_gen, _ = self._round_inputs(r)
        self._set_threads()
        queries = self.train_queries()
        generator = self.rewriter(prev_gen)
        samples = generate_texts(
            generator, [rewriter_messages(q["text"]) for q in queries], compute=self.params.compute,
            scratch=self.run_dir / "scratch", num_return_sequences=self.cfg.num_samples,
            temperature=self.cfg.sample_temperature, top_p=1.0, max_new_tokens=self.cfg.max_new_tokens,
            seed=self.seed + r, description=f"{stage} S4 sampling")
        write_json(self._stage_dir(stage) / "s4_samples.json",
                   {"query_ids": [q["query_id"] for q in queries], "samples": samples})
        searched = [[searched_text(q["text"], d, self.cfg.encode) for d in group]
                    for q, group in zip(queries, samples)]
        scores = score_descriptions(self.encoder(stage), self.index(stage), searched,
                                    [q["relevant"] for q in queries], k=5)
        prompts = [generator.render(rewriter_messages(q["text"])) for q in queries]
        pairs, mining = mine_dpo_pairs(prompts, samples, scores)
        write_json(self._stage_dir(stage) / "pairs.json", pairs)
        write_json(self._stage_dir(stage) / "s4.json",
                   {"mining": mining, "scores": scores.tolist(), "query_ids": [q["query_id"] for q in queries]})
        return {"stage": stage, "mining": mining}

    def dpo(self, r: int) -> dict[str, Any]:
        """DPO of round r on the mined pairs (beta ``dpo_beta``); saves the round's rewriter."""
        stage, prev_gen, _ = self._round_inputs(r)
        out = self._generator_dir(stage)
        pairs = read_json(self._stage_dir(stage) / "pairs.json")
        self._set_threads()
        generator = self.rewriter(prev_gen)
        self._loaded_generator = None  # trained in place below
        if pairs:
            from coevo.train.dpo import train_dpo

            stats = train_dpo(generator, pairs, self.cfg.dpo, self.cfg.dpo_beta, out, self.seed + r,
                              what=f"{stage} DPO", knob="cohyde.dpo")
        else:
            # Every query tied: no preference signal, the rewriter carries over unchanged.
            generator.save(out)
            stats = {"pairs": 0, "skipped": "all sampled descriptions tied"}
        write_json(self._stage_dir(stage) / "dpo.json", stats)
        self._loaded_generator = (stage, generator)
        return stats

    def _round_summary(self, stage: str) -> dict[str, Any] | None:
        """A trained round's pair mining and DPO figures (what its S4 and DPO wrote); None before its DPO."""
        folder = self._stage_dir(stage)
        if not stage.startswith("round_") or not (folder / "dpo.json").exists():
            return None
        return {"round": parse_round_phase(stage)[0], "mining": read_json(folder / "s4.json")["mining"],
                "dpo": read_json(folder / "dpo.json")}

    def _require_trained(self, encoder_stage: str, generator_stage: str | None) -> None:
        """Evaluating a stage needs its encoder and rewriter on disk (their phases finished)."""
        needed = [] if encoder_stage == RAW else [self._encoder_dir(encoder_stage)]
        if generator_stage is not None:
            needed.append(self._generator_dir(generator_stage))
        missing = [str(path) for path in needed if not path.exists()]
        if missing:
            raise PhaseNotReady(f"{self.run_dir}: cannot evaluate before training: {', '.join(missing)} missing")

    # ------------------------------------------------------------ evaluation
    def stages(self, stage: str) -> tuple[str, str | None]:
        """(encoder stage, rewriter stage or None for the raw query) that ``stage`` is evaluated and
        served with: a round by ``cohyde.eval_pairing`` (:data:`PAIRINGS`), vanilla HyDE by the
        untrained rewriter under the S1a encoder."""
        if stage in (RAW, S1A):
            return stage, None
        if stage == HYDE:
            return S1A, HYDE
        if stage.startswith("round_") and stage[6:].isdigit():
            encoder_stage, rewriter_stage = (stage if s == "round" else s for s in PAIRINGS[self.cfg.eval_pairing])
            return encoder_stage, rewriter_stage
        raise ValueError(f"unknown CoHyDE stage {stage!r}: expected raw, s1a, hyde or round_<r>")

    def evaluate(self, stage: str, splits: Sequence[str] = (MONITOR_SPLIT,), store: bool = True,
                 cutoffs: Sequence[int] | None = None) -> dict[str, Any]:
        """NDCG@5 / Recall@5 per group and overall on ``splits`` for ``stage`` (stored for val).
        With ``cutoffs``, also every ranked metric over all queries at those cut-offs:
        ``overall`` ({metric: mean}) and ``per_query`` ({metric: {query_id: value}}), per split."""
        path = self.run_dir / "eval" / f"{stage}.json"
        if store and path.exists():
            return read_json(path)
        self.require_val()
        encoder_stage, generator_stage = self.stages(stage)
        self._require_trained(encoder_stage, generator_stage)
        self._set_threads()
        from coevo.rewards.cohyde import encode_texts

        generator = self.rewriter(generator_stage) if generator_stage else None
        encoder, index = self.encoder(encoder_stage), self.index(encoder_stage)
        result: dict[str, Any] = {"stage": stage, "encoder": encoder_stage, "rewriter": generator_stage,
                                  "splits": {}, "examples": {}}
        for split in splits:
            queries = self._queries(split)
            if not queries:
                raise ValueError(f"{self.dataset_dir}: no {split} query has a relevant tool; nothing to evaluate")
            if generator is not None:
                descriptions = self.describe(generator, queries, what=f"{stage} eval {split}")
                result["examples"][split] = [{"query": q["text"], "description": d}
                                             for q, d in zip(queries[:5], descriptions[:5])]
                texts = [searched_text(q["text"], d, self.cfg.encode) for q, d in zip(queries, descriptions)]
            else:
                texts = [q["text"] for q in queries]
            rankings = index.rank_corpus(encode_texts(encoder, texts), max((*METRIC_KS, *(cutoffs or ()))))
            result["splits"][split] = grouped_metrics(queries, rankings)
            if cutoffs:
                from coevo.retrieval.metrics import ranked_evaluation

                evaluation = ranked_evaluation({q["query_id"]: list(r) for q, r in zip(queries, rankings)},
                                               {q["query_id"]: dict(q["relevant"]) for q in queries}, cutoffs)
                result.setdefault("overall", {})[split] = evaluation.means()
                result.setdefault("per_query", {})[split] = evaluation.per_query
        if store:
            write_json(path, result)
        return result

    def final_evaluation(self, split: str) -> dict[str, Any]:
        """Raw, S1a, vanilla HyDE and the round chosen on val, evaluated once on ``split`` (every
        ranked metric at the ``evaluation.cutoffs`` besides the per-group NDCG@5 / Recall@5);
        each row keeps its per-query values (``per_query``) for the paired comparisons of the
        final table (the chosen round vs vanilla HyDE, the start)."""
        best = self.best_phase()
        rows = []
        for stage in dict.fromkeys((RAW, S1A, HYDE, best)):
            result = self.evaluate(stage, splits=[split], store=False, cutoffs=self.params.evaluation.cutoffs)
            groups = result["splits"][split]
            label = f"best round {best}" if stage == best and stage != HYDE else stage
            if stage == best and stage.startswith("round_") and self.cfg.eval_pairing != "co_trained":
                label += f" ({self.cfg.eval_pairing})"
            rows.append({"label": label, "phase": stage, "split": split, **result["overall"][split],
                         **groups["overall"], "n_queries": groups["overall"]["n"], "groups": groups,
                         "per_query": result["per_query"][split]})
        return {"split": split, "best_phase": best, "start_phase": HYDE, "rows": rows}

    def write_reports(self, metrics_file: Path, plots_csv: Path, report_dir: Path, final: Mapping[str, Any],
                      baselines: Mapping[str, Any]) -> list[str]:
        """metrics.json (per stage, split and group), per-stage CSV, NDCG@5 plot per group, examples."""
        from coevo import report

        history = self.history()
        stages = list(dict.fromkeys(r["stage"] for r in history))
        metrics: dict[str, Any] = {}
        for r in history:
            metrics.setdefault(r["split"], {}).setdefault(r["group"], {})[r["stage"]] = {
                "ndcg@5": r["ndcg@5"], "recall@5": r["recall@5"]}
        metrics[final["split"]] = {row["label"]: row for row in final["rows"]}
        metrics["best_phase"] = final["best_phase"]
        metrics["baselines"] = dict(baselines)
        write_json(metrics_file, metrics)
        report.write_csv([{"step": stages.index(r["stage"]), **r} for r in history], plots_csv)
        groups = sorted({r["group"] for r in history})
        series = {g: [next((r["ndcg@5"] for r in history if r["group"] == g and r["stage"] == s), float("nan"))
                      for s in stages] for g in groups}
        report.plot_series(list(range(len(stages))), series, report_dir / "ndcg5_per_group.png",
                           xlabel="stage (" + ", ".join(stages) + ")", ylabel=f"{MONITOR_SPLIT} NDCG@5",
                           title="CoHyDE: NDCG@5 per group and stage")
        examples = {s: read_json(self.run_dir / "eval" / f"{s}.json").get("examples", {}) for s in stages}
        write_json(report_dir / "examples.json", examples)
        return sorted(str(p) for p in report_dir.iterdir() if p.is_file()) + [str(metrics_file), str(plots_csv)]

    def tracking_series(self) -> list[tuple[int, dict[str, float]]]:
        """Per stage (step): val metrics per group, the overall ones as eval/*, pair-mining figures."""
        out = []
        for step, stage in enumerate(self.stages_done()):
            flat = self.flat_metrics(stage)
            flat.update({f"eval/{k.rsplit('/', 1)[1]}": v for k, v in flat.items()
                         if k.startswith(f"eval/{MONITOR_SPLIT}/overall/")})
            out.append((step, flat))
        return out

    def flat_metrics(self, stage: str) -> dict[str, float]:
        """A finished stage as stable metric names for trackers: ``eval/<split>/<group>/ndcg@5``,
        plus pair-mining and DPO figures (``train/pairs``, ``train/ties_dropped``, ``train/score_gap``,
        ``train/sample_ndcg@5``, ``train/dpo_loss``) for rounds."""
        result = self.evaluate(stage)
        out = {f"eval/{split}/{group}/{name}": float(value)
               for split, groups in result["splits"].items() for group, metrics in groups.items()
               for name, value in metrics.items() if name != "n"}
        info = self._round_summary(stage)
        if info is not None:
            out.update({"train/pairs": float(info["mining"]["pairs"]),
                        "train/ties_dropped": float(info["mining"]["ties_dropped"]),
                        "train/score_gap": float(info["mining"]["mean_score_gap"]),
                        "train/sample_ndcg@5": float(info["mining"]["mean_score"])})
            if "train_loss" in info["dpo"]:
                out["train/dpo_loss"] = float(info["dpo"]["train_loss"])
        return out

    def stages_done(self) -> list[str]:
        order = [RAW, S1A, HYDE] + [round_stage(r) for r in range(1, self.cfg.rounds + 1)]
        return [s for s in order if (self.run_dir / "eval" / f"{s}.json").exists()]

    def history(self) -> list[dict[str, Any]]:
        """One row per (stage, split, group) with ndcg@5, recall@5, n; round rows add pair stats."""
        rows = []
        for stage in self.stages_done():
            result = read_json(self.run_dir / "eval" / f"{stage}.json")
            extra: dict[str, Any] = {}
            info = self._round_summary(stage)
            if info is not None:
                extra = {"round": info["round"], "pairs": info["mining"]["pairs"],
                         "ties_dropped": info["mining"]["ties_dropped"],
                         "mean_score_gap": info["mining"]["mean_score_gap"]}
            for split, groups in result["splits"].items():
                for group, metrics in groups.items():
                    rows.append({"stage": stage, "split": split, "group": group, **metrics, **extra})
        return rows


def grouped_metrics(queries: Sequence[Mapping[str, Any]], rankings: Sequence[Sequence[str]]) -> dict[str, dict]:
    """NDCG@5 and Recall@5 for each group prefix and ``overall`` (macro over queries)."""
    from coevo.retrieval.metrics import ranked_metrics

    groups: dict[str, list[int]] = {}
    for i, q in enumerate(queries):
        groups.setdefault(query_group(q.get("group")), []).append(i)
    out = {}
    for name, members in sorted(groups.items()) + [("overall", list(range(len(queries))))]:
        run = {queries[i]["query_id"]: list(rankings[i]) for i in members}
        qrels = {queries[i]["query_id"]: dict(queries[i]["relevant"]) for i in members}
        metrics = ranked_metrics(run, qrels, ks=METRIC_KS)
        out[name] = {"ndcg@5": float(metrics["ndcg@5"]), "recall@5": float(metrics["recall@5"]), "n": len(members)}
    return out
