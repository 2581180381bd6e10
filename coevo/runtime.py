"""Process-wide runtime policy: how many CPU threads torch uses, and which numerics train.

One policy for every trainer and every method (CoGR, GRAPE, CoHyDE), so ``COEVO_THREADS``
means the same everywhere:

- on CUDA nothing is changed (the GPU does the work);
- ``COEVO_THREADS=N`` (a positive integer) sets N torch threads, whatever the model;
- otherwise one thread when the model is small (at most ``SMALL_MODEL_PARAMS`` parameters,
  or no model given: the callers that pass none load only small models). On a shared
  machine more threads mostly add contention for such models, and one thread keeps
  results bit-reproducible. Larger models keep torch's default.

Numerics (``runtime.precision``): the trainers use bf16 mixed precision or fp32 as
:func:`resolved_precision` says: the knob in effect (:func:`precision_policy`, set by each
method phase) resolved on this machine. :func:`numerics` describes what made a model
(precision, device, CPU ISA, threads, library versions); phase stamps and MLflow runs record it.

This module imports nothing from coevo, so any layer (models, train, methods) may use it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Iterator
from importlib import metadata
from typing import Any

# Models up to this many parameters run on one CPU thread (see the module docstring).
SMALL_MODEL_PARAMS = 200_000_000
THREADS_ENV = "COEVO_THREADS"


def threads_from_env() -> int | None:
    """``COEVO_THREADS`` as a positive int, None when unset or empty; anything else is an error."""
    raw = os.environ.get(THREADS_ENV, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{THREADS_ENV}={raw!r}: expected a positive integer (number of torch CPU threads)")
    return value


def _parameter_count(model: Any) -> int:
    parameters = getattr(model, "parameters", None)
    if parameters is None:
        raise TypeError(f"limit_cpu_threads: {type(model).__name__} has no parameters() (pass a torch module or None)")
    return sum(p.numel() for p in parameters())


def limit_cpu_threads(model: Any = None) -> int | None:
    """Apply the CPU thread policy (module docstring); returns the thread count set, or None.

    ``model`` is anything with ``parameters()`` (a torch module, a SentenceTransformer); None
    stands for "only small models here".
    """
    import torch

    if torch.cuda.is_available():
        return None
    wanted = threads_from_env()
    if wanted is None:
        if model is not None and _parameter_count(model) > SMALL_MODEL_PARAMS:
            return None
        wanted = 1
    torch.set_num_threads(wanted)
    return wanted


# ------------------------------------------------------------------------------ numerics
PRECISIONS = ("auto", "fp32", "bf16")
CPU_BF16_ENV = "COEVO_CPU_BF16"
ONEDNN_ISA_ENV = "ONEDNN_MAX_CPU_ISA"
# The libraries whose versions are part of a model's numerics: (key, distribution names to try).
NUMERICS_PACKAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("torch", ("torch",)),
    ("transformers", ("transformers",)),
    ("trl", ("trl",)),
    ("peft", ("peft",)),
    ("sentence_transformers", ("sentence-transformers",)),
    ("faiss", ("faiss-cpu", "faiss-gpu", "faiss")),
)
NOT_INSTALLED = "not installed"
# What must match for a run folder to be resumed (see coevo.methods.base); the bf16 units too
# where the finished phases trained in bf16.
RESUME_NUMERICS = ("precision", "cpu_isa", "onednn_max_cpu_isa")
BF16_RESUME_NUMERICS = ("bf16_units",)

_precision_knob = "auto"


@functools.lru_cache(maxsize=1)
def cpu_bf16_is_fast() -> bool:
    """Whether bf16 matmuls beat fp32 on this CPU (native AVX512-BF16 / AMX units).

    Without such units oneDNN emulates bf16 and a matmul is ~5x slower than in fp32 (measured
    here with ONEDNN_MAX_CPU_ISA=AVX2: 59 ms vs 11 ms); with them it is ~2x faster.
    A check of oneDNN's native support decides; COEVO_CPU_BF16=0/1 overrides it. ONEDNN_MAX_CPU_ISA below AVX512_CORE_BF16
    makes oneDNN report no bf16 support, so this is False then.
    """
    import torch

    forced = os.environ.get(CPU_BF16_ENV)
    if forced in ("0", "1"):
        return forced == "1"
    # oneDNN reports bf16 support only with native units (AVX512-BF16 / AMX), where bf16 is ~2x
    # faster. No timing probe: on a busy machine a probe flipped between processes, and a resumed
    # run then refused its own phases as "trained under other numerics".
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


@functools.lru_cache(maxsize=1)
def cpu_bf16_units() -> str:
    """The bf16 matrix units of this CPU: ``AMX`` (Intel Xeon since Sapphire Rapids), ``AVX512_BF16``
    (AMD Zen 4, Intel Cooper Lake) or ``none``. torch calls both kinds ``AVX512``, but oneDNN runs
    other bf16 matmul kernels on each (brg_matmul ``avx512_core_amx`` against ``avx512_core_bf16``),
    so a bf16 figure is reproduced on the same units only. ``unknown`` where torch cannot tell."""
    import torch

    try:
        if torch.cpu._is_amx_tile_supported():
            return "AMX"
        return "AVX512_BF16" if torch.cpu._is_avx512_bf16_supported() else "none"
    except AttributeError:  # a torch without these probes
        return "unknown"


def _knob(precision: Any) -> str:
    """The precision knob of a Params (``runtime.precision``), or a knob given as a string."""
    runtime = getattr(precision, "runtime", None)
    knob = runtime.precision if runtime is not None else precision
    if knob not in PRECISIONS:
        raise ValueError(f"runtime.precision = {knob!r}: expected one of {' | '.join(PRECISIONS)}")
    return knob


@contextlib.contextmanager
def precision_policy(precision: Any) -> Iterator[str]:
    """Make ``precision`` (a knob or a Params) the one :func:`resolved_precision` uses inside the block."""
    global _precision_knob
    knob, before = _knob(precision), _precision_knob
    _precision_knob = knob
    try:
        yield knob
    finally:
        _precision_knob = before


def resolved_precision(precision: Any = None) -> str:
    """``fp32`` or ``bf16``: the knob (default: the one in effect, :func:`precision_policy`) on this
    machine; ``auto`` is bf16 on CUDA and on CPUs where it is measurably faster, else fp32."""
    knob = _knob(_precision_knob if precision is None else precision)
    if knob != "auto":
        return knob
    import torch

    return "bf16" if torch.cuda.is_available() or cpu_bf16_is_fast() else "fp32"


def package_version(*distributions: str) -> str:
    """The installed version of the first distribution found (importlib.metadata: nothing is imported)."""
    for name in distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return NOT_INSTALLED


def numerics(precision: Any = None) -> dict[str, str]:
    """What decides the numbers a model gets here: the resolved precision (of ``precision``, a
    Params or a knob; default the knob in effect), device, the CPU ISA torch dispatches to and
    oneDNN's cap on it (``ONEDNN_MAX_CPU_ISA``, "" when unset), torch's thread count and the
    versions of the training libraries."""
    import torch

    out = {
        "precision": resolved_precision(precision),
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "cpu_isa": torch.backends.cpu.get_cpu_capability(),
        "bf16_units": cpu_bf16_units(),
        "onednn_max_cpu_isa": os.environ.get(ONEDNN_ISA_ENV, ""),
        "torch_threads": str(torch.get_num_threads()),
    }
    out.update({key: package_version(*names) for key, names in NUMERICS_PACKAGES})
    return out


def describe_numerics(record: dict[str, Any]) -> str:
    """``bf16 on AVX512+AMX (torch 2.4.1)`` (the bf16 units named where the precision is bf16 and the
    record has them), with ``, ONEDNN_MAX_CPU_ISA=AVX2`` when oneDNN was capped."""
    isa = record.get("cpu_isa", "?")
    if record.get("precision") == "bf16" and record.get("bf16_units") not in (None, "", "none", "unknown"):
        isa += f"+{record['bf16_units']}"
    if record.get("onednn_max_cpu_isa"):
        isa += f", {ONEDNN_ISA_ENV}={record['onednn_max_cpu_isa']}"
    return f"{record.get('precision', '?')} on {isa} (torch {record.get('torch', '?')})"
