"""Run the test suite one file per pytest process, then print one closing line.

Why: pyserini's JVM uses SIGSEGV internally (safepoints, null checks) and relies on its own
signal handler. In one long pytest process, native libraries loaded by later tests (Ray's
core worker, torch, faiss) re-install fatal-signal handlers, and the JVM started by an
earlier test then dies with SIGSEGV (measured: exit 139 inside tests/test_lucene.py after
~370 tests, never when the file runs alone). One process per file keeps native state apart.

    .venv/bin/python tests/run_by_file.py [pytest args...]     (what `make test` runs)

Every file gets one line (its pytest summary and exit status; a failing file's output
follows it), then a line naming the failing files, then the closing line, e.g.
``412 passed, 3 failed, 7 skipped; failing: test_x.py (2 failed), test_y.py (crashed: exit 3)``.
A file fails when pytest exits non-zero, and then it always counts in the closing line's
failures, by name, even when pytest could not print its counts:

- a file that **crashes** (killed by a signal such as SIGSEGV, ``os._exit``, pytest-timeout's
  thread method ending the process) prints no pytest summary: its tests are counted from
  pytest's progress characters (``.`` passed, ``F``/``E`` failed, ``s`` skipped) and the test
  that was running when it died counts as one more failure;
- a file that runs past the **per-file timeout** is killed with its whole process group
  (SIGTERM, then SIGKILL after 5 s) and counted the same way. The timeout is
  ``COEVO_TEST_FILE_TIMEOUT_S`` seconds (default 1800, above pytest-timeout's 1200 s per test
  in pyproject.toml, so a single hung test still fails with its own name and stack dump
  first); ``0`` disables it;
- exit status 5 (no tests collected) passes only for a file listed in ``EMPTY_ON_PURPOSE``
  below (a file meant to hold no tests), or when pytest reports tests it *deselected* (the
  caller's own ``-m``/``-k`` chose none of the file's tests, e.g. ``-m "not slow"`` on a file
  marked slow as a whole). A file that silently lost its tests fails as "no tests collected".

Files run ``COEVO_TEST_JOBS`` at a time (default 2: most of a file's time is spent waiting on
subprocesses, servers and JVM start-up, so two files share 2 cores well; 1 runs them one by
one). A long file in ``SPLIT_BY_TEST`` runs as several processes, so that its minutes spread over
both slots: each slow test alone (``file.py::test_x``), the tests sharing one of its module-scoped
fixtures together (``file.py::[fixture]``), the rest together (``file.py::[fast]``).
The longest units start first (their seconds as measured in ``tests/times.json``; a unit not
measured yet starts after them, by name), so that no long unit starts last and ends the run
alone. ``COEVO_TEST_RECORD_TIMES=1`` writes the seconds of the units the run measured back to that
file (a unit the ``-m``/``-k`` filter deselected whole keeps its last figure).
Each job slot has its own ``PREFECT_HOME`` (a temporary folder: two Prefect servers on one SQLite
database lock each other out) and its own Prefect server, started once at the beginning
(``prefect server start``) and named to the slot's tests by ``COEVO_TEST_PREFECT_API_URL``: a
flow test points its flows and commands at it (``conftest.shared_prefect_api``) instead of starting
a server of its own (~15 s each on 2 cores, and some files start dozens). A test about the
server a command starts for itself (Ctrl-C and kill leave none behind) keeps its own.

Ctrl-C stops the running files (SIGINT to their process groups, SIGKILL after 10 s) and the run.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parent
TIMEOUT_ENV = "COEVO_TEST_FILE_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 1800.0
JOBS_ENV = "COEVO_TEST_JOBS"
DEFAULT_JOBS = 2
# Long files run as several processes (split_units): each slow test, each group sharing a module fixture,
# the fast rest.
SPLIT_BY_TEST = ("test_bench_smoke.py", "test_hardening.py", "test_terminal.py", "test_cogr_train.py",
                 "test_train_wrappers.py")
# Seconds per unit measured by a whole run (COEVO_TEST_RECORD_TIMES=1): the longest start first.
TIMES_FILE = TESTS / "times.json"
RECORD_ENV = "COEVO_TEST_RECORD_TIMES"
PREFECT_API_ENV = "COEVO_TEST_PREFECT_API_URL"  # the slot's Prefect server (conftest.shared_prefect_api)
# Test files that are meant to collect no tests (pytest exit status 5 is then a pass), by file
# name, e.g. "test_placeholder.py". Any other file that collects nothing fails.
EMPTY_ON_PURPOSE: tuple[str, ...] = ()

COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected)\b")
SUMMARY = re.compile(r"\b(?:passed|failed|skipped|errors?|deselected|xfailed|xpassed|warnings?|no tests ran)\b"
                     r".* in \d+(?:\.\d+)?s\b")
PROGRESS = re.compile(r"^[.FEsxX]+(?:\s+\[\s*\d+%\])?$")
GRACE_S = 5.0
INTERRUPT_GRACE_S = 10.0


@dataclass
class FileResult:
    name: str
    rc: int | None  # None: killed at the timeout
    stdout: str
    stderr: str
    seconds: float
    timeout_s: float | None = None  # the limit the file ran under
    counts: dict[str, int] = field(default_factory=dict)
    summary: str = ""  # pytest's closing line, "" when it printed none
    failing: bool = False
    why: str = ""  # how a failing file failed, for the closing line

    def line(self) -> str:
        if self.rc is None:
            return f"{self.name}: {self.why}, killed"
        tail = self.summary or _last_line(self.stdout) or "no output"
        note = f"; {self.why}" if self.failing and not self.summary else ""
        return f"{self.name}: {tail} (rc={self.rc}){note}"


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1].strip() if lines else ""


def timeout_from_env() -> float | None:
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise SystemExit(f"error: {TIMEOUT_ENV}={raw!r}: expected a number of seconds (0 disables the timeout)")
    return value if value > 0 else None


def jobs_from_env() -> int:
    raw = os.environ.get(JOBS_ENV, "").strip()
    if not raw:
        return DEFAULT_JOBS
    if not raw.isdigit() or int(raw) < 1:
        raise SystemExit(f"error: {JOBS_ENV}={raw!r}: expected a whole number of files to run at a time (1 or more)")
    return int(raw)


@dataclass(frozen=True)
class Unit:
    """What one pytest process runs: a whole file, or some top-level tests of it (``label`` names them)."""

    path: Path
    tests: tuple[str, ...] = ()
    label: str = ""

    @property
    def name(self) -> str:
        return f"{self.path.name}::{self.label}" if self.tests else self.path.name

    def targets(self, root: Path) -> list[str]:
        rel = str(self.path.relative_to(root))
        return [f"{rel}::{t}" for t in self.tests] or [rel]


def _is_slow_mark(node: ast.expr) -> bool:
    """``pytest.mark.slow``, alone or in a list of marks (``pytestmark = [...]``)."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return any(_is_slow_mark(n) for n in node.elts)
    return isinstance(node, ast.Attribute) and node.attr == "slow"


