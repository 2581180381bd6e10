"""Shared CLI helpers: one-line errors, interrupts, and servers that die with the CLI.

Every command runs its body inside :func:`user_errors`, the single top-level handler: an
expected failure (bad params or data, a file that is missing, unreadable, read-only or on a
full disk, a corrupt checkpoint, a run folder in use) becomes one line on stderr and a
non-zero exit; ``--verbose`` (or ``COEVO_VERBOSE=1``) adds the traceback. Ctrl-C (SIGINT)
exits 130 and SIGTERM 143, after one line saying what was interrupted and how to resume.

Servers the CLI starts (the local Prefect server, ``coevo ui``'s MLflow and Prefect UIs) run
each in a session (process group) of its own, so a Ctrl-C in the terminal reaches only the
CLI, which then shuts them down in order. A *watchdog* process holds the read end of a pipe
whose write end only the CLI has: when the CLI ends, however it ends (``kill -9`` included),
the kernel closes the pipe and the watchdog kills every registered process group (SIGTERM,
then SIGKILL after 5 s). Unlike a parent-death signal (``PR_SET_PDEATHSIG``) this reaches the
servers' own children too (uvicorn workers, MLflow's huey consumers), does not fire when
the thread that started a server ends, and works beyond Linux.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from coevo.interrupts import interrupt_acted_on, logging_lock_held

console = Console()
err_console = Console(stderr=True)

VERBOSE_ENV = "COEVO_VERBOSE"
EXIT_USAGE = 2      # bad params, bad data, a missing input: fix the input
EXIT_FAILURE = 1    # the environment failed (disk, permissions, a corrupt file, a bug)
EXIT_INTERRUPT = 128


# ----------------------------------------------------------------------------- interrupts
class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that the same clean-up as for Ctrl-C runs."""

    signum = signal.SIGTERM


class _Interrupts:
    """The first SIGINT/SIGTERM of this command, and whether :func:`user_errors` handles it now."""

    REPEAT_S = 2.0

    def __init__(self) -> None:
        self.signum: int | None = None
        self.handled = False
        self.repeater: threading.Thread | None = None

    def on_signal(self, signum: int, _frame: Any) -> None:
        if self.handled:
            if signum == signal.SIGINT:  # a second Ctrl-C while cleaning up: leave now (the watchdog stops servers)
                os._exit(EXIT_INTERRUPT + signal.SIGINT)
            return
        if self.signum is None:
            self.signum = signum
            self._start_repeater()
        if logging_lock_held():  # raising inside logging's lock-taking would leave the lock held
            return  # (coevo.interrupts); the repeater raises again in REPEAT_S
        raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()

    def _start_repeater(self) -> None:
        """Raise the interrupt again every few seconds until the main thread acts on it.

        A signal handler's exception is lost when it lands in a ``__del__`` or a callback whose
        errors are ignored ("Exception ignored in ..."): without a repeat, a Ctrl-C could be
        swallowed and the run would go on.
        """
        import _thread

        def repeat() -> None:
            while True:
                time.sleep(self.REPEAT_S)
                if self.handled or self.signum is None or interrupt_acted_on():
                    return
                _thread.interrupt_main(self.signum)

        self.repeater = threading.Thread(target=repeat, name="coevo-interrupt-repeater", daemon=True)
        self.repeater.start()


_interrupts = _Interrupts()


def interrupt_handled() -> None:
    """A command caught the interrupt on purpose (`coevo ui` stops on Ctrl-C): stop repeating it."""
    _interrupts.handled = True


def signal_number(exc: BaseException) -> int:
    """SIGINT for Ctrl-C, SIGTERM for a termination (ours or Prefect's TerminationSignal)."""
    if isinstance(exc, Terminated):
        return signal.SIGTERM
    if type(exc).__name__ == "TerminationSignal":  # prefect.exceptions: the flow engine's SIGTERM bridge
        return int(getattr(exc, "signal", signal.SIGTERM))
    if _interrupts.signum is not None:
        return _interrupts.signum
    return signal.SIGINT


def _is_interrupt(exc: BaseException) -> bool:
    return isinstance(exc, KeyboardInterrupt) or type(exc).__name__ == "TerminationSignal"


