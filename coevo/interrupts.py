"""Ctrl-C and the ``logging`` module lock.

Python 3.11's logging takes its module lock one step before the ``try`` that releases it. A
KeyboardInterrupt raised in between (a signal handler raises at any bytecode) leaves the lock
held by the interrupted thread; every other thread that then logs (MLflow's system-metrics
sampler, Prefect's event worker) waits on it for good, and joining them hangs the exit (seen
once: a `coevo run` still alive 40 minutes after Ctrl-C). The CLI's handler does not raise while
this thread holds the lock (its repeater raises again two seconds later); a run's tracker frees
a lock an interrupt left held before it joins its threads.

The same repeater must not raise again once the interrupt is being acted on: a second
KeyboardInterrupt inside a tracker's clean-up (ending its MLflow run KILLED) or Prefect's (marking
the flow run crashed) cuts it short, and on a loaded machine, where the clean-up outlasts the
repeat, the run stayed RUNNING (seen in a fresh-clone CI run with a third process on 2 cores).
"""

from __future__ import annotations

import logging
import threading

_acted_on = threading.Event()


def interrupt_acted_on() -> bool:
    """Whether this process has begun cleaning up after an interrupt (:func:`acting_on_interrupt`)."""
    return _acted_on.is_set()


def acting_on_interrupt() -> None:
    """Say that the interrupt reached its clean-up: the CLI stops repeating it (for the process's rest)."""
    _acted_on.set()


def logging_lock_held() -> bool:
    """Whether this thread holds the ``logging`` module lock (it is inside a logging call)."""
    lock = getattr(logging, "_lock", None)
    return lock is not None and lock._is_owned()


def release_interrupted_logging_lock() -> None:
    """Free the ``logging`` module lock an interrupt left held by this thread. Call it on the way
    out of an interrupted block, where this thread is in no logging call."""
    while logging_lock_held():
        logging._lock.release()
