"""One run per run folder: an exclusive lock taken before any work.

The lock is a ``filelock.FileLock`` on ``<run_dir>.lock`` (next to the run folder, not inside
it: the run folder is a DVC output). On Linux and macOS it is an ``flock`` lock, which the
kernel drops when the holding process dies however it dies, so a stale lock of a killed run
is simply taken over. Who holds it (pid, host, start time, command) is written, after the
lock is taken, to the sidecar ``<run_dir>.lock.json``; a second run reads it to name the
holder in its error.

Within one process the lock is reentrant, and it is held until the outermost ``with`` ends.
``coevo run`` takes it once, in the CLI before any work; the flow it starts runs under it (a
flow takes the lock itself only when its process does not hold it: a deployment, ``python
flows/<method>.py``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from coevo.io import read_json, write_json


class RunLocked(RuntimeError):
    """Another live process holds the run folder's lock."""


def lock_path(run_dir: str | Path) -> Path:
    run_dir = Path(run_dir).resolve()
    return run_dir.with_name(f"{run_dir.name}.lock")


def holder_path(run_dir: str | Path) -> Path:
    path = lock_path(run_dir)
    return path.with_name(f"{path.name}.json")


def _file_lock(path: Path):
    from filelock import FileLock

    # is_singleton: one instance per path in this process, so taking it twice nests (a counter)
    # instead of opening a second descriptor that its own flock would refuse; thread_local=False:
    # Prefect may run the flow body in another thread than the CLI that took the lock.
    return FileLock(path, timeout=0, thread_local=False, is_singleton=True)


def holder(run_dir: str | Path) -> dict[str, Any] | None:
    """The sidecar of the lock (pid, host, started, command), or None when there is none."""
    path = holder_path(run_dir)
    try:
        info = read_json(path)
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def describe(info: dict[str, Any] | None) -> str:
    if not info:
        return "another process (no holder information)"
    command = f"`{info['command']}`, " if info.get("command") else ""
    return f"{command}pid {info.get('pid')} on {info.get('host')}, started {info.get('started')}"


@contextlib.contextmanager
def run_lock(run_dir: str | Path, what: str = "") -> Iterator[Path]:
    """Hold the exclusive lock of ``run_dir`` for the block; :class:`RunLocked` at once if taken.

    ``what`` names the command in the holder information (default: this process's argv).
    """
    from filelock import Timeout

    path = lock_path(run_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot create the folder of the run lock ({exc.strerror})",
                      str(path.parent)) from None
    lock = _file_lock(path)
    outermost = not lock.is_locked
    try:
        lock.acquire()
    except Timeout:
        raise RunLocked(
            f"{Path(run_dir)} is in use by {describe(holder(run_dir))}; one run per run folder: wait for it to "
            f"finish or stop it (its lock: {path})"
        ) from None
    try:
        if outermost:
            started = dt.datetime.now().astimezone().isoformat(timespec="seconds")
            command = what or " ".join(["coevo" if Path(sys.argv[0]).name == "coevo" else sys.argv[0], *sys.argv[1:]])
            write_json(holder_path(run_dir), {"pid": os.getpid(), "host": socket.gethostname(),
                                              "started": started, "command": command},
                       collective=False)  # rank 0 alone holds the lock (coevo.distributed)
        yield path
    finally:
        if outermost:
            with contextlib.suppress(OSError):
                holder_path(run_dir).unlink()
        lock.release()


def holds(run_dir: str | Path) -> bool:
    """Whether this process holds the lock of ``run_dir``."""
    return _file_lock(lock_path(run_dir)).is_locked