@contextlib.contextmanager
def _interrupt_handlers() -> Iterator[None]:
    """SIGINT and SIGTERM raise in the main thread for the block (then the old handlers return)."""
    global _interrupts
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _interrupts = _Interrupts()
    previous = {sig: signal.signal(sig, _interrupts.on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def resume_command() -> str:
    """The command line of this process as a user would type it again."""
    import shlex

    program = "coevo" if Path(sys.argv[0]).name == "coevo" else sys.argv[0]
    return " ".join([program, *(shlex.quote(a) for a in sys.argv[1:])])


# ------------------------------------------------------------------------- one-line errors
_CHECKPOINT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")


def _checkpoint_file(exc: BaseException) -> str | None:
    """The checkpoint file a loader was reading when ``exc`` was raised (innermost frame first).

    safetensors reports a truncated file as "invalid header length" without its path; the
    path is still a local variable of the frame that opened it.
    """
    tb = exc.__traceback__
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        for value in frame.f_locals.values():
            if isinstance(value, (str, os.PathLike)):
                text = os.fspath(value)
                if isinstance(text, str) and text.endswith(_CHECKPOINT_SUFFIXES) and os.path.isfile(text):
                    return text
    return None


def _is_corrupt_checkpoint(exc: BaseException) -> bool:
    name = type(exc).__name__
    text = str(exc)
    return name == "SafetensorError" or (
        isinstance(exc, (RuntimeError, OSError, ValueError))
        and any(s in text for s in ("invalid header length", "Error while deserializing header",
                                    "failed finding central directory", "PytorchStreamReader failed"))
    )


_SPACE = "free some space and run the command again (finished steps are kept)"
# How a full disk reads when a library wraps it: safetensors' Rust IoError, torch's stream writer.
_SPACE_TEXTS = ("No space left on device", "StorageFull", "os error 28", "Disk quota exceeded")


def _out_of_space(exc: BaseException) -> bool:
    """Whether a full disk (or quota) is the cause anywhere in ``exc``'s chain."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(text in str(current) for text in _SPACE_TEXTS):
            return True
        current = current.__cause__ or current.__context__
    return False
_ERRNO_HINTS = {
    errno.ENOSPC: _SPACE,
    errno.EDQUOT: _SPACE,
    errno.EROFS: "run from a writable copy of the project, or point the output elsewhere",
    errno.EACCES: "check the permissions of the path, or point the output elsewhere",
    errno.EISDIR: "a file was expected here",
    errno.ENOTDIR: "a part of the path is a file, a folder was expected",
}


def describe_os_error(exc: OSError) -> str:
    """``<path>: <what went wrong>; <what to do>`` for an OSError (its own message without errno)."""
    if exc.errno is None or not exc.strerror:
        return str(exc.args[0] if len(exc.args) == 1 else exc)
    what = exc.strerror
    hint = _ERRNO_HINTS.get(exc.errno)
    if hint:
        what = f"{what}; {hint}"
    where = exc.filename
    if where is not None and exc.filename2 is not None:
        where = f"{exc.filename} -> {exc.filename2}"
    return f"{where}: {what}" if where is not None else what


def _first_line(exc: BaseException, empty: str | None = None) -> str:
    """The first line of ``exc``'s message (``empty``, else its type's name, when it has none)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__ if empty is None else empty])[0]


def _checkpoint_prefix(exc: BaseException) -> str:
    """``"<checkpoint file>: "`` when a frame of ``exc`` was reading or writing one, else ``""``."""
    path = _checkpoint_file(exc)
    return f"{path}: " if path else ""


