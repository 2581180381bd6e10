"""Typed parameters, loaded from params.yaml (the only place defaults live).

The models below say what each knob accepts and what it does (``Field(description=...)``,
printed by ``coevo params explain``); they carry no default: a key missing from the params
files is an error naming it. Unknown keys, wrong types and out-of-range values fail before
any work, with a message that names the key (``cogr.grpo.batch_size``) and what was wrong.

Several params files may be given: each later file is deep-merged over the earlier ones
(mappings key by key, anything else replaces; an overlay may only use keys that exist),
then ``--set key=value`` overrides apply, then everything is validated, including the
``trl:`` pass-through mappings against TRL's config classes.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, NamedTuple, Protocol, Union

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    model_validator,
)
from pydantic.fields import FieldInfo

PROJECT_PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"
# Params files shipped with coevo (the repository's params.yaml and overlays), which a project's
# params file names in `extends:` (coevo init writes one that does).
PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
# defaults: params.yaml (every knob); cpu: params/cpu.yaml (2 CPU cores, the offline small models);
# demo: params/demo.yaml (`coevo demo`'s size: the committed sample in under 15 minutes).
PROFILES = ("defaults", "cpu", "demo")
TRL_DOCS = "https://huggingface.co/docs/trl"


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("expected a number, got a boolean")
    return value


# A float knob: ints such as ``1`` are fine, booleans are not (NaN/inf: see Section).
Float = Annotated[float, BeforeValidator(_not_bool)]

_NAME = re.compile(r"[A-Za-z0-9._-]+")


def _folder_name(value: Any) -> Any:
    """A name that becomes one folder (``data/processed/<name>``): letters, digits, ``._-``."""
    if isinstance(value, str) and (not _NAME.fullmatch(value) or set(value) == {"."}):
        raise ValueError(f"{value!r} is not a name: use letters, digits, '.', '_' and '-' only (it names a folder)")
    return value


def _inside_project(value: Any) -> Any:
    """A relative folder that stays inside the project (no absolute path, no '..' above it)."""
    if isinstance(value, str):
        import posixpath

        normal = posixpath.normpath(value.replace("\\", "/"))
        if value.startswith(("/", "\\", "~")) or re.match(r"^[A-Za-z]:", value) or normal == ".." or \
                normal.startswith("../"):
            raise ValueError(f"{value!r} leaves the project: give a folder relative to the project root without '..' "
                             "(a symlink inside the project can point elsewhere)")
    return value


# Path-like params: a folder name, and an output folder inside the project.
FolderName = Annotated[str, BeforeValidator(_folder_name)]
ProjectPath = Annotated[str, BeforeValidator(_inside_project)]


class Section(BaseModel):
    # No defaults anywhere: params.yaml holds them all. Booleans are not numbers, integers
    # are not booleans (StrictInt / StrictBool fields), floats reject NaN and inf.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


# --------------------------------------------------------------------------- metric names
# What each method's evaluation really produces (tests/test_config.py checks them against
# coevo.retrieval.evaluate and coevo.methods.cohyde).
COGR_CUTOFFS: tuple[int, ...] = (1, 3, 5, 10, 100, 1000)
COGR_METRICS: tuple[str, ...] = ("precision", "recall", "f1") + tuple(
    f"{m}@{k}" for m in ("mrr", "ndcg", "precision", "recall", "f1") for k in COGR_CUTOFFS
)
COHYDE_METRICS: tuple[str, ...] = ("ndcg@5", "recall@5")
CoGRMetric = Literal[COGR_METRICS]  # type: ignore[valid-type]
CoHyDEMetric = Literal[COHYDE_METRICS]  # type: ignore[valid-type]


# The tiny open_clip architecture of the tests (coevo.models.clip registers it): the one CLIP
# model allowed without pretrained weights.
TINY_CLIP_MODEL = "coevo-tiny-clip"


# ------------------------------------------------------------------------------ sections
class DataParams(Section):
    dataset: FolderName = Field(
        min_length=1, description="Name of the prepared data set (letters, digits, '._-'); its tables go to "
        "<data.root>/processed/<dataset>/."
    )
    loader: Literal["metatool", "stabletoolbench", "wands", "beir", "image_captions", "prepared"] = Field(
        description="Reader that turns `source` into the items / queries / qrels tables (prepared: a folder "
        "`coevo data prepare` wrote, its tables and splits kept)."
    )
    source: str = Field(
        min_length=1, description="Raw data set the loader reads: a local folder (the committed sample by default)."
    )
    val_fraction: Float = Field(
        ge=0.0, lt=1.0,
        description="Share of queries held out as val (early stopping, per-phase evaluation) when the source has no split.",
    )
    test_fraction: Float = Field(
        ge=0.0, lt=1.0, description="Share of queries held out as test (final evaluation) when the source has no split."
    )
    root: ProjectPath = Field(
        min_length=1, description="Folder under which processed/, indexes/ and models/ are written (inside the project)."
    )
    min_grade: StrictInt = Field(
        ge=1, description="Relevance threshold applied when the data set is prepared: judgements graded below it "
        "become grade 0 (judged, not relevant), the others keep their grade (NDCG gains). WANDS: 1 = Exact and "
        "Partial are relevant, 2 = Exact only. Binary sources (MetaTool, StableToolBench) need 1.",
    )
    split_scheme: Literal["fractions", "wands_430_50"] = Field(
        description="fractions: a seeded split by query (val_fraction, test_fraction) where the source has none; "
        "a source that fixes train but lacks val (or test) gets a seeded val (test) carved from its train queries. "
        "wands_430_50: the CoGR paper's WANDS split, 50 seeded test queries (with a relevant product) and 430 "
        "training queries, of which val_fraction are held out as val (the paper has no val split; monitoring "
        "needs one). Only with loader = wands.",
    )
    duplicates: Literal["drop", "error"] = Field(
        description="Duplicate rows in a source (a judgement, a query-tool pair or an API record given twice): "
        "drop keeps one (the highest grade) and reports the count and first examples (warning, dataset.json "
        "meta.duplicates); error refuses the source with the same report.",
    )
    vague: Literal["none", "test_copy", "train_copy", "all_queries"] = Field(
        description="Vague queries (coevo.data.vague: a query with its relevant items' own words taken out, a "
        "fixed rule without a model or seed). none: the source's queries. test_copy: adds a `vague` split, a "
        "vague copy of every test query; `evaluation.split: vague` reports the final table on it (the CoHyDE "
        "paper's vague-query comparison). train_copy: test_copy, plus a vague copy of every train and val query in "
        "its own split, so that training (a method's and S1a's) and the val choice see vague queries too. "
        "all_queries: every query (train, val, test) becomes vague: the shift "
        "setting in which a method trains and is measured on vague queries (GRAPE's shifted-query comparison). "
        "A query left with no content word has no vague version and is dropped (dataset.json meta.vague counts "
        "them).",
    )

    @model_validator(mode="after")
    def _fractions(self) -> "DataParams":
        if self.val_fraction + self.test_fraction >= 1.0:
            raise ValueError("val_fraction + test_fraction must be < 1 (some queries must train)")
        if self.split_scheme == "wands_430_50" and self.loader != "wands":
            raise ValueError(f"data.split_scheme = wands_430_50 is the WANDS paper split; data.loader is {self.loader!r}")
        return self


class TrackingParams(Section):
    uri: str = Field(
        min_length=1, description="MLflow tracking URI: a sqlite:/// database, a folder or an http:// server."
    )
    artifact_root: ProjectPath = Field(
        min_length=1, description="Folder where MLflow stores run artifacts (plots, reports, metrics.json), inside the "
        "project."
    )
    system_metrics_s: Float = Field(
        ge=0.0, description="Seconds between MLflow system-metrics samples of a run (CPU, memory, disk, network, GPU "
        "with pynvml: the run's System metrics tab), logged while it trains; 0 turns them off."
    )


class DvcParams(Section):
    record: StrictBool = Field(
        description="After a whole `coevo run` in a DVC project (`dvc init`): write the params it resolved to "
        "records/<method>.yaml and dvc.yaml from the records, record its outputs in dvc.lock and DVC's cache, and save "
        "it as a DVC experiment (`dvc exp show`, `dvc exp apply`). False: the run leaves no DVC record."
    )
    push: StrictBool = Field(
        description="Also `dvc push` the recorded outputs to the project's default DVC remote (`dvc remote add -d`). "
        "False by default: nothing is uploaded unless asked."
    )


class BootstrapParams(Section):
    resamples: StrictInt = Field(
        ge=1000, le=1_000_000,
        description="Paired-bootstrap resamples of the evaluated queries (drawn with replacement, each pair of "
        "systems' values together) behind every 95% CI of a difference a table claims; at least 1,000.",
    )
    permutations: StrictInt = Field(
        ge=1000, le=1_000_000,
        description="Sign-flip patterns of the paired randomisation test that gives each difference its two-sided "
        "p-value (all 2^n patterns when fewer).",
    )
    confidence: Float = Field(gt=0.5, lt=1.0, description="Confidence level of the intervals (0.95 = 95% CI).")
    seed: StrictInt = Field(
        ge=0, description="Seed of the resampling (bootstrap and randomisation draw independent streams from it): "
        "the same seed and the same per-query values give the same intervals and p-values."
    )


# Cut-offs every table reads: P@1 / R@1, NDCG@5 (CoHyDE's headline), NDCG@10 and R@10.
REQUIRED_CUTOFFS: tuple[int, ...] = (1, 5, 10)


class EvaluationParams(Section):
    split: Literal["val", "test", "vague"] = Field(
        description="The split the FINAL evaluation reports; training phases and early stopping always monitor "
        "the val split. vague: the vague copies of the test queries (needs `data.vague: test_copy` or `train_copy`)."
    )
    cutoffs: list[StrictInt] = Field(
        min_length=1,
        description="Cut-offs k of the ranked metrics (P, R, F1, NDCG, MRR @k) in the final evaluation, the BM25 "
        "and dense baselines (F1@k at the k among these that is best on val; the largest is their retrieval depth), "
        "the tables, MLflow and metrics.json. Increasing, must hold 1, 5 and 10. Training phases monitor val at "
        "the library's cut-offs (1, 3, 5, 10, 100, 1000), so changing this list re-runs evaluation only.",
    )
    bootstrap: BootstrapParams = Field(
        description="Confidence intervals and p-values of the differences each final table claims (a method's "
        "final vs its own start, and vs the best baseline), over the queries of the final split."
    )

    @model_validator(mode="after")
    def _cutoffs(self) -> "EvaluationParams":
        cut = self.cutoffs
        if any(k < 1 for k in cut) or cut != sorted(set(cut)):
            raise ValueError(f"cutoffs must be increasing positive integers without repeats, got {cut}")
        missing = [k for k in REQUIRED_CUTOFFS if k not in cut]
        if missing:
            raise ValueError(f"cutoffs must include {', '.join(map(str, missing))} (every table shows P@1, NDCG@5, "
                             f"NDCG@10 and R@10), got {cut}")
        return self


class LoraParams(Section):
    enabled: StrictBool = Field(
        description="Train LoRA adapters; false fine-tunes every weight (much more memory)."
    )
    r: StrictInt = Field(ge=1, le=256, description="LoRA rank: adapter size; larger fits more, trains slower (8-64).")
    alpha: StrictInt = Field(ge=1, description="LoRA scale numerator: updates are scaled by alpha / r (often 2 x r).")
    dropout: Float = Field(ge=0.0, lt=1.0, description="Dropout on the adapters' inputs while training, in [0, 1).")
    target_modules: list[str] = Field(
        min_length=1,
        description="Linear layers that get adapters, e.g. [q_proj, v_proj]; add k/o/gate/up/down_proj for capacity.",
    )
    top_layers: StrictInt | None = Field(
        ge=1,
        description="Adapters in the top N transformer layers only: backpropagation stops below them, so an SFT, "
        "GRPO or DPO step costs less (bench/sft_step.py); null = every layer.",
    )


class SamplingParams(Section):
    temperature: Float = Field(
        gt=0.0, le=5.0, description="Sampling temperature of GRPO rollouts; higher = more diverse completions."
    )
    top_p: Float = Field(
        gt=0.0, le=1.0, description="Nucleus sampling: sample from the most likely tokens up to this mass (1 = off)."
    )
    max_new_tokens: StrictInt = Field(
        ge=1, le=4096, description="Token budget of one generated text outside GRPO (seeds, indexing, evaluation)."
    )


# ---------------------------------------------------------------- TRL trainer sections
class TrainerSection(Section):
    """A section that configures one TRL trainer; its ``trl`` mapping passes any other field
    of the TRL config class through (checked by :func:`check_trl`)."""

    # The TRL config class (name in the ``trl`` package) this section builds.
    trl_config: ClassVar[str]
    # The one mapping from this section's knobs to TRL config fields (TRL field -> knob): the
    # trainers build their config from it (trl_settings) and the load-time check refuses these
    # fields in ``trl`` (trl_owned).
    trl_fields: ClassVar[dict[str, str]] = {}
    # Other TRL fields coevo sets itself -> the knob to use instead ({self}: this section's key,
    # {parent}: the method's key). Refused in ``trl`` too.
    trl_set_elsewhere: ClassVar[dict[str, str]] = {
        "output_dir": "nothing: coevo writes into the run folder",
        "seed": "seed (top level)",
        "data_seed": "seed (top level)",
    }

    @classmethod
    def trl_owned(cls) -> dict[str, str]:
        """Every TRL field coevo sets -> the knob that sets it (refused in ``trl``)."""
        return {**cls.trl_set_elsewhere, **{field: f"{{self}}.{knob}" for field, knob in cls.trl_fields.items()}}

    def trl_settings(self) -> dict[str, Any]:
        """The TRL config fields this section's knobs set (``trl_fields``)."""
        return {field: getattr(self, knob) for field, knob in self.trl_fields.items()}


