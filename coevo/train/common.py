"""Helpers shared by the TRL wrappers: device-aware trainer settings, threads, log summaries."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from coevo.runtime import cpu_bf16_is_fast  # noqa: F401 - re-exported: the CPU bf16 probe
from coevo.runtime import limit_cpu_threads  # noqa: F401 - re-exported: the one CPU thread policy
from coevo.runtime import resolved_precision


def on_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def trainer_device_args(seed: int) -> dict[str, Any]:
    """TrainingArguments shared by our TRL trainers.

    TRL configs default to ``bf16=True`` and ``gradient_checkpointing=True``. On a CPU without
    native bf16 units, bf16 autocast makes every matmul ~5x slower (emulated), and
    checkpointing recomputes the whole forward during backward; together they make a
    SmolLM2-135M GRPO step several times its raw cost (bench/train_step.py). We keep bf16
    mixed precision on CUDA and on CPUs where it is measurably faster (cpu_bf16_is_fast),
    fp32 elsewhere (``runtime.precision = auto``; fp32 or bf16 force it: the knob in effect,
    :func:`coevo.runtime.resolved_precision`), and leave checkpointing off (LoRA on small models
    fits in memory).
    """
    cuda = on_cuda()
    return {
        "bf16": resolved_precision() == "bf16",
        "fp16": False,
        "use_cpu": not cuda,
        "gradient_checkpointing": False,
        "seed": seed,
        "data_seed": seed,
        "report_to": "none",
        "save_strategy": "no",
        "logging_steps": 1,
        "dataloader_num_workers": 0,
        "disable_tqdm": False,
        # Log a non-finite step loss as it is (the default replaces it with the running mean),
        # so that StopOnNonFinite sees it.
        "logging_nan_inf_filter": False,
    }


def mean_of(log_history: Sequence[dict[str, Any]], key: str) -> float | None:
    """Mean of a logged training metric over all logging steps (None when never logged)."""
    values = [float(row[key]) for row in log_history if key in row and row[key] is not None]
    values = [v for v in values if not math.isnan(v)]
    return sum(values) / len(values) if values else None


def last_of(log_history: Sequence[dict[str, Any]], key: str) -> float | None:
    for row in reversed(log_history):
        if key in row and row[key] is not None:
            return float(row[key])
    return None


def summarize(log_history: Sequence[dict[str, Any]], keys: Iterable[str]) -> dict[str, float | None]:
    return {key: mean_of(log_history, key) for key in keys}


# ------------------------------------------------------------------------ finite training
class NonFiniteTraining(FloatingPointError):
    """Training diverged (a NaN or infinite loss or gradient norm, or a weight that is not finite
    or has exploded); the phase is not saved."""


def _knob_hint(knob: str | None, learning_rate: float | None) -> str:
    now = f", now {learning_rate:g}" if learning_rate is not None else ""
    where = f"{knob}.learning_rate" if knob else "the learning_rate of this trainer's params section"
    return f"lower the learning rate ({where}{now}), or check the data and the trl: settings"


def _describe(what: str, out_dir: Any) -> str:
    return f"{what} (output {out_dir})" if out_dir is not None else what


def stop_on_non_finite(what: str, out_dir: Any = None, knob: str | None = None, learning_rate: float | None = None):
    """A transformers TrainerCallback that stops training at the first non-finite loss or grad norm.

    It raises :class:`NonFiniteTraining` from ``on_log`` (our trainers log every step), naming
    the phase (``what``), its output folder and the knob to look at; the exception ends
    ``trainer.train()``, so the caller never saves (checkpoints) the phase.
    """
    from transformers import TrainerCallback

    class StopOnNonFinite(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ARG002 - TrainerCallback API
            for key, value in (logs or {}).items():
                watched = key in ("loss", "grad_norm", "train_loss") or key.endswith("/loss")
                if watched and isinstance(value, (int, float)) and not math.isfinite(value):
                    raise NonFiniteTraining(
                        f"{_describe(what, out_dir)}: {key} is {value} at step {state.global_step}: training diverged "
                        f"and the phase is not saved; {_knob_hint(knob, learning_rate)}"
                    )

    return StopOnNonFinite()


def report_steps(what: str):
    """A transformers TrainerCallback that sends each logged step to :func:`coevo.progress.training_log`
    (the open MLflow run charts it while the phase trains), with ``step_seconds``: the wall time
    since the previous logged step. It only reads the logs: training is the same with or without it."""
    import time

    from transformers import TrainerCallback

    from coevo import progress

    class ReportSteps(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):  # noqa: ARG002 - TrainerCallback API
            self.last = time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ARG002 - TrainerCallback API
            logs = logs or {}
            if "train_runtime" in logs:  # the end-of-training summary, not a step
                return
            now = time.perf_counter()
            values = {k: float(v) for k, v in logs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            values["step_seconds"] = now - getattr(self, "last", now)
            self.last = now
            progress.training_log(what, state.global_step, values)

    return ReportSteps()


def step_callbacks(what: str, out_dir: Any = None, knob: str | None = None, learning_rate: float | None = None):
    """The callbacks every trainer of ours runs: stop at a non-finite step, report each step."""
    return [stop_on_non_finite(what, out_dir, knob, learning_rate), report_steps(what)]


# No trained network has a weight this large; an absurd learning rate (1e30) drives LoRA
# weights to ~1e30 while the loss stays finite (saturated), so finiteness alone misses it.
MAX_ABS_WEIGHT = 1e6


def check_finite_weights(model: Any, what: str, out_dir: Any = None, knob: str | None = None,
                         learning_rate: float | None = None) -> None:
    """Raise :class:`NonFiniteTraining` when a trainable weight holds NaN or inf, or has exploded
    beyond :data:`MAX_ABS_WEIGHT` (checked once, after training, on the trainable weights only)."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if not param.requires_grad or param.numel() == 0:
                continue
            largest = float(param.detach().abs().max())
            if not math.isfinite(largest) or largest > MAX_ABS_WEIGHT:
                state = "is not finite" if not math.isfinite(largest) else f"reached {largest:.3g} (> {MAX_ABS_WEIGHT:g})"
                raise NonFiniteTraining(
                    f"{_describe(what, out_dir)}: weight {name} {state} after training: training diverged and the "
                    f"phase is not saved; {_knob_hint(knob, learning_rate)}"
                )


def check_finite_result(value: Any, key: str, what: str, out_dir: Any = None, knob: str | None = None,
                        learning_rate: float | None = None) -> None:
    """Raise :class:`NonFiniteTraining` when a reported training number is NaN or inf."""
    if isinstance(value, (int, float)) and not math.isfinite(value):
        raise NonFiniteTraining(f"{_describe(what, out_dir)}: {key} is {value}: training diverged and the phase is "
                                f"not saved; {_knob_hint(knob, learning_rate)}")


_SAMPLING_NAN = ("probability tensor contains either `inf`, `nan` or element < 0",)


def non_finite_from(exc: BaseException, what: str, out_dir: Any = None, knob: str | None = None,
                    learning_rate: float | None = None) -> NonFiniteTraining | None:
    """The error to raise instead of torch's sampling failure on NaN logits (a diverged policy)."""
    if isinstance(exc, RuntimeError) and any(s in str(exc) for s in _SAMPLING_NAN):
        return NonFiniteTraining(f"{_describe(what, out_dir)}: the policy produces NaN/inf probabilities while "
                                 f"sampling: training diverged and the phase is not saved; "
                                 f"{_knob_hint(knob, learning_rate)}")
    return None