def _shared_fixture(node: ast.stmt) -> bool:
    """``@pytest.fixture(scope="module" | "session")``: a fixture its file's tests share."""
    return isinstance(node, ast.FunctionDef) and any(
        isinstance(d, ast.Call) and any(k.arg == "scope" and isinstance(k.value, ast.Constant)
                                        and k.value.value in ("module", "session") for k in d.keywords)
        for d in node.decorator_list)


def split_units(path: Path) -> list[Unit]:
    """``path``'s top-level tests as units (read with ``ast``, not imported): each slow test alone; the
    tests that take one of the file's module- or session-scoped fixtures together (named after the
    first such fixture, so it is built once); the other tests together as ``[fast]``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    shared = {node.name for node in tree.body if _shared_fixture(node)}
    takes = {node.name: [a.arg for a in node.args.args] for node in tree.body if isinstance(node, ast.FunctionDef)}

    def shared_of(names: list[str], seen: set[str]) -> list[str]:  # through the file's own fixtures too
        found = []
        for name in names:
            if name not in seen:
                seen.add(name)
                found += [name] if name in shared else shared_of(takes.get(name, []), seen)
        return found

    file_slow = any(isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                                                            for t in node.targets) and _is_slow_mark(node.value)
                    for node in tree.body)
    groups: dict[str, list[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            groups.setdefault("[fast]", []).append(node.name)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            fixtures = shared_of([a.arg for a in node.args.args], set())
            slow = file_slow or any(_is_slow_mark(d) for d in node.decorator_list)
            key = f"[{fixtures[0]}]" if fixtures else node.name if slow else "[fast]"
            groups.setdefault(key, []).append(node.name)
    return [Unit(path, tuple(tests), key) for key, tests in groups.items()]


def units_of(paths: list[Path], split: tuple[str, ...] | set[str] = SPLIT_BY_TEST) -> list[Unit]:
    """A unit per file, or :func:`split_units` for a file in ``split`` (a file with no tests stays whole)."""
    units: list[Unit] = []
    for path in paths:
        units.extend((split_units(path) if path.name in split else []) or [Unit(path)])
    return units


def read_times(path: Path = TIMES_FILE) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except FileNotFoundError:
        return {}
    except (ValueError, AttributeError) as err:
        raise SystemExit(f"error: {path}: not a JSON object of unit name -> seconds ({err})")


def run_order(units: list[Unit], times: dict[str, float]) -> list[Unit]:
    """The measured units longest first, then the ones never measured, by name."""
    return sorted(units, key=lambda u: (u.name not in times, -times.get(u.name, 0.0), u.name))


def _progress_counts(stdout: str) -> dict[str, int]:
    """Tests that ran before a crash, from pytest's -q progress characters."""
    chars = "".join(line.split("[")[0].strip() for line in stdout.splitlines() if PROGRESS.match(line.strip()))
    return {"passed": chars.count("."), "failed": chars.count("F") + chars.count("E"), "skipped": chars.count("s")}