class SFTParams(TrainerSection):
    trl_config: ClassVar[str] = "SFTConfig"
    trl_fields: ClassVar[dict[str, str]] = {
        "num_train_epochs": "epochs", "learning_rate": "learning_rate", "per_device_train_batch_size": "batch_size",
    }

    epochs: StrictInt = Field(ge=1, description="Passes over the SFT examples.")
    learning_rate: Float = Field(gt=0.0, description="Peak learning rate (linear decay to 0, no warm-up).")
    batch_size: StrictInt = Field(ge=1, description="Examples per optimizer step (per device).")
    trl: dict[str, Any] = Field(
        description=f"Any other trl.SFTConfig field, passed through as is (e.g. gradient_accumulation_steps); "
        f"see {TRL_DOCS}/sft_trainer#trl.SFTConfig."
    )

class DPOParams(TrainerSection):
    trl_config: ClassVar[str] = "DPOConfig"
    trl_fields: ClassVar[dict[str, str]] = SFTParams.trl_fields
    trl_set_elsewhere: ClassVar[dict[str, str]] = {**TrainerSection.trl_set_elsewhere, "beta": "{parent}.dpo_beta"}

    epochs: StrictInt = Field(ge=1, description="Passes over the round's preference pairs.")
    learning_rate: Float = Field(gt=0.0, description="Peak learning rate of the DPO optimizer.")
    batch_size: StrictInt = Field(ge=1, description="Preference pairs per optimizer step (capped at the pair count).")
    trl: dict[str, Any] = Field(
        description=f"Any other trl.DPOConfig field, passed through as is (e.g. loss_type, label_smoothing); "
        f"see {TRL_DOCS}/dpo_trainer#trl.DPOConfig."
    )


