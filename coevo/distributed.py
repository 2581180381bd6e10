"""Several processes, one writer: how coevo behaves under `accelerate launch` or torchrun.

Every rank runs the same steps (a TRL trainer needs all of them in each of its calls), but
only rank 0 changes the run folder:

- a write through ``coevo.io.atomic_path`` is a collective: rank 0 renames its file into
  place, the other ranks drop theirs, and all of them meet at a barrier, so a read after a
  write sees rank 0's file on every rank (every rank makes the same writes in the same
  order: the same code, the same stamps, the same data);
- removals (stale outputs, stamps, scratch folders) are rank 0's alone;
- the run folder's lock is rank 0's (``coevo train``), so a second job is still refused;
- a shared cache filled on first use (the SmolLM2 conversion) is filled by rank 0 first
  (``writer_first``), the others find it there.

The launcher says how many processes there are (``WORLD_SIZE``, ``RANK``); outside a
multi-process launch every function here is a no-op. This module imports nothing from
coevo, so any layer may use it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    try:
        return int(raw) if raw else default
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected an integer (set by accelerate launch / torchrun)") from None


def rank() -> int:
    """This process's rank in the launch (0 without one)."""
    return _env_int("RANK", 0)


def world_size() -> int:
    """How many processes the launch started (1 without one)."""
    return _env_int("WORLD_SIZE", 1)


def multi_process() -> bool:
    return world_size() > 1


def is_writer() -> bool:
    """Whether this process writes the run folder: rank 0, or the only process."""
    return rank() == 0


def start() -> None:
    """Join the launch's process group (gloo on CPU, NCCL on GPU) before the first write.

    accelerate's PartialState is what the TRL trainers use too, so they share this group.
    """
    if multi_process():
        from accelerate import PartialState

        PartialState()


def barrier() -> None:
    """Wait for every rank (multi-process launches only)."""
    if not multi_process():
        return
    import torch.distributed as dist

    if not dist.is_initialized():
        start()  # a launched script that writes before its first trainer joins the group here
    dist.barrier()


@contextlib.contextmanager
def writer_first() -> Iterator[None]:
    """Rank 0 runs the block first; the other ranks run it after rank 0 finished it.

    For "make it unless it exists" work on a shared cache: each rank deciding alone would
    race. Writes inside the block are not collectives (``atomic_path(collective=False)``).
    """
    if not is_writer():
        barrier()
    try:
        yield
    finally:
        if is_writer():
            barrier()
