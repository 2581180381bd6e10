"""GRPO on a :class:`~coevo.models.generator.Generator` through TRL's GRPOTrainer.

``reward_fn(completions: list[str], **columns) -> list[float]`` receives the completion texts
and, for each one, the extra dataset columns of its prompt (e.g. ``query_id``).

Speed on CPU (see bench/train_step.py): TRL's GRPOConfig defaults to ``bf16=True`` and
``gradient_checkpointing=True``. On a CPU without native bf16 instructions (no AVX512-BF16 /
AMX) every bf16 matmul is emulated, about 5x slower than fp32, and checkpointing recomputes
the forward in backward; together they make a SmolLM2-135M step several times the raw
forward+backward plus generate it is made of. ``coevo.train.common.trainer_device_args``
turns checkpointing off and uses bf16 only on CUDA or where the CPU runs it faster than
fp32; everything else is TRL's.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coevo.config import GRPOParams
from coevo.models.generator import Generator, seeded
from coevo.models.prompts import completion_text
from coevo.train.common import (
    check_finite_weights,
    last_of,
    limit_cpu_threads,
    mean_of,
    non_finite_from,
    step_callbacks,
    trainer_device_args,
)

log = logging.getLogger(__name__)

RewardFn = Callable[..., Sequence[float]]


@dataclass
class GroupOutcomes:
    """Where a phase's reward signal goes, group by group (a group: the ``size`` completions of one
    prompt, consecutive in each reward call as TRL's sampler repeats a prompt). A group whose
    rewards are all equal teaches nothing (zero advantage); ``solved_at``: the reward of a
    completely right completion (CoGR's query side: F1 = 1), so a group at it in every sample is a
    prompt the policy already solves; a group at or below 0 in every sample, one it solves in none."""

    size: int
    solved_at: float | None = None
    groups: int = 0
    zero_std: int = 0
    all_solved: int = 0
    none_scored: int = 0
    completions: int = 0

    def add(self, values: Sequence[float]) -> None:
        self.completions += len(values)
        if self.size < 2 or len(values) % self.size:  # a slice that splits groups (several processes)
            return
        for start in range(0, len(values), self.size):
            group = values[start:start + self.size]
            self.groups += 1
            self.zero_std += max(group) == min(group)
            self.none_scored += max(group) <= 0.0
            if self.solved_at is not None:
                self.all_solved += min(group) >= self.solved_at

    def summary(self) -> dict[str, float | None]:
        def share(count: int) -> float | None:
            return count / self.groups if self.groups else None

        return {"groups": self.groups, "groups_zero_std_share": share(self.zero_std),
                "groups_solved_in_none_share": share(self.none_scored),
                "groups_solved_in_all_share": share(self.all_solved) if self.solved_at is not None else None}


def wrap_reward(reward_fn: RewardFn, columns: Sequence[str],
                outcomes: GroupOutcomes | None = None) -> Callable[..., list[float]]:
    """Adapt ``reward_fn(completions, **columns)`` to TRL's reward-function calling convention;
    ``outcomes`` records each call's groups."""

    def reward(prompts, completions, **kwargs) -> list[float]:  # noqa: ARG001 - TRL passes prompts
        texts = [completion_text(c) for c in completions]
        values = reward_fn(texts, **{name: kwargs[name] for name in columns})
        values = [float(v) for v in values]
        if len(values) != len(texts):
            raise ValueError(f"reward function returned {len(values)} values for {len(texts)} completions")
        if outcomes is not None:
            outcomes.add(values)
        return values

    reward.__name__ = getattr(reward_fn, "__name__", type(reward_fn).__name__)
    return reward


def grpo_config(
    out_dir: str | Path,
    params: GRPOParams,
    seed: int,
    *,
    epochs: int = 1,
    max_steps: int | None = None,
    temperature: float = 1.0,
    top_p: float = 1.0,
    use_vllm: bool = False,
    **overrides: Any,
):
    """The GRPOConfig we train with (see the module docstring for the CPU speed settings).

    Precedence: coevo's settings, then ``params.trl`` (any other GRPOConfig field, e.g.
    ``loss_type``, ``epsilon``, ``scale_rewards``, ``gradient_accumulation_steps``), then
    ``overrides``.
    """
    from trl import GRPOConfig

    settings: dict[str, Any] = {
        "output_dir": str(out_dir),
        **params.trl_settings(),  # the section's knobs (batch_size, num_generations, ..., beta)
        "num_train_epochs": epochs,
        "max_steps": max_steps if max_steps is not None else -1,
        "temperature": temperature,
        "top_p": top_p,
        "use_vllm": use_vllm,
        "disable_dropout": True,  # same logprobs in the loss as at sampling time
        "log_completions": False,
        **trainer_device_args(seed),
    }
    if use_vllm:
        settings["vllm_mode"] = "colocate"
    # The params' trl pass-through (checked against GRPOConfig at load time), then the caller's.
    settings.update(params.trl)
    settings.update(overrides)
    return GRPOConfig(**settings)


def train_grpo(
    generator: Generator,
    prompts: Sequence[dict[str, Any]],
    reward_fn: RewardFn,
    params: GRPOParams,
    out_dir: str | Path,
    seed: int,
    *,
    epochs: int = 1,
    max_steps: int | None = None,
    temperature: float = 1.0,
    top_p: float = 1.0,
    use_vllm: bool = False,
    callbacks: Sequence[Any] = (),
    what: str = "GRPO",
    knob: str | None = None,
    solved_at: float | None = None,
    **config_overrides: Any,
) -> dict[str, Any]:
    """Train ``generator.model`` in place with GRPO; return a metrics summary.

    ``prompts``: rows with a ``prompt`` (chat messages or text) and any other columns, which
    are handed to ``reward_fn`` per completion. Returns ``reward_mean`` (mean over logging
    steps), ``reward_first``/``reward_last``, ``kl`` (0 when ``beta == 0``: no reference
    model is kept), ``steps``, ``seconds``, ``step_seconds``, ``completion_length`` and
    ``curve`` (:func:`learning_curve`: the per-step reward, its std, the share of zero-variance
    groups, KL, loss and step time), and where the signal went (:class:`GroupOutcomes`, with
    ``solved_at`` the reward of a completely right completion): the shares of groups with zero
    reward variance, solved in no sample and in every sample, ``rollouts_per_min`` (completions
    scored per minute of training) and ``generation_share`` (the share of it spent sampling).

    A NaN or infinite loss, gradient norm or weight (or NaN sampling probabilities) stops
    training with :class:`~coevo.train.common.NonFiniteTraining` naming ``what`` (the phase),
    ``out_dir`` and ``knob`` (the params section, e.g. ``cogr.grpo``).
    """
    from datasets import Dataset
    from trl import GRPOTrainer

    if not prompts:
        raise ValueError("train_grpo: no prompts")
    for row_number, row in enumerate(prompts):
        if not row.get("prompt"):
            raise ValueError(f"train_grpo: prompt row {row_number} has no 'prompt'")
    columns = [k for k in prompts[0] if k != "prompt"]
    _check_reward_signature(reward_fn, columns)
    limit_cpu_threads(generator.model)
    config = grpo_config(
        out_dir,
        params,
        seed,
        epochs=epochs,
        max_steps=max_steps,
        temperature=temperature,
        top_p=top_p,
        use_vllm=use_vllm,
        **config_overrides,
    )
    dataset = Dataset.from_list([dict(row) for row in prompts])
    import torch

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    guard = {"what": what, "out_dir": out_dir, "knob": knob, "learning_rate": params.learning_rate}
    outcomes = GroupOutcomes(size=config.num_generations, solved_at=solved_at)
    with seeded(seed):
        trainer = GRPOTrainer(
            model=generator.model,
            reward_funcs=wrap_reward(reward_fn, columns, outcomes),
            args=config,
            train_dataset=dataset,
            processing_class=generator.tokenizer,
            callbacks=[*callbacks, *step_callbacks(**guard)],
        )
        sampling = _time_generation(trainer)
        try:
            trainer.train()
        except RuntimeError as exc:
            diverged = non_finite_from(exc, **guard)
            if diverged is None:
                raise
            raise diverged from exc
    generator.model = trainer.model
    generator.model.eval()
    check_finite_weights(generator.model, **guard)
    history = trainer.state.log_history
    steps = int(trainer.state.global_step)
    seconds = time.perf_counter() - started
    kl = mean_of(history, "kl")
    step_seconds = mean_of(history, "step_time") or (seconds / steps if steps else None)
    completion_length = mean_of(history, "completions/mean_length")
    return {
        "reward_mean": mean_of(history, "reward"),
        "reward_first": next((float(r["reward"]) for r in history if "reward" in r), None),
        "reward_last": last_of(history, "reward"),
        "reward_std": mean_of(history, "reward_std"),
        "kl": kl if kl is not None else 0.0,
        "entropy": mean_of(history, "entropy"),
        "completion_length": completion_length,
        "clipped_ratio": mean_of(history, "completions/clipped_ratio"),
        "frac_reward_zero_std": mean_of(history, "frac_reward_zero_std"),
        "loss": mean_of(history, "loss"),
        "steps": steps,
        "seconds": seconds,
        "step_seconds": step_seconds,
        # Completion tokens sampled per second of optimizer step (generation + loss + update); a
        # step is gradient_accumulation_steps micro-batches of batch_size completions (TRL's
        # step_time sums them).
        "tokens_per_s": (completion_length * params.batch_size * trainer.args.gradient_accumulation_steps / step_seconds)
        if completion_length and step_seconds else None,
        "peak_gpu_mb": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
        **outcomes.summary(),
        "rollouts_per_min": outcomes.completions / seconds * 60 if seconds else None,
        "generation_share": sampling["seconds"] / seconds if seconds and sampling["calls"] else None,
        "curve": learning_curve(history),
    }


def _time_generation(trainer: Any) -> dict[str, float]:
    """Seconds the trainer spends sampling completions, summed over its calls. TRL times its
    generation (profiling_context) only for W&B/MLflow/Trackio reporters, not in its log history,
    so the trainer's own sampling method is wrapped on this instance (``calls`` stays 0 on a TRL
    without it, and the share is then not reported)."""
    timing = {"seconds": 0.0, "calls": 0}
    generate = getattr(trainer, "_generate", None)
    if generate is None:
        return timing

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return generate(*args, **kwargs)
        finally:
            timing["seconds"] += time.perf_counter() - started
            timing["calls"] += 1

    trainer._generate = timed
    return timing


# The per-step values of TRL's log a learning curve keeps (TRL's names; absent ones are skipped).
CURVE_KEYS = ("reward", "reward_std", "frac_reward_zero_std", "kl", "loss", "grad_norm", "entropy",
              "completions/mean_length", "completions/clipped_ratio", "step_time")


def learning_curve(history: Sequence[dict[str, Any]]) -> list[dict[str, float]]:
    """One row per logged training step: {"step", and each of CURVE_KEYS that TRL logged}."""
    rows = []
    for entry in history:
        row = {k: float(entry[k]) for k in CURVE_KEYS if isinstance(entry.get(k), (int, float))}
        if row:
            rows.append({"step": float(entry.get("step", len(rows) + 1)), **row})
    return rows


def _check_reward_signature(reward_fn: RewardFn, columns: Sequence[str]) -> None:
    """Fail before training (not after the first rollout) when the reward cannot take the columns."""
    try:
        signature = inspect.signature(reward_fn)
    except (TypeError, ValueError):
        return
    parameters = signature.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    missing = [c for c in columns if c not in parameters]
    if missing:
        raise ValueError(f"reward function {reward_fn!r} does not accept prompt column(s) {missing}")