class GRPOParams(TrainerSection):
    trl_config: ClassVar[str] = "GRPOConfig"
    trl_fields: ClassVar[dict[str, str]] = {
        "per_device_train_batch_size": "batch_size", "num_generations": "num_generations",
        "max_completion_length": "max_completion_length", "learning_rate": "learning_rate", "beta": "beta",
    }
    trl_set_elsewhere: ClassVar[dict[str, str]] = {
        **TrainerSection.trl_set_elsewhere,
        "temperature": "{parent}.sampling.temperature",
        "top_p": "{parent}.sampling.top_p",
        "use_vllm": "the --vllm flag of `coevo train`",
    }

    num_generations: StrictInt = Field(
        ge=2, description="Completions sampled per prompt (the GRPO group); batch_size must be a multiple of it."
    )
    batch_size: StrictInt = Field(
        ge=2, description="Completions per forward/backward pass (per device). An optimizer step takes batch_size x "
        "trl.gradient_accumulation_steps completions, sampled together (TRL's generation batch: whole groups, so that "
        "product must be a multiple of num_generations); without accumulation, prompts per step = batch_size / "
        "num_generations."
    )
    learning_rate: Float = Field(gt=0.0, description="Peak learning rate of the GRPO optimizer.")
    beta: Float = Field(
        ge=0.0, description="KL penalty towards the starting policy; 0 keeps no reference model (faster, less memory)."
    )
    max_completion_length: StrictInt = Field(
        ge=1, le=4096, description="Most tokens sampled per GRPO completion; longer ones are cut."
    )
    trl: dict[str, Any] = Field(
        description=f"Any other trl.GRPOConfig field, passed through as is (e.g. loss_type, epsilon, scale_rewards, "
        f"gradient_accumulation_steps); see {TRL_DOCS}/grpo_trainer#trl.GRPOConfig."
    )

    def accumulated_passes(self) -> int | None:
        """Forward/backward passes per generation batch: TRL's steps_per_generation (default:
        gradient_accumulation_steps; 1 without either). None for a value GRPOConfig will refuse itself."""
        steps = self.trl.get("steps_per_generation") or self.trl.get("gradient_accumulation_steps") or 1
        return steps if isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1 else None

    @model_validator(mode="after")
    def _divisible(self) -> "GRPOParams":
        # TRL samples whole groups of completions per generation batch: batch_size x accumulated passes,
        # trained batch_size at a time (less memory, same step).
        steps = self.accumulated_passes()
        if steps is None:
            return self  # GRPOConfig's own check names the bad field
        if (self.batch_size * steps) % self.num_generations:
            accumulated = f" x {steps} accumulated passes ({self.batch_size * steps})" if steps > 1 else ""
            raise ValueError(
                f"batch_size ({self.batch_size}){accumulated} must be a multiple of num_generations ({self.num_generations})"
            )
        return self

class CoGRGRPOParams(GRPOParams):
    trl_set_elsewhere: ClassVar[dict[str, str]] = {
        **GRPOParams.trl_set_elsewhere, "num_train_epochs": "{self}.query_epochs / {self}.item_epochs",
    }

    query_epochs: StrictInt = Field(
        ge=1, description="Passes over the prompts in each query-side GRPO phase (the paper: 10)."
    )
    item_epochs: StrictInt = Field(
        ge=1, description="Passes over the prompts in each item-side GRPO phase (the paper: 5)."
    )
    max_completion_length: StrictInt = Field(
        ge=1, le=4096,
        description="Most tokens sampled per GRPO completion. A completion cut at this limit gets reward -1 and is "
        "never parsed; the K_max penalty can only fire when the limit holds k_max + 1 keywords (about 2.6 tokens "
        "per keyword with its comma for SmolLM2 / Qwen: 31 keywords ~ 80-100 tokens; each phase records its "
        "estimate as train.kmax_budget_tokens and warns when the limit is short).",
    )
    max_prompts_per_phase: StrictInt | None = Field(
        ge=1, description="Seeded cap on prompts per GRPO phase; null = all training queries (or items)."
    )
    screen_factor: StrictInt = Field(
        ge=1, description="Prompt screening (DAPO's dynamic sampling, done once per phase): draw "
        "max_prompts_per_phase x screen_factor candidates, let the phase's starting policy sample num_generations "
        "completions for each, and train on the candidates whose rewards differ (a group of equal rewards has zero "
        "advantage and teaches nothing), filled up with the others; costs one sampling pass over the candidates. "
        "The phase records what it saw (train.screened_*). 1 = a plain seeded draw.",
    )

    @model_validator(mode="after")
    def _screening_has_a_cap(self) -> "CoGRGRPOParams":
        if self.screen_factor > 1 and self.max_prompts_per_phase is None:
            raise ValueError("screen_factor > 1 screens max_prompts_per_phase x screen_factor candidates: set "
                             "max_prompts_per_phase (null trains on every prompt, so there is nothing to choose)")
        return self

    @model_validator(mode="after")
    def _one_step_fits(self) -> "CoGRGRPOParams":
        # A phase with fewer completions than one optimizer step samples would train no step at all
        # (TRL stops with "max_steps must be set to a positive value").
        steps = self.accumulated_passes()
        if self.max_prompts_per_phase is None or steps is None:
            return self
        completions = self.max_prompts_per_phase * self.num_generations
        if completions < self.batch_size * steps:
            raise ValueError(
                f"max_prompts_per_phase ({self.max_prompts_per_phase}) x num_generations ({self.num_generations}) = "
                f"{completions} completions, fewer than one optimizer step samples (batch_size {self.batch_size} x "
                f"{steps} accumulated passes = {self.batch_size * steps}): raise max_prompts_per_phase or lower "
                f"batch_size / trl.gradient_accumulation_steps"
            )
        return self


class GrapeGRPOParams(GRPOParams):
    trl_set_elsewhere: ClassVar[dict[str, str]] = {**GRPOParams.trl_set_elsewhere, "max_steps": "{self}.steps"}

    steps: StrictInt = Field(ge=1, description="GRPO optimizer steps in all.")


class EarlyStoppingSection(Protocol):
    """What the base method reads from a method's early-stopping section (CoGR's, CoHyDE's, a new one's)."""

    metric: str
    patience: int
    min_delta: float


