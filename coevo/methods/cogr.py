"""CoGR: two keyword generators co-evolving through retrieval reward (see DESIGN.md, "CoGR").

The loop is a chain of phases over one run directory (:class:`coevo.methods.base.Method`
decides what re-runs; a killed run resumes at the last finished phase):

    run_dir/
      stamps/<phase>.json         each finished phase's key and record (coevo.steps)
      seed/                       Algorithm 1: sampled S_i, pooled S_q (parquet), summary
      phases/00_sft/              SFT-initialised generators (or 00_base with sft_init=false)
      phases/01_query/            query-side GRPO against the frozen item index
      phases/02_item/             item-side GRPO against the frozen query index
      ...                         each phase folder, written atomically, holds:
          generators/{query,item}|shared/   LoRA adapters (or full weights)
          keywords.json           ordered keyword sets: items, train and eval queries
          indexes/items.jsonl     item index (keyword -> items), queries.jsonl (keyword -> queries)
          metrics.json            this phase's record: eval (val split), train, keyword counts
          dynamics.json/.csv      distinct keywords by n-gram length, example keyword sets

Every phase reloads its inputs from the previous phase's folder and reseeds from
(seed, phase), so an interrupted-and-resumed run computes exactly what an uninterrupted one does.
"""

from __future__ import annotations

import csv
import io as _io
import logging
import shutil
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from coevo import distributed
from coevo.config import Params
from coevo.methods.base import MONITOR_SPLIT, Method, Phase
from coevo.io import atomic_path, read_json, write_json, write_parquet, write_text
from coevo.methods.cogr_context import SearchResults, item_description, item_prompt, query_prompt
from coevo.models.prompts import keyword_completion

if TYPE_CHECKING:  # types only: the generator module pulls in torch and transformers
    from coevo.config import CoGREarlyStopping
    from coevo.models.generator import Generator

log = logging.getLogger(__name__)

QUERY, ITEM, SHARED = "query", "item", "shared"
EXAMPLES_PER_SIDE = 3
# Extra completions sampled per item by G_0 when one sample yields fewer than M keywords.
SEED_SAMPLES = 2


def phase_seed(seed: int, phase: int) -> int:
    """Seed of one phase: fixed by (run seed, phase index), independent of what ran before."""
    return int(np.random.SeedSequence([seed, phase + 1]).generate_state(1)[0] % (2**31 - 1))


@dataclass(frozen=True)
class PhaseSpec:
    index: int
    kind: str  # "sft" | "base" | "query" | "item"
    round: int

    @property
    def name(self) -> str:
        return f"{self.index:02d}_{self.kind}"


def top_n_keywords(keyword_lists: Sequence[Sequence[str]], n: int) -> list[str]:
    """Algorithm 1 pooling: the N most frequent keywords of the multiset union B_q.

    Ties are broken by first appearance in ``keyword_lists`` (callers pass them sorted by
    item id), then alphabetically, so the result never depends on dict or set order.
    """
    counts: Counter[str] = Counter()
    first_seen: dict[str, int] = {}
    for keywords in keyword_lists:
        for kw in keywords:
            counts[kw] += 1
            first_seen.setdefault(kw, len(first_seen))
    ranked = sorted(counts, key=lambda kw: (-counts[kw], first_seen[kw], kw))
    return ranked[:n]


def ngram_histogram(keyword_sets: Mapping[str, Sequence[str]]) -> dict[str, int]:
    """Distinct keywords by number of words: {"1": .., "2": .., "3": .., "4+": .., "total": ..}."""
    distinct = {kw for kws in keyword_sets.values() for kw in kws}
    hist = {"1": 0, "2": 0, "3": 0, "4+": 0}
    for kw in distinct:
        words = len(kw.split())
        hist[str(words) if words < 4 else "4+"] += 1
    hist["total"] = len(distinct)
    return hist


# Knobs each CoGR phase depends on (besides `seed`); `rounds` and early stopping are left out,
# so adding a round or changing the patience keeps every finished phase.
SEED_KNOBS = ("generator", "seed_generator", "m_item_keywords", "n_query_keywords", "sampling", "seed_temperature",
              "sft_init", "item_context", "system_prompt")
NOT_SFT_KNOBS = ("rounds", "early_stopping", "grpo", "query_side_only", "item_reward")
NOT_GRPO_KNOBS = ("rounds", "early_stopping")


def _knobs(exclude: Sequence[str] = (), only: Sequence[str] | None = None) -> tuple[str, ...]:
    from coevo.config import CoGRParams

    names = only if only is not None else [n for n in CoGRParams.model_fields if n not in exclude]
    return ("seed", *(f"cogr.{n}" for n in names))


def _grpo_knobs(kind: str) -> tuple[str, ...]:
    """A GRPO phase's knobs: everything but the rounds and early stopping, less the other
    side's epochs (a query phase does not depend on cogr.grpo.item_epochs, nor an item phase
    on query_epochs except through the phases it reads)."""
    from coevo.config import CoGRGRPOParams

    other = "item_epochs" if kind == QUERY else "query_epochs"
    grpo = tuple(f"cogr.grpo.{n}" for n in CoGRGRPOParams.model_fields if n != other)
    return (*_knobs((*NOT_GRPO_KNOBS, "grpo")), *grpo)


