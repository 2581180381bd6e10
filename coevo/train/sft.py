"""Supervised fine-tuning of a :class:`~coevo.models.generator.Generator` through TRL's SFTTrainer."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from coevo.config import SFTParams
from coevo.models.generator import Generator, seeded
from coevo.train.common import (
    check_finite_result,
    check_finite_weights,
    last_of,
    limit_cpu_threads,
    mean_of,
    step_callbacks,
    trainer_device_args,
)

log = logging.getLogger(__name__)


def _check_examples(examples: Sequence[dict[str, Any]]) -> str:
    """Return the format name ('prompt_completion' or 'text'); raise naming the first bad row."""
    if not examples:
        raise ValueError("train_sft: no training examples")
    first = examples[0]
    fmt = "prompt_completion" if "prompt" in first else "text" if "text" in first else None
    if fmt is None:
        raise ValueError("train_sft: row 0 needs 'prompt' + 'completion' (chat messages) or 'text'")
    needed = ("prompt", "completion") if fmt == "prompt_completion" else ("text",)
    for row_number, row in enumerate(examples):
        for key in needed:
            if not row.get(key):
                raise ValueError(f"train_sft: row {row_number} has no {key!r} (all rows must use one format)")
    return fmt


def sft_settings(
    generator: Generator,
    params: SFTParams,
    out_dir: str | Path,
    seed: int,
    *,
    max_length: int = 512,
    max_steps: int | None = None,
) -> dict[str, Any]:
    """SFTConfig keyword arguments: coevo's settings, then ``params.trl`` (any other SFTConfig field)."""
    return {
        "output_dir": str(out_dir),
        **params.trl_settings(),  # the section's knobs (epochs, learning_rate, batch_size)
        "max_steps": max_steps if max_steps is not None else -1,
        "lr_scheduler_type": "linear",
        "warmup_steps": 0,
        "max_length": max_length,
        "packing": False,
        "eos_token": generator.tokenizer.eos_token,  # the tokenizer's pad token is used as is
        **trainer_device_args(seed),
        **params.trl,
    }


def train_sft(
    generator: Generator,
    examples: Sequence[dict[str, Any]],
    params: SFTParams,
    out_dir: str | Path,
    seed: int,
    *,
    max_length: int = 512,
    max_steps: int | None = None,
    what: str = "SFT",
    knob: str | None = None,
) -> dict[str, Any]:
    """Fine-tune ``generator.model`` in place on ``examples``; return a metrics summary.

    ``examples``: either conversational prompt/completion rows
    (``{"prompt": [messages], "completion": [{"role": "assistant", ...}]}``; the loss covers
    the completion only) or plain ``{"text": ...}`` rows (language modelling on the text).

    A NaN or infinite loss, gradient norm or weight stops training with
    :class:`~coevo.train.common.NonFiniteTraining` naming ``what`` (the phase), ``out_dir``
    and ``knob`` (the params section, e.g. ``cogr.sft``): the caller never saves the phase.
    """
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    fmt = _check_examples(examples)
    limit_cpu_threads(generator.model)
    columns = ("prompt", "completion") if fmt == "prompt_completion" else ("text",)
    dataset = Dataset.from_list([{k: row[k] for k in columns} for row in examples])
    config = SFTConfig(**sft_settings(generator, params, out_dir, seed, max_length=max_length, max_steps=max_steps))
    started = time.perf_counter()
    guard = {"what": what, "out_dir": out_dir, "knob": knob, "learning_rate": params.learning_rate}
    with seeded(seed):
        trainer = SFTTrainer(
            model=generator.model,
            args=config,
            train_dataset=dataset,
            processing_class=generator.tokenizer,
            callbacks=step_callbacks(**guard),
        )
        result = trainer.train()
    generator.model = trainer.model
    generator.model.eval()
    check_finite_result(result.training_loss, "the mean training loss", **guard)
    check_finite_weights(generator.model, **guard)
    history = trainer.state.log_history
    return {
        "train/loss": float(result.training_loss),
        "train/loss_last": last_of(history, "loss"),
        "train/token_accuracy": mean_of(history, "mean_token_accuracy"),
        "train/steps": int(trainer.state.global_step),
        "train/examples": len(examples),
        "train/seconds": time.perf_counter() - started,
    }