class CoGREarlyStopping(Section):
    metric: CoGRMetric = Field(
        description="Val metric checked after every phase: set precision / recall / f1, or mrr, ndcg, precision, "
        "recall, f1 @ 1, 3, 5, 10, 100, 1000 (ranked by BM25 over keywords)."
    )
    patience: StrictInt = Field(ge=1, description="Stop after this many phases without an improvement.")
    min_delta: Float = Field(ge=0.0, description="Smallest rise of the metric that counts as an improvement.")


class CoHyDEEarlyStopping(Section):
    metric: CoHyDEMetric = Field(description="Val metric checked after every round (CoHyDE evaluates at 5).")
    patience: StrictInt = Field(ge=1, description="Stop after this many rounds without an improvement.")
    min_delta: Float = Field(ge=0.0, description="Smallest rise of the metric that counts as an improvement.")


class SearchResultsParams(Section):
    k: StrictInt = Field(ge=1, le=50, description="Snippets per query: the first-stage retriever's top k items.")
    max_chars: StrictInt = Field(
        ge=10, le=2000, description="Characters of an item's description kept in its snippet (cut at a word)."
    )


class CoGRParams(Section):
    generator: str = Field(
        min_length=1,
        description="LLM both sides start from: tiny (tests), smollm2-135m (offline), a hub id or a local path.",
    )
    seed_generator: str | None = Field(
        min_length=1, description="G_0, the model that writes the Algorithm 1 seeds; null = the generator; "
        "yake = extractive key phrases of each item's title and description (not the paper's LLM G_0; every "
        "item gets M seeds)."
    )
    shared_generator: StrictBool = Field(description="Ablation: one model serves both the query and the item side.")
    sft_init: StrictBool = Field(description="Start with Algorithm 1 (seeded SFT); false = ablation without it.")
    query_side_only: StrictBool = Field(
        description="Ablation: GRPO trains the query side only; the item side stays as after SFT."
    )
    max_empty_share: Float = Field(
        ge=0.0, le=1.0,
        description="A phase fails (and is not saved) when its generator writes no keyword for more than this share "
        "of the items or of the queries it indexes (e.g. after a diverged update); 1.0 turns the check off.",
    )
    item_reward: Literal["marginal", "global"] = Field(
        description="Item-side reward: marginal (counterfactual marginal F1, the paper's) or global (ablation: "
        "change of the macro F1)."
    )
    n_query_keywords: StrictInt = Field(
        ge=1, description="N in Algorithm 1: keywords kept per query as its SFT target (most frequent seeds)."
    )
    m_item_keywords: StrictInt = Field(ge=1, description="M in Algorithm 1: keywords sampled per item from G_0.")
    k_max: StrictInt = Field(
        ge=1, description="Keyword budget: larger (or unparseable) keyword sets get reward -1 and are cut when indexed."
    )
    rounds: StrictInt = Field(ge=0, description="GRPO rounds (a query-side then an item-side phase); 0 = SFT only.")
    max_train_queries: StrictInt | None = Field(
        ge=1, description="Seeded cap on training queries (SFT, query index, GRPO); null = all."
    )
    seed_temperature: Float = Field(
        gt=0.0, le=5.0, description="G_0 sampling temperature for the Algorithm 1 seeds; lower = cleaner SFT targets."
    )
    item_context: Literal["description", "title_only"] = Field(
        description="What the item side sees of an item (seeds, SFT, GRPO rollouts, index builds alike): its title "
        "and description, or title_only (the paper's Table 4 row \"- Description\")."
    )
    query_context: Literal["none", "search_results"] = Field(
        description="What the query side sees besides the query: none, or search_results (the paper's Table 4 row "
        "\"+ Search Results\", its best variant): the top-k snippets (title: cut description) of Lucene BM25 over "
        "the items' title + text, from the corpus only (never the qrels); the same snippets in SFT, GRPO, "
        "evaluation and `coevo search`."
    )
    search_results: SearchResultsParams = Field(
        description="The snippets of query_context = search_results (unused with none)."
    )
    system_prompt: Literal["full", "short"] = Field(
        description="The generators' system prompt: full (the answer's form spelled out, 36 SmolLM2 tokens) or "
        "short (one line, 10 tokens): every SFT and GRPO step pays for its tokens (bench/sft_step.py)."
    )
    lora: LoraParams = Field(description="LoRA adapters of both generators.")
    sampling: SamplingParams = Field(description="Text generation: GRPO rollouts, seeds and indexing.")
    sft: SFTParams = Field(description="SFT of both generators on the Algorithm 1 targets (phase 0).")
    grpo: CoGRGRPOParams = Field(description="GRPO of each side in the rounds.")
    early_stopping: CoGREarlyStopping = Field(description="Stop the rounds when the val metric stops improving.")


class GrapeParams(Section):
    generator: str = Field(
        min_length=1, description="The LLM query rewriter: tiny, smollm2-135m, a hub id or a local path."
    )
    retriever: Literal["text", "clip"] = Field(
        description="Frozen retriever: text (sentence-transformers encoder) or clip (open_clip, image items)."
    )
    text_encoder: str = Field(
        min_length=1, description="Encoder of the text retriever (id or path); all-minilm-l6-v2 works offline."
    )
    clip_model: str = Field(min_length=1, description="open_clip architecture when retriever = clip.")
    clip_pretrained: str | None = Field(
        min_length=1,
        description="open_clip weights: a public tag (e.g. openai, laion2b_s34b_b79k; downloaded by open_clip) or "
        f"a local checkpoint file. Required with retriever = clip: null is an error, except for clip_model = "
        f"{TINY_CLIP_MODEL} (the tiny test model, random weights by design) and hf-hub: / local-dir: models "
        "(their weights come with them).",
    )
    reward: Literal["rank", "reciprocal_rank", "similarity"] = Field(
        description="rank: 1 - 2 (rank - 1) / (N - 1) of the relevant item (the paper's); reciprocal_rank: 1 / rank "
        "(ablation: separates top-1 from top-10, which the linear reward barely does on a small corpus); "
        "similarity: the raw cosine similarity (ablation, inflatable)."
    )
    query_mode: Literal["replace", "expand", "mix"] = Field(
        description="What the frozen retriever searches: replace = the rewrite alone (the paper's); expand = the "
        "query followed by the rewrite (query2doc-style: the rewriter adds words, the user's are kept); mix = the "
        "query's unit embedding plus mix_weight times the rewrite's (the query stays the larger part). Training "
        "rewards, evaluation and `coevo search` all use it."
    )
    mix_weight: Float = Field(
        gt=0, le=1, description="query_mode mix: the rewrite embedding's weight beside the query's (1); ignored "
        "in the other modes."
    )
    reasoning: StrictBool = Field(description="Let the rewriter write a short reasoning section before the rewrite.")
    max_reasoning_tokens: StrictInt = Field(
        ge=1, description="Extra completion tokens for the reasoning section (reasoning = true)."
    )
    lora: LoraParams = Field(description="LoRA adapters of the rewriter.")
    sampling: SamplingParams = Field(description="Text generation: GRPO rollouts and evaluation.")
    sft_warmup: StrictBool = Field(
        description="Warm-start the rewriter by SFT before GRPO (not in the paper, which starts GRPO from the base "
        "model): each training query's target is its relevant item as the frozen text retriever indexes it "
        "(`title: text`), cut to the completion budget. The final phase is then the better of the warm start and "
        "GRPO on val. false = the paper's GRPO from the base model."
    )
    sft: SFTParams = Field(description="The SFT warm start (grape.sft_warmup = true).")
    sft_max_examples: StrictInt | None = Field(
        ge=1, description="Seeded cap on the warm start's training queries; null = every training query."
    )
    grpo: GrapeGRPOParams = Field(description="GRPO of the rewriter against the frozen retriever.")
    eval_every: StrictInt = Field(ge=1, description="Evaluate on the val split every this many GRPO steps.")

    @model_validator(mode="after")
    def _sft_targets(self) -> "GrapeParams":
        # the warm start's targets are item texts: an image corpus has none, and they carry no reasoning section
        if self.sft_warmup and (self.retriever != "text" or self.reasoning):
            raise ValueError(f"grape.sft_warmup needs grape.retriever = text and grape.reasoning = false (its targets "
                             f"are item texts); retriever is {self.retriever!r}, reasoning {self.reasoning}")
        return self

    @model_validator(mode="after")
    def _clip_weights(self) -> "GrapeParams":
        # A CLIP retriever with random weights ranks images at random: every reward is noise.
        if (self.retriever == "clip" and self.clip_pretrained is None and self.clip_model != TINY_CLIP_MODEL
                and not self.clip_model.startswith(("hf-hub:", "local-dir:"))):  # those carry their weights
            raise ValueError(
                f"grape.clip_pretrained is null but grape.retriever is clip ({self.clip_model}): set "
                f"grape.clip_pretrained to a public tag (e.g. openai) or a local checkpoint file; only "
                f"clip_model = {TINY_CLIP_MODEL} (the tiny test model) runs without weights"
            )
        return self