# A prompt column of this name makes train_grpo's reward wrapper (which forwards the prompt
# columns by name) hand our reward TRL's ``completion_ids`` keyword argument: the sampled
# token ids, whose last token tells a completion cut by the token limit (no end of sequence).
COMPLETION_IDS = "completion_ids"


def screened_first(candidates: Sequence[str], groups: Sequence[Sequence[float]]) -> list[str]:
    """Candidates whose sampled rewards differ (a non-zero advantage for GRPO), in draw order, then the
    others in draw order: the phase takes the first max_prompts_per_phase."""
    mixed = [c for c, g in zip(candidates, groups) if max(g) > min(g)]
    return mixed + [c for c, g in zip(candidates, groups) if max(g) == min(g)]


def truncation_flags(generator, max_tokens: int):
    """``flags(completion_ids, texts)``: per completion, True when it was cut by the token limit.

    The rule is TRL's own (``mask_truncated_completions``): the last sampled token is neither
    an end-of-sequence nor the pad token. Without ids (another trainer path) it falls back to
    counting the text's tokens against ``max_tokens``.
    """
    tokenizer = generator.tokenizer
    ends = {tokenizer.eos_token_id, tokenizer.pad_token_id}
    config_eos = getattr(getattr(generator.model, "generation_config", None), "eos_token_id", None)
    ends.update(config_eos if isinstance(config_eos, (list, tuple)) else [config_eos])
    ends.discard(None)

    def flags(completion_ids: Sequence[Sequence[int]] | None, texts: Sequence[Any]) -> list[bool]:
        if completion_ids is not None:
            return [len(ids) > 0 and int(ids[-1]) not in ends for ids in completion_ids]
        from coevo.models.prompts import completion_text

        return [len(tokenizer(completion_text(t), add_special_tokens=False)["input_ids"]) >= max_tokens for t in texts]

    return flags


def kmax_budget_tokens(tokenizer, keyword_sets: Mapping[str, Sequence[str]], k_max: int) -> int:
    """Tokens a list of k_max + 1 of the side's most frequent keywords takes (", "-joined, plus
    the end of sequence): the completion budget the K_max penalty needs to be reachable."""
    counts = Counter(k for kws in keyword_sets.values() for k in kws)
    common = [k for k, _ in counts.most_common(k_max + 1)] or ["keyword"]
    words = [common[i % len(common)] for i in range(k_max + 1)]
    return len(tokenizer(", ".join(words), add_special_tokens=False)["input_ids"]) + 1