def _stop_group(proc: subprocess.Popen, first: int, grace_s: float) -> None:
    """Signal the file's process group (pytest and what it started), SIGKILL it after ``grace_s``."""
    for sig, wait_s in ((first, grace_s), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


RUNNING: set[subprocess.Popen] = set()  # the files' pytest processes, for Ctrl-C
_RUNNING_LOCK = threading.Lock()


def run_file(unit: Unit, root: Path, args: list[str], timeout_s: float | None,
             env: dict[str, str] | None = None) -> FileResult:
    """One pytest process on ``unit``, in a process group of its own; output through files, so a
    grandchild that keeps a pipe open cannot block the runner."""
    command = [sys.executable, "-m", "pytest", "-q", *unit.targets(root), *args]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(command, cwd=root, stdout=out, stderr=err, start_new_session=True, env=env)
        with _RUNNING_LOCK:
            RUNNING.add(proc)
        try:
            rc: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop_group(proc, signal.SIGTERM, GRACE_S)
            rc = None
        except BaseException:  # Ctrl-C: stop the file's tests, then stop the run
            _stop_group(proc, signal.SIGINT, INTERRUPT_GRACE_S)
            raise
        finally:
            with _RUNNING_LOCK:
                RUNNING.discard(proc)
        seconds = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        return FileResult(unit.name, rc, out.read().decode("utf-8", "replace"), err.read().decode("utf-8", "replace"),
                          seconds, timeout_s)


def judge(result: FileResult, empty_ok: tuple[str, ...] | set[str] = EMPTY_ON_PURPOSE) -> FileResult:
    """Counts, and whether (and how) the file failed."""
    tail = _last_line(result.stdout)
    if SUMMARY.search(tail):
        result.summary = tail
        counts: dict[str, int] = {}
        for n, key in COUNT.findall(tail):
            key = "errors" if key.startswith("error") else key
            counts[key] = counts.get(key, 0) + int(n)
    else:
        counts = _progress_counts(result.stdout)
    result.counts = counts
    rc = result.rc
    if rc == 0:
        return result
    if rc == 5 and (result.name in empty_ok or counts.get("deselected")):
        return result
    result.failing = True
    if rc is None:
        result.why = f"timed out after {result.timeout_s:g}s"
    elif not result.summary:
        result.why = f"crashed: signal {_signal_name(-rc)}" if rc < 0 else f"crashed: exit {rc}"
    elif rc == 5:
        result.why = "no tests collected"
    else:
        found = [f"{counts['failed']} failed"] if counts.get("failed") else []
        if counts.get("errors"):
            found.append(f"{counts['errors']} error{'s' if counts['errors'] > 1 else ''}")
        result.why = ", ".join(found) or f"exit {rc}"
    # the test running at the crash or timeout, or a non-zero exit with no failure counted
    if not result.summary or not (counts.get("failed") or counts.get("errors")):
        counts["failed"] = counts.get("failed", 0) + 1
    return result


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def prefect_servers(envs: list[dict[str, str]], scratch: Path) -> Iterator[None]:
    """A Prefect server per job slot, in the slot's PREFECT_HOME, for the whole run: each env gets its
    URL as ``COEVO_TEST_PREFECT_API_URL`` (the tests wait until it answers). No UI; the services stay
    on: the task run recorder writes the task runs that the flow tests read back."""
    prefect = Path(sys.executable).parent / "prefect"
    procs: list[subprocess.Popen] = []
    logs = []
    try:
        for i, env in enumerate(envs):
            if not prefect.exists():  # not run from the environment's Python: each test starts its own
                break
            port = _free_port()
            env[PREFECT_API_ENV] = f"http://127.0.0.1:{port}/api"
            log = open(scratch / f"prefect-server-{i}.log", "w")
            logs.append(log)
            procs.append(subprocess.Popen(
                [str(prefect), "server", "start", "--host", "127.0.0.1", "--port", str(port), "--no-ui"],
                env={**env, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True))
        yield
    finally:
        for proc in procs:
            _stop_group(proc, signal.SIGTERM, GRACE_S)
        for log in logs:
            log.close()


def main(args: list[str], tests_dir: Path = TESTS, empty_ok: tuple[str, ...] | set[str] = EMPTY_ON_PURPOSE,
         split: tuple[str, ...] | set[str] = SPLIT_BY_TEST, times_file: Path = TIMES_FILE,
         servers: bool = True) -> int:
    """Every tests_dir/test_*.py in its own pytest process (cwd: tests_dir's parent), or in the units of
    :func:`split_units` for a file in ``split``; 1 if any failed. ``servers``: a Prefect server per job
    slot (:func:`prefect_servers`)."""
    timeout_s = timeout_from_env()
    jobs = jobs_from_env()
    record = os.environ.get(RECORD_ENV, "").strip() not in ("", "0")
    times = read_times(times_file)
    units = run_order(units_of(sorted(tests_dir.glob("test_*.py")), split), times)
    seconds: dict[str, float] = {}
    totals = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    failing: list[FileResult] = []
    started = time.perf_counter()
    print_lock = threading.Lock()

    with tempfile.TemporaryDirectory(prefix="coevo-tests-") as scratch, contextlib.ExitStack() as stack:
        slots = [{**os.environ, "PREFECT_HOME": str(Path(scratch) / f"prefect-home-{i}")} for i in range(jobs)]
        if servers:
            stack.enter_context(prefect_servers(slots, Path(scratch)))
        free_slots = list(range(len(slots)))

        def one_file(unit: Unit) -> None:
            with print_lock:
                slot = free_slots.pop()
            try:
                result = judge(run_file(unit, tests_dir.parent, args, timeout_s, env=slots[slot]), empty_ok)
            finally:
                with print_lock:
                    free_slots.append(slot)
            with print_lock:  # one file's lines together, as each file ends
                if any(result.counts.get(k) for k in ("passed", "failed", "skipped", "errors")):
                    seconds[unit.name] = result.seconds  # not a unit the -m/-k filter deselected whole
                for key in totals:
                    totals[key] += result.counts.get(key, 0)
                print(result.line(), flush=True)
                if result.failing:
                    failing.append(result)
                    print(result.stdout[-20000:], result.stderr[-5000:], sep="\n", flush=True)

        pool = ThreadPoolExecutor(max_workers=jobs)
        try:
            for future in [pool.submit(one_file, u) for u in units]:
                future.result()
        except BaseException:  # Ctrl-C: stop every running file, start no other
            pool.shutdown(wait=False, cancel_futures=True)
            with _RUNNING_LOCK:
                running = list(RUNNING)
            for proc in running:
                _stop_group(proc, signal.SIGINT, INTERRUPT_GRACE_S)
            raise
        pool.shutdown()
    failing.sort(key=lambda r: r.name)
    names = [r.name for r in failing]
    slowest = sorted(seconds.items(), key=lambda kv: -kv[1])[:5]
    print("slowest: " + ", ".join(f"{name} {s:.0f}s" for name, s in slowest))
    if record:  # the units this run measured; the others keep their last measurement
        names = {u.name for u in units}
        kept = {k: v for k, v in times.items() if k in names and k not in seconds}
        times_file.write_text(json.dumps({k: round(v, 1) for k, v in sorted({**kept, **seconds}.items())},
                                         indent=1) + "\n")
        print(f"wrote {len(seconds)} units' seconds to {times_file} ({len(kept)} kept from the last run)")
    print(f"files: {len(failing)} failing {names if names else ''}; {time.perf_counter() - started:.0f}s")
    closing = f"{totals['passed']} passed, {totals['failed'] + totals['errors']} failed, {totals['skipped']} skipped"
    if failing:
        closing += "; failing: " + ", ".join(f"{r.name} ({r.why})" for r in failing)
    print(closing, flush=True)
    return 1 if failing else 0


if __name__ == "__main__":
    # SIGTERM (a CI runner cancelling the job) stops the running file's process group too.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sys.exit(main(sys.argv[1:]))