class EncoderTrainingParams(Section):
    epochs: StrictInt = Field(ge=1, description="Passes over the (text, tool) pairs per encoder training.")
    batch_size: StrictInt = Field(
        ge=2, description="Pairs per step; the other positives of a batch are its negatives (at least 2)."
    )
    learning_rate: Float = Field(gt=0.0, description="Learning rate of the encoder's optimizer.")


class CoHyDEParams(Section):
    generator: str = Field(
        min_length=1, description="The HyDE rewriter LLM: tiny, smollm2-135m, a hub id or a local path."
    )
    encoder: str = Field(min_length=1, description="Dense encoder co-trained with the rewriter (id or path).")
    rounds: StrictInt = Field(ge=0, description="Co-training rounds (S2 to S4); 0 = warm-up (S1a, S1b) only.")
    num_samples: StrictInt = Field(ge=2, description="Descriptions sampled per training query in S4 (DPO candidates).")
    sample_temperature: Float = Field(gt=0.0, le=5.0, description="Sampling temperature of the S4 descriptions.")
    dpo_beta: Float = Field(gt=0.0, description="DPO beta: higher keeps the rewriter closer to its reference.")
    lora: LoraParams = Field(description="LoRA adapters of the rewriter.")
    encoder_training: EncoderTrainingParams = Field(description="Encoder training in S1a and S3.")
    warmup: SFTParams = Field(description="S1b: SFT of the rewriter on rendered tool texts.")
    dpo: DPOParams = Field(description="S4: DPO of the rewriter on best vs worst descriptions.")
    max_new_tokens: StrictInt = Field(ge=1, le=4096, description="Token budget of one generated description.")
    early_stopping: CoHyDEEarlyStopping = Field(description="Stop the rounds when the val metric stops improving.")
    index_format: Literal["title", "title_api", "title_api_tool", "title_api_desc", "full"] = Field(
        description="How corpus tools are rendered in the dense index (one of the five renderings)."
    )
    warmup_formats_per_item: StrictInt = Field(
        ge=1, le=5, description="S1b: distinct renderings per tool in the warm-up texts (5 = all)."
    )
    warmup_max_examples: StrictInt | None = Field(
        ge=1, description="S1b: seeded cap on warm-up rows (texts or query pairs); null = all (set it for CPU runs)."
    )
    warmup_data: Literal["tools", "query_pairs"] = Field(
        description="S1b's rows: tools (the paper: next-token training on the rendered tool corpus) or "
        "query_pairs (supervised: a training query's rewriter prompt -> its most relevant tool rendered as the "
        "index embeds it, cut to max_new_tokens, so the rewriter writes what the encoder searches)."
    )
    max_train_queries: StrictInt | None = Field(
        ge=2, description="Seeded cap on training queries for S1a to S4; null = all."
    )
    s1b_warmup: StrictBool = Field(
        description="S1b: warm the rewriter up on the rendered tool corpus before the rounds; false = the paper's "
        "'without S1b' ablation (the rounds start from the untrained rewriter)."
    )
    s3_init: Literal["s1a", "previous_round"] = Field(
        description="Where S3 starts the encoder of each round: s1a (the default) retrains it from the S1a encoder "
        "on the current rewriter's descriptions; previous_round continues the previous round's encoder (chained). "
        "s1a is what the paper most likely means: it says S3 'retrains' the encoder 'only on (description, tool) "
        "pairs', so each round's encoder fits the current rewriter, not the descriptions of earlier ones."
    )
    encode: Literal["description", "query_and_description"] = Field(
        description="What the encoder embeds for a query, in S3 training, S4 scoring, every evaluation and serving: "
        "description (the CoHyDE paper: the generated description only) or query_and_description (the query, a "
        "new line, then the description: HyDE's own rule, which adds the query's vector to the hypothetical "
        "documents', so a weak rewriter cannot lose the user's words)."
    )
    eval_pairing: Literal["co_trained", "trained_rewriter_s1a_encoder", "vanilla_rewriter_co_trained_encoder"] = (
        Field(
            description="Which rewriter and encoder every round is evaluated with (val monitoring, round selection "
            "and the final row): co_trained (the method: the round's rewriter and encoder); the paper's ablations "
            "trained_rewriter_s1a_encoder (the round's rewriter, the vanilla S1a encoder) and "
            "vanilla_rewriter_co_trained_encoder (the untrained rewriter of vanilla HyDE, the round's encoder). "
            "Training is the same for all three; a change re-runs the rounds, whose evaluation it is part of."
        )
    )


class RayParams(Section):
    address: str = Field(
        description="Ray cluster for compute.backend = ray: 'auto' (a node of a running cluster), "
        "'ray://<head>:10001' (Ray Client) or '<head>:6379'; empty = $RAY_ADDRESS when set, else start a local "
        "Ray instance for this process (compute.workers x compute.cpus_per_worker CPUs)."
    )


class ComputeParams(Section):
    """Where corpus-wide passes run; never part of a phase key (both backends give the same outputs)."""

    backend: Literal["local", "ray"] = Field(
        description="local: corpus-wide generation and embedding run in this process (the default: no start-up "
        "cost). ray: they run as Ray Data map_batches over shards, the model loaded once per worker actor, and "
        "the independent evaluation steps (the BM25 and dense baselines) run as Prefect tasks on Ray (prefect-ray)."
    )
    ray: RayParams = Field(description="The Ray cluster to use with backend = ray.")
    workers: StrictInt = Field(
        ge=1, description="Worker actors per corpus-wide pass (Ray Data concurrency); each loads the model once."
    )
    batch_size: StrictInt = Field(
        ge=1, description="Texts per Ray Data batch handed to one worker call (rounded up to whole model batches, "
        "so batching and outputs match the local backend); larger amortises scheduling, smaller balances load."
    )
    cpus_per_worker: Float = Field(
        gt=0.0, le=1024.0, description="CPUs reserved per worker actor (also its torch threads when COEVO_THREADS "
        "is unset and the model is large)."
    )
    gpus_per_worker: Float = Field(
        ge=0.0, le=16.0, description="GPUs per worker actor; > 0 with vLLM installed sends generation through "
        "ray.data.llm (vLLM engine, current LoRA adapter); 0 = CPU workers."
    )