class CoGR(Method):
    """One CoGR training run in ``run_dir`` (see the module docstring for the layout).

    Phases: ``seed`` (Algorithm 1, with sft_init), ``00_sft`` (or ``00_base``), then per round
    ``NN_query`` and ``NN_item`` GRPO phases; :class:`~coevo.methods.base.Method` runs them.
    """

    name = "cogr"
    title = "CoGR"
    code = ("coevo.methods.base", "coevo.methods.cogr", "coevo.methods.cogr_context", "coevo.methods.cogr_report",
            "coevo.models", "coevo.train", "coevo.rewards.cogr", "coevo.retrieval", "coevo.data.schema", "coevo.io", "coevo.runtime", "coevo.compute")
    plan_params = ("cogr.rounds", "cogr.sft_init", "cogr.query_side_only", "cogr.early_stopping")
    table_metrics = ("f1", "recall@100", "ndcg@10")
    paper_baseline = "bm25"  # the sparse lexical retriever CoGR's keyword index replaces (F1@k, k chosen on val)

    def __init__(
        self,
        run_dir: str | Path,
        params: Params,
        dataset_dir: str | Path,
        *,
        progress: bool = False,
        data_fingerprint: str | None = None,
        cache_dir: Path | None = None,
        use_vllm: bool = False,
        generation_batch_size: int | None = None,
    ):
        super().__init__(run_dir, params, dataset_dir, progress=progress, data_fingerprint=data_fingerprint)
        self.cfg = params.cogr
        self.cache_dir = cache_dir
        self.use_vllm = use_vllm
        self.generation_batch_size = generation_batch_size or _default_generation_batch_size()
        self.train_qrels = self.dataset.relevant("train")
        self.require_val()
        self.eval_qrels = self.dataset.relevant(MONITOR_SPLIT)
        if not self.train_qrels:
            raise ValueError(f"{self.dataset_dir}: no train query has a relevant item; CoGR cannot train")
        items = self.dataset.items.sort_values("item_id", kind="stable")
        self.item_ids: list[str] = list(items["item_id"])
        self.item_title = dict(zip(items["item_id"], items["title"]))
        self.item_desc = {i: ("" if pd.isna(t) else str(t)) for i, t in zip(items["item_id"], items["text"])}
        queries = self.dataset.queries
        self.query_text = dict(zip(queries["query_id"], queries["text"]))
        self.train_query_ids = sorted(self.dataset.queries_in("train")["query_id"])
        # Algorithm 1 pools targets for every train query, so the seed artifacts do not depend on the cap.
        self.all_train_query_ids, self.all_train_qrels = list(self.train_query_ids), dict(self.train_qrels)
        cap = self.cfg.max_train_queries
        if cap is not None and cap < len(self.train_query_ids):
            # Seeded subset (CPU budgets): it defines the SFT targets, the query index and GRPO prompts.
            with_relevant = [q for q in self.train_query_ids if q in self.train_qrels]
            picked = np.random.default_rng(self.seed).choice(with_relevant, size=min(cap, len(with_relevant)), replace=False)
            self.train_query_ids = sorted(picked)
            self.train_qrels = {q: self.train_qrels[q] for q in self.train_query_ids}
        self.eval_query_ids = sorted(self.dataset.queries_in(MONITOR_SPLIT)["query_id"])
        self.search_results = SearchResults.from_params(self.dataset.items, self.cfg)
        self._snippets: dict[str, list[str]] = {}

    @property
    def early_stopping_params(self) -> CoGREarlyStopping:
        return self.cfg.early_stopping

    # ------------------------------------------------------------------ layout
    @property
    def phases_dir(self) -> Path:
        return self.run_dir / "phases"

    @property
    def seed_dir(self) -> Path:
        return self.run_dir / "seed"

    def schedule(self) -> list[PhaseSpec]:
        """Phase 0 (SFT, or the untrained base with sft_init=false), then the GRPO phases."""
        specs = [PhaseSpec(0, "sft" if self.cfg.sft_init else "base", 0)]
        for r in range(1, self.cfg.rounds + 1):
            specs.append(PhaseSpec(len(specs), QUERY, r))
            if not self.cfg.query_side_only:
                specs.append(PhaseSpec(len(specs), ITEM, r))
        return specs

    def phases(self) -> list[Phase]:
        out = []
        if self.cfg.sft_init:
            out.append(Phase("seed", "Algorithm 1 seeds", _knobs(only=SEED_KNOBS), ("seed",)))
        for spec in self.schedule():
            if spec.index == 0:
                out.append(Phase(spec.name, "SFT" if spec.kind == "sft" else "untrained base", _knobs(NOT_SFT_KNOBS),
                                 (f"phases/{spec.name}",), reads=("seed",) if self.cfg.sft_init else (),
                                 monitored=True))
            else:
                out.append(Phase(spec.name, f"round {spec.round} {spec.kind} GRPO", _grpo_knobs(spec.kind),
                                 (f"phases/{spec.name}",), reads=(out[-1].name,), monitored=True,
                                 stoppable=True))
        return out

    def _run(self, phase: Phase) -> dict[str, Any]:
        if phase.name == "seed":
            return self.seed_keywords()
        index = int(phase.name.split("_", 1)[0])
        return self.sft() if index == 0 else self.grpo_phase(index)

    def phase_dir(self, index: int) -> Path:
        spec = self.schedule()[index]
        return self.phases_dir / spec.name

    def phase_index(self, name: str) -> int:
        """``"01_query"`` -> 1: the position of a phase in :meth:`schedule`."""
        return int(name.split("_", 1)[0])

    def _say(self, message: str) -> None:
        self.say(message)

    # -------------------------------------------------------------- generators
    def _corpus(self) -> list[str]:
        """Text the `tiny` model's tokenizer is trained on (ignored by real models)."""
        texts = [self.item_title[i] + " " + self.item_desc[i] for i in self.item_ids]
        return texts + [self.query_text[q] for q in self.train_query_ids + self.eval_query_ids]

    def _new_generator(self, name: str, *, lora: bool = True):
        from coevo.models.generator import Generator

        return Generator.create(
            name, self.cfg.lora if lora else None, seed=self.seed, corpus=self._corpus(), cache_dir=self.cache_dir
        )

    def _sides(self) -> tuple[str, ...]:
        return (SHARED,) if self.cfg.shared_generator else (QUERY, ITEM)

    def generators(self, index: int) -> dict[str, "Generator"]:
        """{QUERY: gen, ITEM: gen} from a finished phase (the same object twice when shared): what
        its evaluation and serving generate with."""
        from coevo.models.generator import Generator

        folder = self.phase_dir(index) / "generators"
        if self.cfg.shared_generator:
            shared = Generator.load(folder / SHARED)
            return {QUERY: shared, ITEM: shared}
        return {QUERY: Generator.load(folder / QUERY), ITEM: Generator.load(folder / ITEM)}

    # --------------------------------------------------------------- keywords
    def _generate_keywords(self, generator, prompts: Sequence[Any], description: str, *, seed: int) -> list[tuple[str, ...]]:
        """Greedy keyword sets (parsed, normalised, at most k_max) for index building.

        Parsed tolerantly (a chat preamble or trailing explanation is dropped, the keywords
        kept): an index entry is the model's best reading of each item or query. The GRPO
        rewards are strict (coevo.rewards.cogr), so the policy learns to write bare lists."""
        from coevo.retrieval.keywords import parse_keywords

        from coevo.compute import generate_texts

        outputs = generate_texts(
            generator,
            prompts,
            compute=self.params.compute,  # local, or Ray Data shards (same greedy outputs)
            scratch=self._compute_scratch,
            batch_size=self.generation_batch_size,
            temperature=0.0,
            max_new_tokens=self.cfg.sampling.max_new_tokens,
            seed=seed,
            progress=self.progress,
            description=description,
        )
        return [parse_keywords(out[0]).keywords[: self.cfg.k_max] for out in outputs]

    @property
    def _compute_scratch(self) -> Path:
        """Where a Ray pass saves an in-memory generator for its workers (inside the run folder)."""
        return self.run_dir / "scratch" / "compute"

    def _item_prompts(self, item_ids: Sequence[str]) -> list[Any]:
        return [item_prompt(self.item_title[i], self.item_desc[i], self.cfg.item_context, self.cfg.system_prompt)
                for i in item_ids]

    def _query_prompts(self, query_ids: Sequence[str]) -> list[Any]:
        """Query prompts (coevo.methods.cogr_context): with query_context = search_results each carries
        the query's BM25 snippets, computed once per query and the same in SFT, GRPO and evaluation."""
        if self.search_results is None:
            return [query_prompt(self.query_text[q], system_prompt=self.cfg.system_prompt) for q in query_ids]
        missing = [q for q in dict.fromkeys(query_ids) if q not in self._snippets]
        if missing:
            found = self.search_results.for_texts([self.query_text[q] for q in missing])
            self._snippets.update(zip(missing, found))
        return [query_prompt(self.query_text[q], self._snippets[q], self.cfg.system_prompt) for q in query_ids]

    def _index_items(self, generator, seed: int) -> dict[str, list[str]]:
        sets = self._generate_keywords(generator, self._item_prompts(self.item_ids), "indexing items", seed=seed)
        return {i: list(k) for i, k in zip(self.item_ids, sets)}

    def _index_queries(self, generator, seed: int) -> dict[str, dict[str, list[str]]]:
        ids = self.train_query_ids + [q for q in self.eval_query_ids if q not in set(self.train_query_ids)]
        sets = self._generate_keywords(generator, self._query_prompts(ids), "indexing queries", seed=seed)
        by_id = {q: list(k) for q, k in zip(ids, sets)}
        return {
            "train": {q: by_id[q] for q in self.train_query_ids},
            "eval": {q: by_id[q] for q in self.eval_query_ids},
        }

    # ------------------------------------------------------ Algorithm 1 (seed)
    def seed_keywords(self) -> dict[str, Any]:
        """Algorithm 1: S_i = M keywords sampled from G_0 per item; S_q = top-N of B_q.

        Writes seed/items.parquet (item_id, keywords), seed/queries.parquet (query_id,
        keywords, n_relevant) and seed/summary.json; returns the summary.
        """
        from coevo.models.extractive import extract_keywords, is_extractive

        done = self.seed_dir / "summary.json"
        started = time.perf_counter()
        name = self.cfg.seed_generator or self.cfg.generator
        fallbacks = 0
        if is_extractive(name):
            self._say(f"Algorithm 1: {self.cfg.m_item_keywords} extractive keywords per item from G_0 = {name} "
                      "(not an LLM: see coevo/models/extractive.py)")
            extracted = extract_keywords([self.item_title[i] for i in self.item_ids],
                                         [item_description(self.item_desc[i], self.cfg.item_context)
                                          for i in self.item_ids], self.cfg.m_item_keywords)
            item_sets = dict(zip(self.item_ids, extracted))
        else:
            item_sets, fallbacks = self._sample_seed_keywords(name)
        query_rows = []
        for q in self.all_train_query_ids:
            relevant = sorted(self.all_train_qrels.get(q, {}))
            if not relevant:
                continue
            s_q = top_n_keywords([item_sets[i] for i in relevant if i in item_sets], self.cfg.n_query_keywords)
            query_rows.append({"query_id": q, "keywords": s_q, "n_relevant": len(relevant)})
        self.seed_dir.mkdir(parents=True, exist_ok=True)
        write_parquet(
            self.seed_dir / "items.parquet",
            pd.DataFrame({"item_id": list(item_sets), "keywords": list(item_sets.values())}),
        )
        write_parquet(self.seed_dir / "queries.parquet", pd.DataFrame(query_rows))
        summary = {
            "seed_generator": name,
            "seed_kind": "extractive (YAKE)" if is_extractive(name) else "LLM",
            "items": len(item_sets),
            "queries": len(query_rows),
            "item_fallbacks": fallbacks,
            "mean_item_keywords": float(np.mean([len(v) for v in item_sets.values()])),
            "mean_query_keywords": float(np.mean([len(r["keywords"]) for r in query_rows])) if query_rows else 0.0,
            "seconds": time.perf_counter() - started,
        }
        write_json(done, summary)  # last: marks the seed artifacts complete
        return summary

    def _sample_seed_keywords(self, name: str) -> tuple[dict[str, list[str]], int]:
        """Algorithm 1's S_i sampled from an LLM G_0: ({item: keywords}, items that fell back to their title)."""
        from coevo.compute import generate_texts
        from coevo.models.generator import seeded
        from coevo.retrieval.keywords import normalize_keyword, parse_keywords

        self._say(f"Algorithm 1: sampling {self.cfg.m_item_keywords} keywords per item from G_0 = {name}")
        seed = phase_seed(self.seed, -1)
        with seeded(seed):
            g0 = self._new_generator(name, lora=False)
        samples = generate_texts(
            g0,
            self._item_prompts(self.item_ids),
            compute=self.params.compute,
            scratch=self._compute_scratch,
            num_return_sequences=SEED_SAMPLES,
            temperature=self.cfg.seed_temperature,
            top_p=self.cfg.sampling.top_p,
            max_new_tokens=self.cfg.sampling.max_new_tokens,
            seed=seed,
            progress=self.progress,
            batch_size=self.generation_batch_size,
            description="G_0 item keywords",
        )
        del g0
        item_sets: dict[str, list[str]] = {}
        fallbacks = 0
        for item_id, outs in zip(self.item_ids, samples):
            pooled: list[str] = []
            for out in outs:  # later samples only top up a short first sample
                pooled.extend(k for k in parse_keywords(out).keywords if k not in pooled)
            if not pooled:
                # G_0 gave nothing usable: fall back to the title, so every item stays retrievable.
                fallbacks += 1
                pooled = [normalize_keyword(self.item_title[item_id])]
            item_sets[item_id] = pooled[: self.cfg.m_item_keywords]
        return item_sets, fallbacks

    def seed_targets(self) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        """(item S_i, query S_q) from the seed artifacts."""
        items = pd.read_parquet(self.seed_dir / "items.parquet")
        queries = pd.read_parquet(self.seed_dir / "queries.parquet")
        return (
            {i: list(k) for i, k in zip(items["item_id"], items["keywords"])},
            {q: list(k) for q, k in zip(queries["query_id"], queries["keywords"])},
        )

    # --------------------------------------------------------------- phase 0
    def sft(self) -> dict[str, Any]:
        """Phase 0: SFT both generators on the Algorithm 1 targets (or, with sft_init=false,
        take the untrained base generators), build both indexes, evaluate."""
        from coevo.models.generator import seeded
        from coevo.train.sft import train_sft

        spec = self.schedule()[0]
        seed = phase_seed(self.seed, 0)
        started = time.perf_counter()
        train_metrics: dict[str, Any] = {}
        with seeded(seed):
            if self.cfg.shared_generator:
                shared = self._new_generator(self.cfg.generator)
                gens = {QUERY: shared, ITEM: shared}
            else:
                gens = {QUERY: self._new_generator(self.cfg.generator), ITEM: self._new_generator(self.cfg.generator)}
        if self.cfg.sft_init:
            item_sets, query_sets = self.seed_targets()
            targets = {q: k for q, k in query_sets.items() if k and q in self.train_qrels}
            examples = {
                QUERY: [{"prompt": p, "completion": keyword_completion(k)}
                        for p, k in zip(self._query_prompts(list(targets)), targets.values())],
                ITEM: [{"prompt": p, "completion": keyword_completion(k)}
                       for p, k in zip(self._item_prompts(list(item_sets)), item_sets.values())],
            }
            scratch = self.run_dir / "scratch"
            if self.cfg.shared_generator:
                self._say(f"SFT shared generator on {len(examples[QUERY])} query + {len(examples[ITEM])} item targets")
                m = train_sft(gens[QUERY], examples[QUERY] + examples[ITEM], self.cfg.sft, scratch / "sft", seed,
                              what=f"phase {spec.name} (shared generator)", knob="cogr.sft")
                train_metrics.update({k.split("/", 1)[-1]: v for k, v in m.items()})
            else:
                for side in (QUERY, ITEM):
                    self._say(f"SFT {side} generator on {len(examples[side])} targets")
                    m = train_sft(gens[side], examples[side], self.cfg.sft, scratch / f"sft_{side}", seed,
                                  what=f"phase {spec.name} ({side} generator)", knob="cogr.sft")
                    train_metrics.update({f"{side}_{k.split('/', 1)[-1]}": v for k, v in m.items()})
                    if side == QUERY:
                        train_metrics["loss"] = m["train/loss"]
        return self._finish_phase(spec, gens, changed=(QUERY, ITEM), train_metrics=train_metrics, started=started)

    # ------------------------------------------------------------ GRPO phases
    def grpo_phase(self, index: int) -> dict[str, Any]:
        """GRPO phase ``index`` (>= 1): train one side against the other side's frozen index,
        rebuild the changed index(es), evaluate, checkpoint. Returns the phase record."""
        specs = self.schedule()
        if not 1 <= index < len(specs):
            raise ValueError(f"phase index {index} out of range 1..{len(specs) - 1}")
        from coevo.models.generator import seeded
        from coevo.rewards.cogr import ItemReward, QueryReward
        from coevo.retrieval.inverted_index import InvertedIndex
        from coevo.train.grpo import train_grpo

        spec = specs[index]
        seed = phase_seed(self.seed, index)
        started = time.perf_counter()
        keywords = self.keywords(index - 1)
        with seeded(seed):
            gens = self.generators(index - 1)
        rng = np.random.default_rng(seed)
        budget = self.cfg.grpo.max_completion_length
        truncated = truncation_flags(gens[spec.kind], budget)
        # A completion cut by the token limit gets -1 and is never parsed (rewards/cogr.py). It is
        # not masked out of the loss (TRL's mask_truncated_completions stays off unless set in
        # cogr.grpo.trl): its -1 is what teaches the policy to end its list within the budget.
        if spec.kind == QUERY:
            pool = [q for q in self.train_query_ids if q in self.train_qrels]
            reward = QueryReward(InvertedIndex.from_keyword_sets(keywords["items"]), self.train_qrels, self.cfg.k_max)

            def reward_fn(completions: list[str], query_id: list[str], completion_ids=None) -> list[float]:
                return reward(query_id, completions, truncated=truncated(completion_ids, completions))

            column, prompts_of, side_sets = "query_id", self._query_prompts, keywords["queries_train"]
        else:
            pool = list(self.item_ids)
            reward = ItemReward(
                keywords["queries_train"], keywords["items"], self.train_qrels, self.cfg.k_max, mode=self.cfg.item_reward
            )

            def reward_fn(completions: list[str], item_id: list[str], completion_ids=None) -> list[float]:
                return reward(item_id, completions, truncated=truncated(completion_ids, completions))

            column, prompts_of, side_sets = "item_id", self._item_prompts, keywords["items"]
        reward_fn.__name__ = f"{spec.kind}_reward"
        solved_at = 1.0 if spec.kind == QUERY else None  # query reward: set F1 (item side: a marginal gain)
        chosen, screening = self._phase_prompts(spec, pool, rng, gens[spec.kind], prompts_of,
                                                lambda texts, ids: reward_fn(texts, **{column: ids}), solved_at, seed)
        rows = [{"prompt": p, column: key, COMPLETION_IDS: None} for key, p in zip(chosen, prompts_of(list(chosen)))]
        needed = kmax_budget_tokens(gens[spec.kind].tokenizer, side_sets, self.cfg.k_max)
        if needed > budget:
            log.warning("cogr.grpo.max_completion_length=%d cannot hold k_max + 1 = %d keywords (about %d tokens): "
                        "the K_max penalty cannot fire; completions cut at the limit get -1 instead",
                        budget, self.cfg.k_max + 1, needed)
        self._say(f"phase {spec.name}: GRPO on {len(rows)} {spec.kind} prompts (round {spec.round})")
        with seeded(seed):
            result = train_grpo(
                gens[spec.kind],
                rows,
                reward_fn,
                self.cfg.grpo,
                self.run_dir / "scratch" / spec.name,
                seed,
                epochs=self.cfg.grpo.query_epochs if spec.kind == QUERY else self.cfg.grpo.item_epochs,
                temperature=self.cfg.sampling.temperature,
                top_p=self.cfg.sampling.top_p,
                use_vllm=self.use_vllm,
                what=f"phase {spec.name}",
                knob="cogr.grpo",
                solved_at=solved_at,
            )
        train_metrics = {**result, **screening, "prompts": len(rows), "kmax_budget_tokens": needed}
        changed = (QUERY, ITEM) if self.cfg.shared_generator else (spec.kind,)
        return self._finish_phase(spec, gens, changed=changed, train_metrics=train_metrics, started=started)

    def _phase_prompts(
        self, spec: PhaseSpec, pool: list[str], rng: np.random.Generator, generator: Any,
        prompts_of: Callable[[list[str]], list[Any]], reward: Callable[[list[str], list[str]], Sequence[float]],
        solved_at: float | None, seed: int,
    ) -> tuple[list[str], dict[str, Any]]:
        """The ids a GRPO phase trains on (sorted) and what screening saw. A seeded draw of
        ``max_prompts_per_phase``; with ``screen_factor`` > 1, that many times more candidates, each
        sampled ``num_generations`` times by the phase's starting policy, the ones with differing
        rewards first (:func:`screened_first`)."""
        from coevo.train.grpo import GroupOutcomes

        grpo = self.cfg.grpo
        cap = grpo.max_prompts_per_phase
        if not cap or cap >= len(pool):
            return list(pool), {}
        if grpo.screen_factor == 1:
            return sorted(rng.choice(pool, size=cap, replace=False)), {}
        started = time.perf_counter()
        candidates = [str(c) for c in rng.choice(pool, size=min(len(pool), cap * grpo.screen_factor), replace=False)]
        size = grpo.num_generations
        samples = generator.generate(
            prompts_of(candidates), num_return_sequences=size, temperature=self.cfg.sampling.temperature,
            top_p=self.cfg.sampling.top_p, max_new_tokens=grpo.max_completion_length, seed=seed, progress=False,
        )
        values = list(reward([c for group in samples for c in group], [c for c in candidates for _ in range(size)]))
        groups = [values[i * size:(i + 1) * size] for i in range(len(candidates))]
        seen = GroupOutcomes(size=size, solved_at=solved_at)  # the same counts as the phase's own groups
        seen.add(values)
        mixed = seen.groups - seen.zero_std
        self._say(f"phase {spec.name}: screened {len(candidates)} {spec.kind} prompts, {mixed} with differing rewards")
        shares = seen.summary()
        return sorted(screened_first(candidates, groups)[:cap]), {
            "screened": len(candidates),
            "screened_mixed_share": mixed / seen.groups,
            "screened_solved_in_none_share": shares["groups_solved_in_none_share"],
            "screened_solved_in_all_share": shares["groups_solved_in_all_share"],
            "screen_seconds": time.perf_counter() - started,
        }

    # ------------------------------------------------------ checkpoint + eval
    def _finish_phase(
        self,
        spec: PhaseSpec,
        gens: dict[str, Any],
        *,
        changed: Sequence[str],
        train_metrics: dict[str, Any],
        started: float,
    ) -> dict[str, Any]:
        """Rebuild the changed indexes, evaluate, and write the phase folder atomically."""
        from coevo.retrieval.evaluate import evaluate_keyword_retrieval
        from coevo.retrieval.inverted_index import InvertedIndex

        seed = phase_seed(self.seed, spec.index)
        previous = self.keywords(spec.index - 1) if spec.index > 0 else None
        if ITEM in changed or previous is None:
            items = self._index_items(gens[ITEM], seed)
            self._check_yield(spec, ITEM, items)
        else:
            items = previous["items"]
        if QUERY in changed or previous is None:
            q = self._index_queries(gens[QUERY], seed)
            queries_train, queries_eval = q["train"], q["eval"]
            self._check_yield(spec, QUERY, {**queries_train, **queries_eval})
        else:
            queries_train, queries_eval = previous["queries_train"], previous["queries_eval"]
        eval_metrics = evaluate_keyword_retrieval(
            queries_eval, items, self.eval_qrels, query_ids=[q for q in self.eval_query_ids if q in self.eval_qrels]
        )
        train_eval = evaluate_keyword_retrieval(
            queries_train, items, self.train_qrels, query_ids=[q for q in self.train_query_ids if q in self.train_qrels]
        )
        record: dict[str, Any] = {
            "phase": spec.index,
            "name": spec.name,
            "kind": spec.kind,
            "round": spec.round,
            "eval": {k: float(v) for k, v in eval_metrics.items()},
            "train_set": {"f1": float(train_eval["f1"])},
            "train": train_metrics,
            "keywords": {
                "item_mean": float(np.mean([len(v) for v in items.values()])) if items else 0.0,
                "query_mean": float(np.mean([len(v) for v in queries_eval.values()])) if queries_eval else 0.0,
                "item_empty": int(sum(1 for v in items.values() if not v)),
                "query_empty": int(sum(1 for v in queries_eval.values() if not v)),
            },
        }
        record["seconds"] = time.perf_counter() - started
        dynamics = self._dynamics(spec, items, {**queries_train, **queries_eval})

        dest = self.phases_dir / spec.name
        with atomic_path(dest, is_dir=True) as tmp:
            gen_dir = tmp / "generators"
            gen_dir.mkdir()
            for side in self._sides():
                side_gen = gens[QUERY] if side == SHARED else gens[side]
                if side == SHARED or side in changed or spec.index == 0:
                    side_gen.save(gen_dir / side)
                else:  # unchanged side: hard-link the previous phase's files (no copy)
                    _link_tree(self.phase_dir(spec.index - 1) / "generators" / side, gen_dir / side)
            write_json(
                tmp / "keywords.json",
                {"items": items, "queries_train": queries_train, "queries_eval": queries_eval},
                indent=None,
            )
            InvertedIndex.from_keyword_sets(items).save(tmp / "indexes" / "items.jsonl")
            InvertedIndex.from_keyword_sets({**queries_train, **queries_eval}).save(tmp / "indexes" / "queries.jsonl")
            write_json(tmp / "dynamics.json", dynamics)
            write_text(tmp / "dynamics.csv", _dynamics_csv(spec, dynamics))
            write_json(tmp / "metrics.json", record)  # last inside the folder; the folder rename commits all
        if distributed.is_writer():  # the trainers' scratch is shared by the ranks of a launch
            shutil.rmtree(self.run_dir / "scratch", ignore_errors=True)
        self._say(
            f"phase {spec.name}: val f1={record['eval']['f1']:.4f} recall@100={record['eval']['recall@100']:.4f} "
            f"ndcg@10={record['eval']['ndcg@10']:.4f} ({record['seconds']:.0f}s)"
        )
        return record

    def _check_yield(self, spec: PhaseSpec, side: str, sets: Mapping[str, Sequence[str]]) -> None:
        """Fail the phase (before it is checkpointed) when a rebuilt side has no keyword for more
        than ``cogr.max_empty_share`` of its inputs: such an index cannot retrieve them."""
        from coevo.checks import check_generation_yield

        check_generation_yield(sets, self.cfg.max_empty_share, f"phase {spec.name}, {side} generator",
                               knob="cogr.max_empty_share")

    def _dynamics(self, spec: PhaseSpec, items: Mapping[str, Sequence[str]], queries: Mapping[str, Sequence[str]]) -> dict[str, Any]:
        example_items = self.item_ids[:EXAMPLES_PER_SIDE]
        example_queries = [q for q in self.eval_query_ids if q in self.eval_qrels][:EXAMPLES_PER_SIDE]
        return {
            "phase": spec.index,
            "name": spec.name,
            "items": {"distinct_by_ngram": ngram_histogram(items)},
            "queries": {"distinct_by_ngram": ngram_histogram(queries)},
            "examples": {
                "items": [{"item_id": i, "title": self.item_title[i], "keywords": list(items.get(i, []))} for i in example_items],
                "queries": [
                    {"query_id": q, "text": self.query_text[q], "keywords": list(queries.get(q, []))} for q in example_queries
                ],
            },
        }

    # ---------------------------------------------------------------- reading
    def keywords(self, index: int) -> dict[str, dict[str, list[str]]]:
        """Keyword sets after phase ``index``: {"items", "queries_train", "queries_eval"}."""
        path = self.phase_dir(index) / "keywords.json"
        if not path.exists():
            raise FileNotFoundError(f"{path}: phase {index} has not finished")
        return read_json(path)

    def evaluate(self, index: int, split: str, *, cutoffs: Sequence[int] | None = None,
                 per_query: bool = False) -> dict[str, Any]:
        """Evaluate the keyword sets of finished phase ``index`` on ``split``: the mean metrics
        (ranked ones at ``cutoffs``, default the library's), the query count and, with
        ``per_query``, the per-query values ({metric: {query_id: value}}). Query keywords of
        a split other than val are generated with the phase's query generator."""
        from coevo.retrieval.evaluate import evaluate_keyword_retrieval

        kw = self.keywords(index)
        qrels = self.dataset.relevant(split)
        if split == MONITOR_SPLIT:
            queries = kw["queries_eval"]
        else:
            ids = sorted(self.dataset.queries_in(split)["query_id"])
            gen = self.generators(index)[QUERY]
            sets = self._generate_keywords(gen, self._query_prompts(ids), f"indexing {split} queries", seed=self.seed)
            queries = {q: list(k) for q, k in zip(ids, sets)}
        query_ids = [q for q in queries if q in qrels]
        if not query_ids:
            raise ValueError(f"{self.dataset_dir}: no {split} query has a relevant item; nothing to evaluate")
        evaluation = evaluate_keyword_retrieval(queries, kw["items"], qrels, cutoffs=cutoffs, query_ids=query_ids,
                                                per_query=True)
        out = {k: float(v) for k, v in evaluation.means().items()} | {"n_queries": evaluation.n_queries}
        return out | {"per_query": evaluation.per_query} if per_query else out

    def final_evaluation(self, split: str) -> dict[str, Any]:
        """The start (phase 0) and the phase chosen on val, evaluated once on ``split`` at the
        ``evaluation.cutoffs``; each row keeps its per-query values (``per_query``: {metric:
        {query_id: value}}) for the paired comparisons of the final table."""
        best = self.best_phase()
        start = self.schedule()[0].name
        rows = []
        for name in dict.fromkeys((start, best)):
            label = {"sft": "SFT start", "base": "untrained start"}.get(self.schedule()[0].kind) if name == start \
                else f"best phase {name}"
            rows.append({"label": label, "phase": name, "split": split,
                         **self.evaluate(self.phase_index(name), split, cutoffs=self.params.evaluation.cutoffs,
                                         per_query=True)})
        if best == start:
            rows.append({**rows[0], "label": f"best phase {best}"})
        return {"split": split, "best_phase": best, "start_phase": start, "rows": rows}

    def exports(self, index_dir: Path, final: Mapping[str, Any]) -> dict[str, Any]:
        """The chosen phase's item keywords as a Lucene index that pyserini can search."""
        from coevo.retrieval.lucene import export_keyword_index

        out = index_dir / "lucene"
        export_keyword_index(self.keywords(self.phase_index(final["best_phase"]))["items"], str(out))
        return {"lucene_dir": str(out)}

    def write_reports(self, metrics_file: Path, plots_csv: Path, report_dir: Path, final: Mapping[str, Any],
                      baselines: Mapping[str, Any]) -> list[str]:
        from coevo.methods.cogr_report import write_cogr_reports

        return write_cogr_reports(self, metrics_file, plots_csv, report_dir, final, baselines)


def _default_generation_batch_size() -> int:
    import torch

    return 64 if torch.cuda.is_available() else 16


def _link_tree(src: Path, dest: Path) -> None:
    def link(s: str, d: str) -> None:
        try:
            Path(d).hardlink_to(s)
        except OSError:
            shutil.copy2(s, d)

    shutil.copytree(src, dest, copy_function=link)


def _dynamics_csv(spec: PhaseSpec, dynamics: Mapping[str, Any]) -> str:
    buffer = _io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["phase", "name", "side", "ngram", "distinct"])
    for side in ("items", "queries"):
        for ngram, count in dynamics[side]["distinct_by_ngram"].items():
            writer.writerow([spec.index, spec.name, side, ngram, count])
    return buffer.getvalue()
