"""Process-wide runtime policy: how many CPU threads torch uses.

One policy for every trainer and every method (CoGR, GRAPE, CoHyDE), so ``COEVO_THREADS``
means the same everywhere:

- on CUDA nothing is changed (the GPU does the work);
- ``COEVO_THREADS=N`` (a positive integer) sets N torch threads, whatever the model;
- otherwise one thread when the model is small (at most ``SMALL_MODEL_PARAMS`` parameters,
  or no model given: the callers that pass none load only small models). On a shared
  machine more threads mostly add contention for such models, and one thread keeps
  results bit-reproducible. Larger models keep torch's default.

This module imports nothing from coevo, so any layer (models, train, methods) may use it.
"""

from __future__ import annotations

import os
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