class RuntimeParams(Section):
    """How this machine computes; never part of a phase key, but recorded in every phase stamp and MLflow run,
    and a run folder is resumed only under the numerics it was trained with (``coevo.runtime.numerics``)."""

    precision: Literal["auto", "fp32", "bf16"] = Field(
        description="Numerics of every trainer (SFT, DPO, GRPO): auto resolves per device (bf16 mixed precision on "
        "CUDA and on CPUs whose native bf16 units make it faster, e.g. AVX512-BF16/AMX; fp32 elsewhere, where bf16 "
        "is emulated and several times slower); fp32 or bf16 force one. A run folder trained under other resolved "
        "numerics is not resumed."
    )


class Params(Section):
    # The sections of methods registered beyond the three below (coevo.methods.register) are
    # validated by their spec's model (``_registered_sections``); any other unknown key is refused.
    model_config = ConfigDict(extra="allow", validate_assignment=True, allow_inf_nan=False)

    seed: StrictInt = Field(ge=0, description="Seed of every random choice (splits, sampling, training).")
    data: DataParams = Field(description="The data set: where it comes from and how it is split.")
    tracking: TrackingParams = Field(description="MLflow tracking.")
    dvc: DvcParams = Field(description="The DVC record every run leaves: params, stages, outputs, an experiment.")
    evaluation: EvaluationParams = Field(description="The final evaluation of every method.")
    compute: ComputeParams = Field(
        description="Where corpus-wide generation and embedding run: in process (local) or on a Ray cluster."
    )
    runtime: RuntimeParams = Field(description="How this machine computes: the trainers' numerics (precision).")
    cogr: CoGRParams = Field(description="CoGR: query and item keyword generators co-trained by GRPO.")
    grape: GrapeParams = Field(description="GRAPE: a query rewriter trained by GRPO against a frozen retriever.")
    cohyde: CoHyDEParams = Field(description="CoHyDE: a HyDE rewriter and a dense encoder co-trained in rounds.")

    @model_validator(mode="wrap")
    @classmethod
    def _registered_sections(cls, data: Any, handler: Any) -> "Params":
        if not isinstance(data, Mapping) or isinstance(data, Params):
            return handler(data)
        registered = method_sections()
        core = {k: v for k, v in data.items() if k not in registered}
        errors: list[Any] = [{"type": "extra_forbidden", "loc": (k,), "input": v}
                             for k, v in core.items() if k not in cls.model_fields]
        sections: dict[str, Any] = {}
        for name, info in registered.items():
            if name not in data:  # a method not being run needs no section (load_params(method=) checks)
                continue
            try:
                sections[name] = info.annotation.model_validate(data[name])
            except ValidationError as exc:
                errors.extend({**_init_error(e), "loc": (name, *e["loc"])} for e in exc.errors())
        try:
            model = handler({k: v for k, v in core.items() if k in cls.model_fields} | sections)
        except ValidationError as exc:
            errors = [_init_error(e) for e in exc.errors()] + errors
            model = None
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        return model

    @model_validator(mode="after")
    def _vague_split(self) -> "Params":
        if self.evaluation.split == "vague" and self.data.vague not in ("test_copy", "train_copy"):
            raise ValueError(f"evaluation.split = vague needs data.vague = test_copy or train_copy (the vague copies "
                             f"of the test queries); data.vague is {self.data.vague!r}")
        return self

    def flat(self) -> dict[str, Any]:
        """Flattened ``a.b.c -> value`` view (MLflow params, DVC sweeps)."""
        return flatten(self.model_dump())


class ParamsError(ValueError):
    """A params file (or an override) is invalid; the message names each bad key."""


def method_sections() -> dict[str, FieldInfo]:
    """The params sections of registered methods (``coevo.methods.SPECS``) that :class:`Params`
    does not declare itself, as fields: their spec's model and run help."""
    from coevo.methods import SPECS

    return {spec.name: FieldInfo(annotation=spec.params_model(), description=spec.run_help)
            for spec in SPECS.values() if spec.name not in Params.model_fields}


def _init_error(error: Mapping[str, Any]) -> dict[str, Any]:
    """A reported validation error as the details ``ValidationError.from_exception_data`` takes."""
    return {k: error[k] for k in ("type", "loc", "input", "ctx") if k in error}


# -------------------------------------------------------------------------- model tree
def fields_of(model: type[Section]) -> dict[str, FieldInfo]:
    """A section's fields; for :class:`Params`, the registered methods' sections too."""
    return {**model.model_fields, **method_sections()} if model is Params else dict(model.model_fields)


def section_type(annotation: Any) -> type[Section] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, Section) else None


def _is_open_mapping(annotation: Any) -> bool:
    return typing.get_origin(annotation) is dict or annotation is dict


