"""Library output to a log file, our own lines to the terminal.

Libraries write to file descriptors 1 and 2: TRL's per-step ``{'loss': ...}`` dictionaries,
tqdm bars, FutureWarnings and DeprecationWarnings, bm25s DEBUG lines, logging handlers bound
to ``sys.stderr`` when a library was imported, C extensions, and child processes (the local
Prefect server) that inherit the descriptors. Pointing both descriptors at a log file
(``os.dup2``) catches all of them, whoever writes. Our own lines go to duplicates of the
original descriptors: ``out``/``err`` here, and coevo's rich consoles (``coevo.cli.common``)
are bound to them while the redirection is active.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path
from types import TracebackType
from typing import IO, Any

LOG_DIR = Path("logs")


def new_log_path(command: str, folder: Path = LOG_DIR) -> Path:
    """``logs/coevo-<command>-<YYYYmmdd-HHMMSS>.log``, created empty (``-2``, ``-3`` when runs start in one second)."""
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    n = 1
    while True:
        path = folder / f"coevo-{command}-{stamp}{'' if n == 1 else f'-{n}'}.log"
        try:
            path.open("x").close()  # exclusive: two runs started together get two files
            return path
        except FileExistsError:
            n += 1


class LibraryOutputToLog:
    """While active, fd 1 and 2 write to ``log_path``; ``out``/``err`` and coevo's consoles reach the terminal.

    A context manager. An exception leaving it is written to the log with its traceback (the
    one-line error the user sees names the log), then the descriptors and consoles are restored.
    """

    def __init__(self, log_path: Path) -> None:
        self.log_path = Path(log_path)
        self.log: IO[str]
        self.out: IO[str]
        self.err: IO[str]
        self._saved: dict[int, int] = {}
        self._consoles: list[tuple[Any, Any]] = []

    def __enter__(self) -> "LibraryOutputToLog":
        from coevo.cli.common import console, err_console

        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(self.log_path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - closed in __exit__
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # what was written before belongs on the screen
        self.out = self._keep(sys.stdout, 1)
        self.err = self._keep(sys.stderr, 2)
        for fd in (1, 2):
            os.dup2(self.log.fileno(), fd)
        # The consoles resolve sys.stdout/sys.stderr when they print; those now write to the log.
        self._consoles = [(c, c._file) for c in (console, err_console)]
        console.file, err_console.file = self.out, self.err
        return self

    def _keep(self, stream: IO[str], fd: int) -> IO[str]:
        """A stream to the terminal that survives the dup2: a duplicate of ``fd`` when ``stream`` writes
        to it, else ``stream`` itself (a test runner's capture object, untouched by dup2)."""
        try:
            if stream.fileno() != fd:
                return stream
        except (AttributeError, ValueError, OSError):  # io.UnsupportedOperation is both
            return stream
        self._saved[fd] = os.dup(fd)
        return os.fdopen(self._saved[fd], "w", buffering=1, encoding=stream.encoding, errors=stream.errors,
                         closefd=False)

    def note(self, line: str) -> None:
        """A line of ours in the log, so that its library output can be placed (which step wrote it)."""
        self.log.write(f"[coevo {time.strftime('%H:%M:%S')}] {line}\n")

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        # Restore the descriptors first: an interrupt must print its line on the terminal at once.
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        for fd, saved in self._saved.items():
            os.dup2(saved, fd)
        for console, file in self._consoles:
            console.file = file
        for stream in (self.out, self.err):
            if stream not in (sys.stdout, sys.stderr):
                stream.close()  # closefd=False: the duplicate is closed below
        for saved in self._saved.values():
            os.close(saved)
        self._saved.clear()
        if isinstance(exc, Exception):  # not Ctrl-C/SIGTERM: those only print where they stopped
            self.log.write("".join(traceback.format_exception(exc_type, exc, tb)))
        self.log.close()
