"""Typed parameters, loaded from params.yaml (the only place defaults live).

Unknown keys, wrong types and out-of-range values fail before any work, with a message
that names the key (``cogr.grpo.batch_size``) and what was wrong.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DataParams(Section):
    dataset: str = Field(min_length=1)
    loader: Literal["metatool", "stabletoolbench", "wands", "beir", "image_captions"]
    source: str = Field(min_length=1)
    val_fraction: float = Field(ge=0.0, lt=1.0)
    test_fraction: float = Field(ge=0.0, lt=1.0)
    root: str = "data"

    @model_validator(mode="after")
    def _fractions(self) -> "DataParams":
        if self.val_fraction + self.test_fraction >= 1.0:
            raise ValueError("val_fraction + test_fraction must be < 1 (some queries must train)")
        return self


class TrackingParams(Section):
    uri: str = "sqlite:///mlflow.db"
    artifact_root: str = "mlruns"


class LoraParams(Section):
    enabled: bool = True
    r: int = Field(8, ge=1, le=256)
    alpha: int = Field(16, ge=1)
    dropout: float = Field(0.05, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "v_proj"], min_length=1)


class SamplingParams(Section):
    temperature: float = Field(1.0, gt=0.0, le=5.0)
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    max_new_tokens: int = Field(48, ge=1, le=4096)


class SFTParams(Section):
    epochs: int = Field(1, ge=1)
    learning_rate: float = Field(2e-4, gt=0.0)
    batch_size: int = Field(8, ge=1)


class GRPOParams(Section):
    num_generations: int = Field(4, ge=2)
    batch_size: int = Field(8, ge=2)
    learning_rate: float = Field(1e-5, gt=0.0)
    beta: float = Field(0.0, ge=0.0)
    max_completion_length: int = Field(48, ge=1, le=4096)

    @model_validator(mode="after")
    def _divisible(self) -> "GRPOParams":
        # TRL requires every batch to hold whole groups of completions.
        if self.batch_size % self.num_generations:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be a multiple of num_generations ({self.num_generations})"
            )
        return self


class CoGRGRPOParams(GRPOParams):
    epochs_per_side: int = Field(1, ge=1)
    max_prompts_per_phase: int | None = Field(None, ge=1)


class EarlyStoppingParams(Section):
    metric: str = "f1"
    patience: int = Field(2, ge=1)
    min_delta: float = Field(0.0, ge=0.0)


class CoGRParams(Section):
    generator: str = Field(min_length=1)
    seed_generator: str | None = None
    shared_generator: bool = False
    sft_init: bool = True
    query_side_only: bool = False
    item_reward: Literal["marginal", "global"] = "marginal"
    n_query_keywords: int = Field(15, ge=1)
    m_item_keywords: int = Field(10, ge=1)
    k_max: int = Field(30, ge=1)
    rounds: int = Field(2, ge=0)
    eval_split: Literal["val", "test"] = "val"
    max_train_queries: int | None = Field(None, ge=1)
    seed_temperature: float = Field(0.7, gt=0.0, le=5.0)  # G_0 sampling for Algorithm 1 seeds
    lora: LoraParams = Field(default_factory=LoraParams)
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    sft: SFTParams = Field(default_factory=SFTParams)
    grpo: CoGRGRPOParams = Field(default_factory=CoGRGRPOParams)
    early_stopping: EarlyStoppingParams = Field(default_factory=EarlyStoppingParams)


class GrapeGRPOParams(GRPOParams):
    steps: int = Field(40, ge=1)


class GrapeParams(Section):
    generator: str = Field(min_length=1)
    retriever: Literal["text", "clip"] = "text"
    text_encoder: str = "all-minilm-l6-v2"
    clip_model: str = "ViT-B-32"
    clip_pretrained: str | None = None
    reward: Literal["rank", "similarity"] = "rank"
    reasoning: bool = False
    max_reasoning_tokens: int = Field(32, ge=1)
    lora: LoraParams = Field(default_factory=LoraParams)
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    grpo: GrapeGRPOParams = Field(default_factory=GrapeGRPOParams)
    eval_every: int = Field(10, ge=1)


class EncoderTrainingParams(Section):
    epochs: int = Field(1, ge=1)
    batch_size: int = Field(32, ge=2)
    learning_rate: float = Field(2e-5, gt=0.0)


class CoHyDEParams(Section):
    generator: str = Field(min_length=1)
    encoder: str = "all-minilm-l6-v2"
    rounds: int = Field(3, ge=0)
    num_samples: int = Field(4, ge=2)
    sample_temperature: float = Field(0.7, gt=0.0)
    dpo_beta: float = Field(0.1, gt=0.0)
    lora: LoraParams = Field(default_factory=LoraParams)
    encoder_training: EncoderTrainingParams = Field(default_factory=EncoderTrainingParams)
    warmup: SFTParams = Field(default_factory=SFTParams)
    dpo: SFTParams = Field(default_factory=SFTParams)
    max_new_tokens: int = Field(64, ge=1)
    early_stopping: EarlyStoppingParams = Field(default_factory=EarlyStoppingParams)
    index_format: Literal["title", "title_api", "title_api_tool", "title_api_desc", "full"] = "full"
    warmup_formats_per_item: int = Field(5, ge=1, le=5)
    warmup_max_examples: int | None = Field(None, ge=1)
    max_train_queries: int | None = Field(None, ge=2)


class Params(Section):
    seed: int = 42
    data: DataParams
    tracking: TrackingParams = Field(default_factory=TrackingParams)
    cogr: CoGRParams
    grape: GrapeParams
    cohyde: CoHyDEParams

    def flat(self) -> dict[str, Any]:
        """Flattened ``a.b.c -> value`` view (MLflow params, DVC sweeps)."""
        return flatten(self.model_dump())


class ParamsError(ValueError):
    """params.yaml (or an override) is invalid; the message names each bad key."""


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
    """Apply ``a.b.c=value`` (value parsed as YAML) to a nested dict, in place."""
    if "=" not in assignment:
        raise ParamsError(f"override {assignment!r}: expected key=value, e.g. cogr.rounds=3")
    key, raw = assignment.split("=", 1)
    parts = key.strip().split(".")
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if not isinstance(child, dict):
            raise ParamsError(f"override {key!r}: unknown key {'.'.join(parts[: i + 1])!r}")
        node = child
    if parts[-1] not in node:
        raise ParamsError(f"override {key!r}: unknown key {key!r}")
    node[parts[-1]] = yaml.safe_load(raw)


def _describe(error: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid parameters"]
    for err in error.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            lines.append(f"  {key}: unknown key")
        elif err["type"] == "missing":
            lines.append(f"  {key}: required key is missing")
        else:
            lines.append(f"  {key}: {err['msg']} (got {err.get('input')!r})")
    return "\n".join(lines)


def load_params(path: str | Path = "params.yaml", overrides: list[str] | None = None) -> Params:
    """Read, override and validate params; raise ParamsError naming every bad key."""
    path = Path(path)
    try:
        tree = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ParamsError(f"{path}: params file does not exist") from None
    except yaml.YAMLError as exc:
        raise ParamsError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(tree, dict):
        raise ParamsError(f"{path}: expected a mapping of sections at the top level")
    for assignment in overrides or []:
        apply_override(tree, assignment)
    try:
        return Params.model_validate(tree)
    except ValidationError as exc:
        raise ParamsError(_describe(exc, str(path))) from None