def walk(model: type[Section] = Params, prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    """Every field of the model tree as ``(dotted key, FieldInfo)``, sections before their fields."""
    for name, info in fields_of(model).items():
        key = f"{prefix}{name}"
        yield key, info
        sub = section_type(info.annotation)
        if sub is not None:
            yield from walk(sub, key + ".")


def field_at(key: str, model: type[Section] = Params) -> FieldInfo | None:
    """The field at a dotted key, or None when no such key exists."""
    info: FieldInfo | None = None
    current: type[Section] | None = model
    for part in key.split("."):
        fields = fields_of(current) if current is not None else {}
        if part not in fields:
            return None
        info = fields[part]
        current = section_type(info.annotation)
    return info


def _open_mapping_at(parts: Sequence[str]) -> bool:
    """Whether ``parts`` names a free-form mapping (a ``trl`` pass-through) or lies inside one."""
    current: type[Section] | None = Params
    for part in parts:
        fields = fields_of(current) if current is not None else {}
        if part not in fields:
            return False
        annotation = fields[part].annotation
        if _is_open_mapping(annotation):
            return True
        current = section_type(annotation)
    return False


def close_matches(key: str, candidates: Sequence[str], n: int = 3) -> str:
    """`` (did you mean: a, b?)`` or the empty string."""
    found = difflib.get_close_matches(key, list(candidates), n=n, cutoff=0.6)
    return f" (did you mean: {', '.join(found)}?)" if found else ""


# ------------------------------------------------------------------------------ YAML
class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (YAML would keep the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:  # an unhashable key: SafeConstructor reports it
                continue
            if first is not key_node:
                raise yaml.constructor.ConstructorError(
                    None, None,
                    f"duplicate key {key!r} (first at line {first.start_mark.line + 1}, "
                    f"again at line {key_node.start_mark.line + 1})",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line: what is wrong and where."""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return f"{problem}{where}".replace("\n", " ")


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ParamsError(f"{path}: params file does not exist") from None
    except IsADirectoryError:
        raise ParamsError(f"{path}: is a directory; expected a params YAML file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ParamsError(f"{path}: cannot read params file: {exc}") from None
    try:
        tree = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ParamsError(f"{path}: not valid YAML: {_yaml_problem(exc)}") from None
    if not isinstance(tree, dict):
        raise ParamsError(f"{path}: expected a mapping of sections at the top level")
    return tree


def _parse_value(raw: str, key: str) -> Any:
    try:
        return yaml.load(raw, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ParamsError(f"override {key!r}: value {raw!r} is not valid YAML: {_yaml_problem(exc)}") from None


# ------------------------------------------------------------------ merging, overrides
def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def apply_override(tree: dict[str, Any], assignment: str) -> None:
    """Apply ``a.b.c=value`` (value parsed as YAML) to a nested dict, in place.

    The key must exist, except inside a ``trl`` pass-through mapping, where any name may be
    added (it is checked against TRL's config class when the params are validated).
    """
    if "=" not in assignment:
        raise ParamsError(f"override {assignment!r}: expected key=value, e.g. cogr.rounds=3")
    key, raw = assignment.split("=", 1)
    key = key.strip()
    parts = key.split(".")
    if not all(parts):
        raise ParamsError(f"override {assignment!r}: expected key=value, e.g. cogr.rounds=3")
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if not isinstance(child, dict):
            raise ParamsError(f"override {key!r}: unknown key {'.'.join(parts[: i + 1])!r}{_suggest(parts[: i + 1])}")
        node = child
    if parts[-1] not in node and not _open_mapping_at(parts[:-1]):
        raise ParamsError(f"override {key!r}: unknown key {key!r}{_suggest(parts)}")
    node[parts[-1]] = _parse_value(raw, key)


def _suggest(parts: Sequence[str]) -> str:
    return close_matches(".".join(parts), [k for k, _ in walk()])


def _unknown_keys(tree: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> list[str]:
    """Dotted keys of ``tree`` that the model tree does not have (``trl`` mappings take any key)."""
    unknown: list[str] = []
    for key, value in tree.items():
        path = (*prefix, str(key))
        if _open_mapping_at(prefix):
            continue
        if field_at(".".join(path)) is None:
            unknown.append(".".join(path))
        elif isinstance(value, Mapping):
            unknown.extend(_unknown_keys(value, path))
    return unknown


def _extends(layer: dict[str, Any], source: Path) -> list[Path]:
    """The profiles a params file builds on, in order (its top-level ``extends:``, taken out of it): a
    project's params.yaml then holds only what it changes, and a coevo upgrade brings its new knobs'
    defaults. A file without ``extends:`` stands alone and must hold every key."""
    names = layer.pop("extends", None)
    if names is None:
        return []
    names = [names] if isinstance(names, str) else names
    known = ", ".join(PROFILES)
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ParamsError(f"{source}: extends: expected a profile name or a list of them ({known})")
    unknown = [n for n in names if n not in PROFILES]
    if unknown:
        raise ParamsError(f"{source}: extends: unknown profile {unknown[0]!r} (coevo ships: {known})")
    if names[0] != "defaults":
        raise ParamsError(f"{source}: extends: start with 'defaults' (the others are overlays on it), e.g. "
                          f"extends: [defaults, {names[0]}]")
    return [PROFILES_DIR / f"{name}.yaml" for name in names]


def _check_keys(tree: Mapping[str, Any], source: Path) -> None:
    unknown = _unknown_keys(tree)
    if unknown:
        lines = [f"  {k}: unknown key{_suggest(k.split('.'))}" for k in unknown]
        raise ParamsError("\n".join([f"{source}: invalid parameters", *lines]))


def _merge(base: dict[str, Any], overlay: Mapping[str, Any]) -> None:
    """Deep-merge ``overlay`` into ``base`` in place: mappings key by key, anything else replaces."""
    for key, value in overlay.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


# ---------------------------------------------------------------------- TRL checks
def _trl_sections(params: Params) -> Iterator[tuple[str, str, TrainerSection]]:
    """(key, parent key, section) of every TRL trainer section in ``params``."""

    def visit(model: BaseModel, prefix: str, parent: str) -> Iterator[tuple[str, str, TrainerSection]]:
        for name in [*type(model).model_fields, *(model.model_extra or {})]:
            value = getattr(model, name)
            key = f"{prefix}{name}"
            if isinstance(value, TrainerSection):
                yield key, parent, value
            elif isinstance(value, BaseModel):
                yield from visit(value, key + ".", key)

    yield from visit(params, "", "")


def trl_field_types(cls: type) -> dict[str, Any]:
    import dataclasses

    hints = typing.get_type_hints(cls)
    return {f.name: hints.get(f.name, f.type) for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")}


# Fields whose check depends on the machine (a CPU host validates params for a GPU worker):
# type-checked only, not handed to the config class at load time.
_DEVICE_FIELDS = frozenset({"bf16", "fp16", "tf32", "bf16_full_eval", "fp16_full_eval", "use_cpu"})
_FLOAT_TEXT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def _check_trl_value(annotation: Any, value: Any) -> tuple[Any, str | None]:
    """(value to use, error or None): strict types; ``1e-3`` (a YAML string) counts as a float."""
    from pydantic import TypeAdapter

    adapter = TypeAdapter(annotation)
    try:
        adapter.validate_python(value, strict=True)
        return value, None
    except ValidationError as exc:
        if isinstance(value, str) and _FLOAT_TEXT.match(value):
            try:
                adapter.validate_python(float(value), strict=True)
                return float(value), None
            except ValidationError:
                pass
        return value, exc.errors()[0]["msg"]
    except Exception:  # noqa: BLE001 - an annotation pydantic cannot check: TRL's own check decides
        return value, None


def check_trl(params: Params) -> list[str]:
    """Check every ``trl`` mapping against its TRL config class; return error lines (key: problem).

    trl is imported only when some mapping is non-empty. Values that parse as YAML strings
    but are meant as floats (``1e-3``) are converted in place.
    """
    errors: list[str] = []
    sections = [(k, p, s) for k, p, s in _trl_sections(params) if s.trl]
    if not sections:
        return errors
    import trl

    for key, parent, section in sections:
        cls = getattr(trl, section.trl_config)
        fields = trl_field_types(cls)
        checked: dict[str, Any] = {}
        bad = False
        for name, value in section.trl.items():
            where = f"{key}.trl.{name}"
            owned = section.trl_owned().get(str(name))
            if owned is not None:
                knob = owned.format(self=key, parent=parent)
                errors.append(f"{where}: coevo sets {section.trl_config}.{name} itself; use {knob}")
                bad = True
                continue
            if name not in fields:
                errors.append(f"{where}: not a field of trl.{section.trl_config}{close_matches(str(name), list(fields))}; "
                              f"see {TRL_DOCS}")
                bad = True
                continue
            value, problem = _check_trl_value(fields[name], value)
            if problem:
                errors.append(f"{where}: {problem} (got {value!r}; trl.{section.trl_config}.{name} is "
                              f"{type_name(fields[name])})")
                bad = True
                continue
            checked[name] = value
        if bad:
            continue
        section.trl.update(checked)
        if section.trl_config == "SFTConfig" and (problem := _padding_free_problem(key, checked)):
            errors.append(problem)
            continue
        problem = _construct(cls, section, {k: v for k, v in checked.items() if k not in _DEVICE_FIELDS})
        if problem is not None:
            # Name the culprit when one key alone reproduces the failure.
            culprits = [k for k in checked if k not in _DEVICE_FIELDS and _construct(cls, section, {k: checked[k]})]
            where = f"{key}.trl.{culprits[0]}" if len(culprits) == 1 else f"{key}.trl"
            errors.append(f"{where}: trl.{section.trl_config} refuses it: {problem}")
    return errors


def _padding_free_problem(key: str, trl_fields: dict[str, Any]) -> str | None:
    """SFTTrainer refuses padding-free batches that still carry a max_length (coevo passes one)
    unless packing cuts them; say so at load time, not after the model is loaded."""
    if not trl_fields.get("padding_free") or trl_fields.get("packing"):
        return None
    if "max_length" in trl_fields and trl_fields["max_length"] is None:
        return None
    return (f"{key}.trl.padding_free: without packing TRL cannot cut an example at max_length; add "
            f"{key}.trl.max_length: null (no example is cut: check that every prompt fits the model) or packing: true")


def _construct(cls: type, section: TrainerSection, extra: dict[str, Any]) -> str | None:
    """Build the TRL config once (CPU, scratch output dir); the error's first line or None."""
    import tempfile
    import warnings

    with tempfile.TemporaryDirectory(prefix="coevo-trl-check-") as scratch, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        settings = {"use_cpu": True, "bf16": False, "fp16": False, "report_to": "none",
                    **section.trl_settings(), **extra, "output_dir": scratch}
        try:
            cls(**settings)
        except Exception as exc:  # noqa: BLE001 - ValueError / TypeError mostly; any refusal is reported
            first = (str(exc).strip().splitlines() or [""])[0]
            return first if isinstance(exc, (ValueError, TypeError)) else f"{type(exc).__name__}: {first}"
    return None


def type_name(annotation: Any) -> str:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


# ------------------------------------------------------------------------- loading
def _describe(error: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid parameters"]
    for err in error.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            lines.append(f"  {key}: unknown key{_suggest(key.split('.'))}")
        elif err["type"] == "missing":
            lines.append(f"  {key}: required key is missing")
        elif err["type"] == "literal_error" and isinstance(err.get("input"), str):
            info = field_at(key)
            choices = [str(c) for c in typing.get_args(info.annotation)] if info is not None else []
            hint = close_matches(err["input"], choices) if choices else ""
            lines.append(f"  {key}: {err['input']!r} is not one of {' | '.join(choices) or err['msg']}{hint}")
        elif err["type"] == "value_error" and isinstance(err.get("input"), Mapping):
            # A section's own check (a model validator): its message names the knobs; no section dump.
            lines.append(f"  {key}: {err['msg'].removeprefix('Value error, ')}")
        else:
            lines.append(f"  {key}: {err['msg']} (got {err.get('input')!r})")
    return "\n".join(lines)


def _as_paths(paths: str | Path | Sequence[str | Path]) -> list[Path]:
    if isinstance(paths, (str, Path)):
        return [Path(paths)]
    out = [Path(p) for p in paths]
    if not out:
        raise ParamsError("no params file given")
    return out


def load_tree(
    paths: str | Path | Sequence[str | Path] = "params.yaml", overrides: Sequence[str] | None = None
) -> dict[str, Any]:
    """The merged, overridden params tree before validation (files in order, then ``--set``)."""
    files = _as_paths(paths)
    tree: dict[str, Any] = {}
    for path in files:
        layer = _read_yaml(path)
        for profile in _extends(layer, path):  # what the file builds on comes first
            base = _read_yaml(profile)
            _check_keys(base, profile)
            _merge(tree, base)
        _check_keys(layer, path)  # an unknown key names the file that holds it
        _merge(tree, layer)
    for assignment in [overrides] if isinstance(overrides, str) else overrides or []:
        apply_override(tree, assignment)
    return tree


class Resolved(NamedTuple):
    """A run's params, read once: the validated :class:`Params` and the tree they were validated
    from (files in order, then ``--set``; what a run logs as params.yaml and records for DVC)."""

    params: Params
    tree: dict[str, Any]


def params_from_tree(tree: Mapping[str, Any], *, source: str = "resolved params", method: str | None = None) -> Params:
    """Validate an already resolved params tree (``load_tree``'s, or one a flow received as a plain
    dict); raise ParamsError naming every bad key, ``source`` naming where the tree came from.
    ``method``: as in :func:`load_params`."""
    try:
        params = Params.model_validate(tree)
    except ValidationError as exc:
        raise ParamsError(_describe(exc, source)) from None
    errors = check_trl(params)
    if errors:
        raise ParamsError("\n".join([f"{source}: invalid parameters", *(f"  {e}" for e in errors)]))
    if method is not None and getattr(params, method, None) is None:
        raise ParamsError(f"{source}: no `{method}:` section; method {method} reads its knobs there "
                          f"(`coevo params explain {method}` lists them)")
    return params


def resolve_params(
    paths: str | Path | Sequence[str | Path] = "params.yaml", overrides: Sequence[str] | None = None,
    *, method: str | None = None,
) -> Resolved:
    """:func:`load_params` that also returns the resolved tree: read once, validate once."""
    files = _as_paths(paths)
    tree = load_tree(files, overrides)
    return Resolved(params_from_tree(tree, source=" + ".join(str(p) for p in files), method=method), tree)


def load_params(
    paths: str | Path | Sequence[str | Path] = "params.yaml", overrides: Sequence[str] | None = None,
    *, method: str | None = None,
) -> Params:
    """Read, merge, override and validate params; raise ParamsError naming every bad key.

    ``paths``: one params file or several; each later file is deep-merged over the earlier
    ones (an overlay such as params/demo.yaml). ``overrides``: ``key=value`` strings applied
    last (``--set``). ``method``: the method about to run, whose section must be there (a
    registered method's section is optional otherwise; the built-in three are always required).
    """
    return resolve_params(paths, overrides, method=method).params


def _project_file() -> Path:
    return PROJECT_PARAMS if PROJECT_PARAMS.is_file() else Path("params.yaml")


def project_params(*overrides: str) -> Params:
    """The project's params.yaml (next to the package, else ./params.yaml) with ``overrides``."""
    return load_params(_project_file(), list(overrides))


def section(key: str, /, **changes: Any) -> Section:
    """The section at ``key`` of the project's params.yaml with ``changes`` applied, validated
    like a params file (its ``trl`` mapping included).

    For tests and benchmarks, which need a complete section (the models carry no defaults):
    ``section("cogr.sft", epochs=1, learning_rate=1e-3)``.
    """
    path = _project_file()
    tree = load_tree(path)
    node: Any = tree
    parts = key.split(".")
    if section_type(getattr(field_at(key), "annotation", None)) is None:
        raise ParamsError(f"{key!r} is not a section{_suggest(parts)}")
    for part in parts:
        node = node[part]
    for name, value in changes.items():
        if name not in node:
            raise ParamsError(f"section {key!r}: unknown key {name!r}{close_matches(name, list(node))}")
        node[name] = value
    try:
        params = Params.model_validate(tree)
    except ValidationError as exc:
        raise ParamsError(_describe(exc, f"{path} with changes to {key}")) from None
    errors = check_trl(params)
    if errors:
        raise ParamsError("\n".join([f"{path} with changes to {key}: invalid parameters", *(f"  {e}" for e in errors)]))
    result: Any = params
    for part in parts:
        result = getattr(result, part)
    return result
