"""Helpers shared by the TRL wrappers: device-aware trainer settings, threads, log summaries."""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any

from coevo.runtime import limit_cpu_threads  # noqa: F401 - re-exported: the one CPU thread policy


def on_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@functools.lru_cache(maxsize=1)
def cpu_bf16_is_fast() -> bool:
    """Whether bf16 matmuls beat fp32 on this CPU (native AVX512-BF16 / AMX units).

    Without such units oneDNN emulates bf16 and a matmul is ~5x slower than in fp32 (measured
    here with ONEDNN_MAX_CPU_ISA=AVX2: 59 ms vs 11 ms); with them it is ~2x faster. A 30 ms
    probe decides; COEVO_CPU_BF16=0/1 overrides it.
    """
    import torch

    forced = os.environ.get("COEVO_CPU_BF16")
    if forced in ("0", "1"):
        return forced == "1"
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    a = torch.randn(256, 512)
    b = torch.randn(512, 512)

    def best_of(x: Any, y: Any) -> float:
        timings = []
        for _ in range(3):
            started = time.perf_counter()
            for _ in range(4):
                x @ y
            timings.append(time.perf_counter() - started)
        return min(timings)

    fp32 = best_of(a, b)
    bf16 = best_of(a.bfloat16(), b.bfloat16())
    return bf16 < 0.8 * fp32


def trainer_device_args(seed: int) -> dict[str, Any]:
    """TrainingArguments shared by our TRL trainers.

    TRL configs default to ``bf16=True`` and ``gradient_checkpointing=True``. On a CPU without
    native bf16 units, bf16 autocast makes every matmul ~5x slower (emulated), and
    checkpointing recomputes the whole forward during backward; together they make a
    SmolLM2-135M GRPO step several times its raw cost (bench/train_step.py). We keep bf16
    mixed precision on CUDA and on CPUs where it is measurably faster (cpu_bf16_is_fast),
    fp32 elsewhere, and leave checkpointing off (LoRA on small models fits in memory).
    """
    cuda = on_cuda()
    return {
        "bf16": cuda or cpu_bf16_is_fast(),
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