def one_line(exc: BaseException) -> tuple[str, int]:
    """(the message a user sees, the exit code) for an exception that ends a command."""
    import yaml

    from coevo.config import ParamsError
    from coevo.orchestration.lock import RunLocked

    if isinstance(exc, (ParamsError, RunLocked)):
        return str(exc), EXIT_USAGE
    if type(exc).__name__ == "NonFiniteTraining":  # coevo.train.common (imports torch): the phase diverged
        return str(exc), EXIT_FAILURE
    if _out_of_space(exc) and not (isinstance(exc, OSError) and exc.strerror):
        # a library's wrapped write error (it would read as a corrupt checkpoint): the disk is the cause
        return f"{_checkpoint_prefix(exc)}no space left on device ({_first_line(exc)}); {_SPACE}", EXIT_FAILURE
    if _is_corrupt_checkpoint(exc):
        return (f"{_checkpoint_prefix(exc)}corrupt or truncated checkpoint ({_first_line(exc)}); delete it and run "
                "again to recompute the step that wrote it"), EXIT_FAILURE
    if isinstance(exc, yaml.YAMLError):
        mark = getattr(exc, "problem_mark", None)
        where = f"{mark.name}: line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        return f"{where}not valid YAML: {problem}", EXIT_USAGE
    if isinstance(exc, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
        return describe_os_error(exc), EXIT_USAGE
    if isinstance(exc, OSError):
        return describe_os_error(exc), EXIT_FAILURE
    if isinstance(exc, KeyError):
        return str(exc.args[0] if exc.args else exc), EXIT_USAGE
    if isinstance(exc, ValueError):
        return str(exc), EXIT_USAGE
    return f"{type(exc).__name__}: {_first_line(exc, '')}", EXIT_FAILURE


def _quick_teardown() -> None:
    """Make the interpreter's exit fast after an interrupt.

    With torch, transformers and a model loaded, the garbage collections Python runs while
    it tears down (after the atexit handlers that stop the servers) take seconds (measured
    5-9 s on 2 cores). Freezing the heap moves every object into the permanent generation,
    which those collections skip; memory is returned to the system at exit anyway.
    """
    import gc

    gc.freeze()


def verbose_wanted(verbose: bool = False) -> bool:
    return verbose or os.environ.get(VERBOSE_ENV, "") not in ("", "0", "false", "False")


@contextlib.contextmanager
def user_errors(verbose: bool = False, interrupted: Callable[[], str] | None = None) -> Iterator[None]:
    """The one top-level handler of every command.

    An exception becomes one line (``error: ...``) and a non-zero exit: 2 for bad input
    (params, data, a missing file), 1 for a failing environment (read-only or full disk,
    permissions, a corrupt checkpoint) or an unexpected error. Ctrl-C exits 130, SIGTERM 143,
    after ``interrupted()``'s line (what was interrupted and how to resume). ``verbose`` (or
    COEVO_VERBOSE=1) prints the traceback as well.
    """
    try:
        with _interrupt_handlers():
            try:
                yield
            except BaseException:
                _interrupts.handled = True  # a late signal must not break the handling below
                raise
    except (typer.Exit, typer.Abort, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - the one place that turns everything into one line
        import click
        from rich.markup import escape

        if isinstance(exc, click.exceptions.ClickException):
            raise
        show_trace = verbose_wanted(verbose)
        if _is_interrupt(exc):
            signum = signal_number(exc)
            if show_trace:
                err_console.print_exception(show_locals=False)
            try:
                line = interrupted() if interrupted is not None else ""
            except Exception as inner:  # noqa: BLE001 - the interrupt line must not fail
                line = f"(could not tell what finished: {inner})"
            name = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"
            err_console.print(f"[yellow]interrupted[/] ({name}){': ' + escape(line) if line else ''}",
                              highlight=False, soft_wrap=True)
            _quick_teardown()
            raise typer.Exit(code=EXIT_INTERRUPT + signum) from None
        if not isinstance(exc, Exception):
            raise
        message, code = one_line(exc)
        if show_trace:
            err_console.print_exception(show_locals=False)
        hint = "" if show_trace or code == EXIT_USAGE else "  (--verbose or COEVO_VERBOSE=1 shows the traceback)"
        err_console.print(f"[bold red]error:[/] {escape(message)}{hint}", highlight=False, soft_wrap=True)
        raise typer.Exit(code=code) from None


# ------------------------------------------------------------------------- child servers
_WATCHDOG = r"""
import os, signal, sys, time
groups = set()
while True:
    line = sys.stdin.readline()   # "<pgid>" watches a process group, "-<pgid>" forgets it
    if not line:
        break                     # EOF: the CLI that started us is gone, however it ended
    try:
        n = int(line)
    except ValueError:
        continue
    if n < 0:
        groups.discard(-n)
    else:
        groups.add(n)

def alive(group):
    try:
        os.killpg(group, 0)
        return True
    except OSError:
        return False

for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
    live = [g for g in groups if alive(g)]
    for g in live:
        try:
            os.killpg(g, sig)
        except OSError:
            pass
    deadline = time.monotonic() + grace
    while live and time.monotonic() < deadline:
        time.sleep(0.05)
        live = [g for g in live if alive(g)]
"""


class Watchdog:
    """A small process that kills the registered process groups once this process is gone."""

    _instance: "Watchdog | None" = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _WATCHDOG],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C (or a kill of our process group) must not reach it
            text=True, bufsize=1,
        )
        self.pid = self.proc.pid

    @classmethod
    def get(cls) -> "Watchdog":
        with cls._lock:
            if cls._instance is None or cls._instance.proc.poll() is not None:
                cls._instance = cls()
            return cls._instance

    def _send(self, line: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()

    def watch(self, pgid: int) -> None:
        self._send(str(pgid))

    def forget(self, pgid: int) -> None:
        self._send(str(-pgid))


def spawn_server(args: Sequence[str], **popen: Any) -> subprocess.Popen:
    """Start a server in a session of its own, killed with its whole group when the CLI ends."""
    watchdog = Watchdog.get()
    proc = subprocess.Popen(list(args), start_new_session=True, **popen)
    watchdog.watch(proc.pid)  # its pid is its process group id (setsid)
    return proc


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except OSError:
        return False


def stop_server(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM to the server's whole process group, SIGKILL to what is left after ``grace_s``."""
    pgid = proc.pid
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if not group_alive(pgid) and proc.poll() is not None:
            break
        with contextlib.suppress(OSError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader, so that only live members keep the group
            if proc.returncode is not None and not group_alive(pgid):
                break
            time.sleep(0.05)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=1)
    if Watchdog._instance is not None:
        Watchdog._instance.forget(pgid)
