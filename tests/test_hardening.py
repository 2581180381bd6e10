"""Hardening (issue 14): clean interrupts, one run per run folder, no diverged checkpoints,
one-line errors, checks before any work, no orphaned servers.

Each case asserts the exit code, the one-line message (naming the file, row, key or phase)
and that nothing written before is lost or half-written. The interrupt and kill cases run
the real CLI in a subprocess with the `tiny` model; one uninterrupted run (module fixture)
is the reference the interrupted-then-resumed run must equal.
"""

from __future__ import annotations

import errno
import http.server
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
import typer
from typer.testing import CliRunner

from coevo.cli import app
from coevo.cli.common import one_line, user_errors
from conftest import REPO_ROOT, SAMPLE_DIR, make_project, shared_prefect_env

runner = CliRunner()
COEVO = str(Path(sys.executable).parent / "coevo")
RUN_DIR = Path("data/models/cogr/toy")
INTERRUPT_LIMIT_S = 10.0


def _flat(text: str) -> str:
    return " ".join(text.split())


def invoke(*args: str):
    return runner.invoke(app, list(args))


# --------------------------------------------------------------------------- subprocess helpers
def cli_env(project: Path, own_prefect: bool = False) -> dict[str, str]:
    """A user's environment in ``project``; flows go to the job slot's Prefect server when there is one,
    unless ``own_prefect``: the command starts its own, as a user's does (what the interrupt tests watch)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(PREFECT_HOME=str(project / ".prefect_home"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PREFECT_SERVER_ANALYTICS_ENABLED="false", TOKENIZERS_PARALLELISM="false", COLUMNS="200")
    return env if own_prefect else {**env, **shared_prefect_env()}


def start_cli(project: Path, *args: str, log: str = "cli.log", own_prefect: bool = False) -> subprocess.Popen:
    """`coevo ...` in ``project``, in a session of its own (a terminal's Ctrl-C goes to its group)."""
    return subprocess.Popen([COEVO, *args], cwd=project, env=cli_env(project, own_prefect), start_new_session=True,
                            stdout=open(project / log, "w"), stderr=subprocess.STDOUT)


def stamp_mtime(project: Path, phase: str) -> int:
    path = project / RUN_DIR / "stamps" / f"{phase}.json"
    return path.stat().st_mtime_ns if path.exists() else 0


def phase_started(project: Path, phase: str):
    """A predicate: ``phase`` is running in the run started now (its stamp was rewritten since)."""
    before = stamp_mtime(project, phase)
    return lambda: stamp_mtime(project, phase) > before and stamp_state(project, phase) == "running"


def stamp_state(project: Path, phase: str) -> str | None:
    path = project / RUN_DIR / "stamps" / f"{phase}.json"
    try:
        return json.loads(path.read_text()).get("state")
    except (OSError, ValueError):
        return None


def wait_for(predicate, what: str, proc: subprocess.Popen | None = None, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the CLI exited ({proc.returncode}) before {what}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_gone(procs: list[psutil.Process], timeout: float = 10.0) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    left = alive(procs)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = alive(left)
    return left


def interrupt_during(project: Path, phase: str, sig: int, delay: float) -> dict:
    """Start `coevo run cogr`, send ``sig`` once ``phase`` runs; return exit code, seconds, output, survivors."""
    started = phase_started(project, phase)
    cli = start_cli(project, "run", "cogr", log=f"{phase}.log", own_prefect=True)
    wait_for(started, f"phase {phase} to start", cli)
    time.sleep(delay)
    children = psutil.Process(cli.pid).children(recursive=True)
    sent = time.monotonic()
    if sig == signal.SIGINT:
        os.killpg(cli.pid, sig)  # what a terminal's Ctrl-C does: the whole foreground group
    else:
        cli.send_signal(sig)
    code = cli.wait(timeout=120)
    seconds = time.monotonic() - sent
    left = wait_gone(children)
    print(f"\n{signal.Signals(sig).name} during {phase}: exit {code} after {seconds:.1f}s", flush=True)
    return {"code": code, "seconds": seconds, "output": (project / f"{phase}.log").read_text(), "children": children,
            "left": left}


def flow_run_states(project: Path) -> list[str]:
    with sqlite3.connect(project / ".prefect_home" / "prefect.db") as db:
        return [row[0] for row in db.execute("select state_type from flow_run order by start_time")]


def results(project: Path) -> object:
    """The toy run's results table (every row's metrics), chosen phase and comparisons, without the
    wall-clock fields that differ between two identical runs. (metrics.json at the project root is
    shared by CoGR's data sets, so the reference project's holds the last one finished.)"""
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items()
                    if "seconds" not in k and k not in ("tokens_per_s", "rollouts_per_min", "generation_share")}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    summary = json.loads((project / ".coevo/steps/cogr/toy/summary.json").read_text())
    return strip({k: summary[k] for k in ("rows", "best_phase", "evaluation")})


def phase_outputs(project: Path) -> dict[str, object]:
    """Every keyword file and adapter weight file of the finished phases, by relative path."""
    root = project / RUN_DIR / "phases"
    out: dict[str, object] = {}
    for path in sorted(root.rglob("*")):
        if path.name == "keywords.json":
            out[str(path.relative_to(root))] = json.loads(path.read_text())
        elif path.suffix == ".safetensors":
            out[str(path.relative_to(root))] = path.read_bytes()
    return out


# ------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted tiny CoGR run, started in a fresh project together with a second run on
    another data set (both must finish: the MLflow database is created once); while it holds
    the run folder, a second `coevo run` and a `coevo train` on the same data set are refused."""
    project = make_project(tmp_path_factory.mktemp("reference"))
    first = start_cli(project, "run", "cogr", log="first.log")
    other = start_cli(project, "run", "cogr", "--set", "data.dataset=toy2", "--set", "cogr.rounds=0", log="other.log")
    holder = project / "data/models/cogr/toy.lock.json"
    wait_for(holder.exists, "the first run to take its lock", first)
    refused = {}
    for name, args in (("run", ("run", "cogr")), ("train", ("train", "cogr", "-q"))):
        started = time.monotonic()
        proc = subprocess.run([COEVO, *args], cwd=project, env=cli_env(project), capture_output=True, text=True,
                              timeout=300)
        refused[name] = {"code": proc.returncode, "output": proc.stdout + proc.stderr,
                         "seconds": time.monotonic() - started}
    holder_pid = json.loads(holder.read_text())["pid"] if holder.exists() else None
    codes = first.wait(timeout=1200), other.wait(timeout=1200)
    return {"project": project, "codes": codes, "refused": refused, "holder_pid": holder_pid, "first_pid": first.pid}


# ------------------------------------------------------------- interrupts (real CLI, tiny model)
@pytest.mark.slow
def test_ctrl_c_and_kill_stop_cleanly_and_the_resumed_run_equals_an_uninterrupted_one(reference, tmp_path):
    project = make_project(tmp_path / "interrupted")
    measured = {}

    # Ctrl-C during SFT: exit 130 within 10 s, one line naming the last finished phase and the resume command.
    sft = interrupt_during(project, "00_sft", signal.SIGINT, delay=1.0)
    measured["sft"] = sft["seconds"]
    assert sft["code"] == 130, sft["output"]
    assert sft["seconds"] < INTERRUPT_LIMIT_S, sft["seconds"]
    line = [l for l in sft["output"].splitlines() if l.startswith("interrupted")]
    assert len(line) == 1 and "stopped during SFT" in line[0] and "last finished phase: Algorithm 1 seeds (seed)" in \
        line[0] and "resume with: coevo run cogr" in line[0], sft["output"]
    assert "Traceback" not in sft["output"]
    assert not sft["left"], f"processes left after Ctrl-C: {sft['left']}"
    assert stamp_state(project, "seed") == "done" and stamp_state(project, "00_sft") == "running"
    assert not (project / RUN_DIR / "phases" / "00_sft").exists()  # never half-written
    assert not (project / "data/models/cogr/toy.lock.json").exists()  # the lock is released

    # Ctrl-C during GRPO.
    grpo = interrupt_during(project, "01_query", signal.SIGINT, delay=0.5)
    measured["grpo"] = grpo["seconds"]
    assert grpo["code"] == 130, grpo["output"]
    assert grpo["seconds"] < INTERRUPT_LIMIT_S, grpo["seconds"]
    assert "stopped during round 1 query GRPO; last finished phase: SFT (00_sft)" in _flat(grpo["output"])
    assert not grpo["left"], f"processes left after Ctrl-C: {grpo['left']}"
    assert stamp_state(project, "00_sft") == "done"
    # The interrupted flow runs are marked in Prefect (crashed), not left RUNNING.
    states = flow_run_states(project)
    assert states == ["CRASHED", "CRASHED"], states

    # SIGTERM: exit 143, same clean stop.
    term = interrupt_during(project, "02_item", signal.SIGTERM, delay=0.5)
    assert term["code"] == 143 and term["seconds"] < INTERRUPT_LIMIT_S, term
    assert "interrupted (SIGTERM)" in term["output"] and not term["left"]

    # SIGKILL of the CLI: its local Prefect server (and every other child) still goes, within 10 s.
    started = phase_started(project, "02_item")
    cli = start_cli(project, "run", "cogr", log="kill.log", own_prefect=True)
    wait_for(started, "phase 02_item to start", cli)
    children = psutil.Process(cli.pid).children(recursive=True)
    servers = [p for p in children if "uvicorn" in " ".join(p.cmdline())]
    assert servers, [p.cmdline() for p in children]
    cli.kill()
    cli.wait()
    assert not wait_gone(children, 10.0), "a child of the killed CLI survived"

    # The resumed run finishes (taking over the dead run's lock) and equals the uninterrupted one.
    resumed = subprocess.run([COEVO, "run", "cogr"], cwd=project, env=cli_env(project), capture_output=True,
                             text=True, timeout=1200)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    ref = reference["project"]
    assert results(project) == results(ref)
    assert phase_outputs(project) == phase_outputs(ref)
    print(f"\nCtrl-C to exit: SFT {measured['sft']:.1f}s, GRPO {measured['grpo']:.1f}s (limit {INTERRUPT_LIMIT_S}s)")


# ----------------------------------------------------------------------- one run per run folder
@pytest.mark.slow
def test_a_second_run_on_the_same_data_set_is_refused_at_once_naming_the_holder(reference):
    assert reference["holder_pid"] == reference["first_pid"]
    for name, result in reference["refused"].items():
        assert result["code"] == 2, (name, result["output"])
        message = _flat(result["output"])
        assert f"data/models/cogr/toy is in use by `coevo run cogr`, pid {reference['first_pid']}" in message, message
        assert "Traceback" not in result["output"]


@pytest.mark.slow
def test_two_runs_on_different_data_sets_in_a_fresh_project_both_finish(reference):
    project = reference["project"]
    assert reference["codes"] == (0, 0), ((project / "first.log").read_text()[-3000:],
                                         (project / "other.log").read_text()[-3000:])
    with sqlite3.connect(project / "mlflow.db") as db:
        rows = db.execute("select r.status, t.value from runs r join tags t on t.run_uuid = r.run_uuid "
                          "where t.key = 'dataset' order by t.value").fetchall()
    assert rows == [("FINISHED", "toy"), ("FINISHED", "toy2")]


def test_the_run_lock_is_exclusive_and_a_dead_holders_lock_is_taken_over(tmp_path):
    from coevo.orchestration.lock import RunLocked, holder, run_lock

    run_dir = tmp_path / "models" / "cogr" / "toy"
    holder_proc = hold_lock(run_dir, "coevo run cogr")
    try:
        with pytest.raises(RunLocked, match=f"in use by `coevo run cogr`, pid {holder_proc.pid} on "):
            with run_lock(run_dir):
                pass
        assert holder(run_dir)["pid"] == holder_proc.pid
    finally:
        holder_proc.kill()  # like kill -9: no clean-up runs, the sidecar stays
        holder_proc.wait()
    with run_lock(run_dir, "second") as path:  # the kernel dropped the dead holder's flock
        assert holder(run_dir)["command"] == "second" and path.name == "toy.lock"
        with run_lock(run_dir):  # nests within one process
            pass
    assert holder(run_dir) is None


def hold_lock(run_dir: Path, command: str) -> subprocess.Popen:
    """Another process holding the lock of ``run_dir`` (the lock nests within one process)."""
    code = ("import sys, time; from coevo.orchestration.lock import run_lock\n"
            f"with run_lock({str(run_dir)!r}, {command!r}):\n    print('held', flush=True); time.sleep(300)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_cli_commands_refuse_a_held_run_folder_before_any_work(tmp_path, chdir):
    project = make_project(tmp_path / "p")
    chdir(project)
    other = hold_lock(project / RUN_DIR, "coevo run cogr")
    try:
        for args in (("run", "cogr"), ("train", "cogr")):
            result = invoke(*args)
            assert result.exit_code == 2, result.output
            assert f"is in use by `coevo run cogr`, pid {other.pid}" in _flat(result.output)
    finally:
        other.kill()
        other.wait()
    assert not (project / "data" / "processed").exists() and not (project / ".prefect").exists()


OPEN_STORE = {
    # the store alone (what every Tracker does first)
    "store": "from coevo.orchestration.tracking import init_tracking_store\n",
    # a flow started without the CLI (`dvc repro`, a deployment): the tracker of its MLflow run
    "flow": "from coevo.orchestration.tracking import Tracker\n",
}


@pytest.mark.parametrize("opener", sorted(OPEN_STORE))
def test_the_mlflow_database_is_created_once_by_runs_starting_together(tmp_path, opener):
    """Two processes open a fresh sqlite store at the same moment (without the lock this fails with
    `table ... already exists` / `duplicate column name`, reproduced on main); two flows also create
    their experiment at the same moment."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    ready = [tmp_path / f"ready{i}" for i in range(2)]
    call = (f"init_tracking_store({uri!r})" if opener == "store" else
            f"Tracker(uri={uri!r}, artifact_root={str(tmp_path / 'mlruns')!r}, experiment='cogr')")
    code = ("import sys, time\nfrom pathlib import Path\nimport mlflow.tracking\n" + OPEN_STORE[opener] +
            "Path(sys.argv[1]).touch()\n"
            "while not all(Path(p).exists() for p in sys.argv[2:]): time.sleep(0.01)\n"
            f"{call}\nprint('ok')\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(mark), *map(str, ready)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT) for mark in ready]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        assert db.execute("select count(*) from alembic_version").fetchone()[0] == 1


# -------------------------------------------------------------------------------- servers
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("flag", ["--port", "--prefect-port"])
def test_ui_refuses_a_port_out_of_range(flag):
    result = invoke("ui", flag, "70000")
    assert result.exit_code == 2 and "65535" in result.output


def test_ui_refuses_a_port_in_use(tmp_path, chdir):
    project = make_project(tmp_path / "p")
    chdir(project)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = invoke("ui", "--port", str(port))
    assert result.exit_code == 2 and f"--port {port}: the port is in use" in _flat(result.output)


@pytest.mark.slow
def test_stopping_ui_leaves_no_mlflow_or_huey_process(tmp_path):
    project = make_project(tmp_path / "p")
    cli = start_cli(project, "ui", "--port", str(_free_port()), log="ui.log")
    try:
        def huey_started() -> bool:
            kids = psutil.Process(cli.pid).children(recursive=True)
            return any("huey" in " ".join(p.cmdline()) for p in alive(kids))

        wait_for(huey_started, "MLflow's huey consumers", cli, timeout=300)
        wait_for(lambda: "Ctrl-C stops them" in (project / "ui.log").read_text(), "the UI to serve", cli, timeout=300)
        children = psutil.Process(cli.pid).children(recursive=True)
        os.killpg(cli.pid, signal.SIGINT)
        assert cli.wait(timeout=60) == 0, (project / "ui.log").read_text()[-2000:]
        left = wait_gone(children, 10.0)
        assert not left, [" ".join(p.cmdline()) for p in left]
    finally:
        if cli.poll() is None:
            cli.kill()


# ------------------------------------------------------------------------ offline by default
@pytest.mark.parametrize("preset, expected", [(None, ("1", "1")), ("0", ("0", "0")), ("1", ("1", "1"))])
def test_every_command_loads_models_offline_unless_the_user_allows_downloads(preset, expected, monkeypatch):
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "unset-marker")  # recorded, so the test's teardown restores it
        monkeypatch.delenv(name)
    if preset is not None:
        monkeypatch.setenv("HF_HUB_OFFLINE", preset)
    result = runner.invoke(app, ["params", "show", "cogr.lora", "-p", str(REPO_ROOT / "params.yaml")])
    assert result.exit_code == 0, result.output
    assert (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("TRANSFORMERS_OFFLINE")) == expected


# ------------------------------------------------------------------ checks before any work
@pytest.mark.parametrize(
    "override, key",
    [("data.dataset=../../../x", "data.dataset"), ("data.dataset=..", "data.dataset"),
     ("data.root=/tmp/elsewhere", "data.root"), ("data.root=../up", "data.root"),
     ("tracking.artifact_root=runs/../../x", "tracking.artifact_root")],
)
def test_path_like_params_stay_inside_the_project(override, key, tmp_path, chdir):
    project = make_project(tmp_path / "p")
    chdir(project)
    for args in (("run", "cogr"), ("train", "cogr")):
        result = invoke(*args, "--set", override)
        assert result.exit_code == 2, result.output
        assert f"{key}: Value error" in result.output and ("not a name" in result.output or "leaves the project"
                                                          in result.output)
    assert sorted(p.name for p in project.iterdir()) == ["flows", "params.yaml", "tasks", "toy"]  # nothing written


@pytest.mark.parametrize(
    "args, message",
    [
        (("--set", "cogr.lora.target_modules=[q_proj"), "override 'cogr.lora.target_modules': value '[q_proj' is not "
                                                        "valid YAML"),
        (("--set", "cogr.rounds=!!python/object/apply:os.system [ls]"), "override 'cogr.rounds'"),
        (("--set", "cogr.rounds=true"), "cogr.rounds"),
        (("--params", "."), ".: is a directory; expected a params YAML file"),
        (("--set", "tracking.uri=ftp://example.org/mlflow"), "scheme 'ftp' is not a tracking store MLflow supports"),
    ],
)
def test_bad_params_fail_in_one_line_before_any_work(args, message, tmp_path, chdir):
    project = make_project(tmp_path / "p")
    chdir(project)
    result = invoke("run", "cogr", *args)
    assert result.exit_code == 2, result.output
    assert message in _flat(result.output)
    assert "Traceback" not in result.output
    assert not (project / "data").exists() and not (project / "mlflow.db").exists()


def test_duplicate_params_keys_fail_naming_the_file_and_lines(tmp_path, chdir):
    project = make_project(tmp_path / "p")
    chdir(project)
    (project / "dup.yaml").write_text("seed: 1\nseed: 2\n")
    result = invoke("run", "cogr", "-p", "params.yaml", "-p", "dup.yaml")
    assert result.exit_code == 2 and "dup.yaml" in result.output and "duplicate key 'seed'" in _flat(result.output)


def test_a_tracking_server_that_does_not_speak_mlflow_is_refused_before_any_work(tmp_path, chdir):
    project = make_project(tmp_path / "p")
    chdir(project)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        uri = f"http://127.0.0.1:{server.server_address[1]}"
        started = time.monotonic()
        result = invoke("run", "cogr", "--set", f"tracking.uri={uri}")
    finally:
        server.shutdown()
    assert result.exit_code == 2 and "answers HTTP but does not speak MLflow" in _flat(result.output)
    assert time.monotonic() - started < 10
    assert not (project / "data").exists()


def test_a_tracking_file_that_is_not_a_database_is_refused(tmp_path, chdir):
    project = make_project(tmp_path / "p")
    chdir(project)
    (project / "mlflow.db").write_text("not a database\n")
    result = invoke("run", "cogr")
    assert result.exit_code == 2 and "mlflow.db is not an SQLite database" in _flat(result.output)
    assert (project / "mlflow.db").read_text() == "not a database\n" and not (project / "data").exists()


def test_unwritable_outputs_fail_before_any_work(tmp_path, chdir):
    project = make_project(tmp_path / "p")
    chdir(project)
    (project / "data").write_text("a file where data.root should be a folder\n")
    result = invoke("run", "cogr")
    assert result.exit_code == 2 and "data.root data: " in _flat(result.output) and "a folder was expected" in \
        _flat(result.output)
    blocked = tmp_path / "file"
    blocked.write_text("x")
    result = invoke("data", "prepare", "metatool", "--source", str(SAMPLE_DIR / "metatool"), "--out",
                    str(blocked / "out"))
    assert result.exit_code == 2 and f"--out {blocked}/out" in _flat(result.output)


@pytest.mark.parametrize(
    "stage, message",
    [("evaluate", "data/processed/toy: no prepared data set; run the prepare stage first"),
     ("train", "data/processed/toy: no prepared data set; run the prepare stage first"),
     ("validate", "data/processed/toy: no prepared data set; run the prepare stage first")],
)
def test_a_stage_without_its_inputs_is_one_line_before_prefect_starts(stage, message, tmp_path, chdir):
    project = make_project(tmp_path / "p")
    chdir(project)
    result = invoke("run", "cogr", "--stage", stage)
    assert result.exit_code == 2 and message in _flat(result.output), result.output
    assert "Traceback" not in result.output and not (project / ".prefect").exists()


def test_a_failure_inside_the_prefect_flow_is_one_line(tmp_path):
    project = make_project(tmp_path / "p")
    result = subprocess.run([COEVO, "run", "cogr", "--stage", "prepare", "--set", "data.source=no_such_source"],
                            cwd=project, env=cli_env(project), capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stdout + result.stderr
    errors = [l for l in result.stderr.splitlines() if l.strip()]
    # the one error line, then the log holding the library output and the traceback (tests/test_terminal.py)
    assert len([l for l in errors if l.startswith("error:")]) == 1 and "no_such_source" in errors[-2], result.stderr
    assert errors[-1].startswith("details: logs/coevo-run-cogr-"), result.stderr
    assert "Traceback" not in result.stdout + result.stderr and "Crash" not in result.stderr


# --------------------------------------------------------------------------- one-line errors
@pytest.mark.parametrize(
    "exc, expected, code",
    [
        (OSError(errno.ENOSPC, "No space left on device", "data/models/cogr/toy/x.json"),
         "data/models/cogr/toy/x.json: No space left on device; free some space", 1),
        (OSError(errno.EROFS, "Read-only file system", "reports/x.md"), "reports/x.md: Read-only file system; run "
                                                                         "from a writable copy", 1),
        (PermissionError(errno.EACCES, "Permission denied", "mlruns/a"), "mlruns/a: Permission denied", 1),
        (IsADirectoryError(errno.EISDIR, "Is a directory", "params.yaml"), "params.yaml: Is a directory", 2),
        (FileNotFoundError(errno.ENOENT, "No such file or directory", "x/y"), "x/y: No such file or directory", 2),
        (FileNotFoundError("data/processed/toy: no prepared data set"), "data/processed/toy: no prepared data set", 2),
        (KeyError("no such phase"), "no such phase", 2),
    ],
)
def test_os_errors_become_one_line(exc, expected, code):
    message, exit_code = one_line(exc)
    assert expected in message and "\n" not in message and exit_code == code


def _command_that_raises(raise_it) -> typer.Typer:
    tiny = typer.Typer()

    @tiny.command()
    def go(verbose: bool = False) -> None:
        with user_errors(verbose):
            raise_it()

    @tiny.command()
    def other() -> None:  # two commands keep `go` a subcommand
        pass

    return tiny


def test_a_truncated_safetensors_checkpoint_is_named(tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    from coevo.checks import check_safetensors

    path = tmp_path / "phases" / "00_sft" / "adapter_model.safetensors"
    path.parent.mkdir(parents=True)
    save_file({"w": torch.zeros(64, 64)}, str(path))
    check_safetensors(path)
    path.write_bytes(path.read_bytes()[:5])  # truncated mid-header: "invalid header length"
    with pytest.raises(ValueError, match="adapter_model.safetensors: corrupt"):
        check_safetensors(path)

    result = runner.invoke(_command_that_raises(lambda: load_file(str(path))), ["go"])
    assert result.exit_code == 1
    assert f"error: {path}: corrupt or truncated checkpoint" in _flat(result.output)
    assert "Traceback" not in result.output
    verbose = runner.invoke(_command_that_raises(lambda: load_file(str(path))), ["go", "--verbose"])
    assert verbose.exit_code == 1 and "Traceback" in verbose.output


@pytest.mark.slow
def test_a_finished_phase_whose_adapter_was_truncated_runs_again_with_a_notice(tmp_path):
    """Stamps record their outputs' md5 and sizes: a truncated adapter inside a finished phase is
    named in one line and the phase is redone (byte-identical), the phases after it stay done."""
    project = make_project(tmp_path / "p")
    env = cli_env(project)

    def train() -> subprocess.CompletedProcess:
        return subprocess.run([COEVO, "train", "cogr", "--set", "cogr.rounds=1"], cwd=project, env=env,
                              capture_output=True, text=True, timeout=900)

    for stage in ("prepare", "validate"):
        prepared = subprocess.run([COEVO, "run", "cogr", "--stage", stage], cwd=project, env=env, capture_output=True,
                                  text=True, timeout=300)
        assert prepared.returncode == 0, prepared.stdout + prepared.stderr
    first = train()
    assert first.returncode == 0, first.stdout + first.stderr
    run_dir = project / RUN_DIR
    from coevo.config import load_params

    assert load_params(run_dir / "params.yaml").cogr.rounds == 1  # the folder records what it was trained with
    stamp = json.loads((run_dir / "stamps" / "00_sft.json").read_text())
    from coevo.steps import fingerprint

    assert [o["md5"] for o in stamp["outputs"]] == [fingerprint(run_dir / w) for w in stamp["writes"]]
    adapter = run_dir / "phases" / "00_sft" / "generators" / "query" / "adapter" / "adapter_model.safetensors"
    original, later = adapter.read_bytes(), (run_dir / "stamps" / "02_item.json").stat().st_mtime_ns
    adapter.write_bytes(original[:64])

    again = train()
    assert again.returncode == 0, again.stdout + again.stderr
    notices = [line for line in again.stdout.splitlines() if line.startswith("notice")]
    assert notices == [f"notice 00_sft: {adapter.relative_to(project)}: 64 bytes, {len(original):,} when written; "
                       "running it again"], again.stdout
    assert adapter.read_bytes() == original  # redone from scratch, and deterministic
    assert (run_dir / "stamps" / "02_item.json").stat().st_mtime_ns == later  # what reads it stays done
    assert train().stdout.count("notice") == 0  # verified once more, nothing to redo


@pytest.mark.slow
def test_coevo_train_is_a_running_mlflow_run_while_it_trains_and_killed_on_ctrl_c(tmp_path):
    """`coevo train` opens its MLflow run before the first phase: RUNNING, with SFT's val metrics,
    while the next phase trains; Ctrl-C ends it KILLED; `--no-track` opens none."""
    from mlflow.tracking import MlflowClient

    project = make_project(tmp_path / "p")
    env = cli_env(project)
    for stage in ("prepare", "validate"):
        prepared = subprocess.run([COEVO, "run", "cogr", "--stage", stage], cwd=project, env=env, capture_output=True,
                                  text=True, timeout=300)
        assert prepared.returncode == 0, prepared.stdout + prepared.stderr
    started = phase_started(project, "01_query")
    # a query phase that outlasts the checks below (the toy's takes ~2 s: on a busy machine it could end, and log
    # val at step 1, before MLflow answers); Ctrl-C ends it long before its 500 epochs
    cli = start_cli(project, "train", "cogr", "--set", "cogr.grpo.query_epochs=500", log="train.log")
    wait_for(started, "phase 01_query to start", cli)
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    [run] = client.search_runs([client.get_experiment_by_name("cogr").experiment_id])
    assert run.info.status == "RUNNING", run.info
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val/f1")] == [0]  # SFT's, as it ended
    os.killpg(cli.pid, signal.SIGINT)  # a terminal's Ctrl-C
    assert cli.wait(timeout=120) == 130, (project / "train.log").read_text()
    assert client.get_run(run.info.run_id).info.status == "KILLED"

    untracked = subprocess.run([COEVO, "train", "cogr", "-q", "--no-track"], cwd=project, env=env,
                               capture_output=True, text=True, timeout=900)
    assert untracked.returncode == 0 and "MLflow run" not in untracked.stdout, untracked.stdout + untracked.stderr
    assert [r.info.run_id for r in client.search_runs([run.info.experiment_id])] == [run.info.run_id]


def test_disk_full_while_preparing_is_one_line_and_keeps_finished_files(tmp_path, monkeypatch):
    real = pd.DataFrame.to_parquet
    calls = []

    def full_on_second(self, path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(self, path, *args, **kwargs)

    monkeypatch.setattr(pd.DataFrame, "to_parquet", full_on_second)
    out = tmp_path / "mt"
    result = invoke("data", "prepare", "metatool", "--source", str(SAMPLE_DIR / "metatool"), "--out", str(out))
    assert result.exit_code == 1
    assert "No space left on device; free some space" in _flat(result.output) and "Traceback" not in result.output
    assert sorted(p.name for p in out.iterdir()) == ["items.parquet"]  # the finished file; no temp file


def test_a_full_disk_inside_a_library_write_is_named_as_the_cause_not_a_corrupt_checkpoint():
    class SafetensorError(Exception):  # safetensors' Rust error type, as its save_file raises it
        pass

    wrapped = SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                              'message: "No space left on device" })')
    message, code = one_line(wrapped)
    assert "no space left on device" in message and "free some space" in message and code == 1
    assert "corrupt" not in message and "delete it" not in message
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "data/models/cogr/toy/phases/00_sft/x")
        except OSError as cause:
            raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed") from cause
    except RuntimeError as chained:
        message, code = one_line(chained)
    assert "no space left on device" in message and "free some space" in message and code == 1
    # a truncated file read back is still a corrupt checkpoint
    assert "corrupt or truncated" in one_line(SafetensorError("Error while deserializing header: invalid header length"))[0]


def test_an_unexpected_error_is_one_line_with_a_hint():
    result = runner.invoke(_command_that_raises(lambda: (_ for _ in ()).throw(ZeroDivisionError("boom"))), ["go"])
    assert result.exit_code == 1
    assert "error: ZeroDivisionError: boom (--verbose or COEVO_VERBOSE=1 shows the traceback)" in _flat(result.output)


# ------------------------------------------------------------------------ finite training
def test_a_non_finite_loss_stops_training_naming_the_phase_and_knob():
    from coevo.train.common import NonFiniteTraining, stop_on_non_finite

    callback = stop_on_non_finite("phase 01_query", "data/models/cogr/toy/scratch/01_query", "cogr.grpo", 1e30)

    class State:
        global_step = 3

    callback.on_log(None, State(), None, logs={"loss": 0.5, "grad_norm": 1.0})
    for key in ("loss", "grad_norm"):
        with pytest.raises(NonFiniteTraining, match=rf"phase 01_query \(output data/models/cogr/toy/scratch/01_query\): "
                                                    rf"{key} is nan at step 3.*cogr\.grpo\.learning_rate, now 1e\+30"):
            callback.on_log(None, State(), None, logs={key: float("nan")})


def test_each_logged_step_reaches_the_listeners_and_a_failing_listener_does_not_stop_training(caplog):
    """What the open MLflow run charts while a phase trains (coevo.orchestration.flow.LiveSteps): every logged
    step, named by its trainer; a tracking store that fails is warned about once, not raised."""
    from coevo import progress
    from coevo.train.common import report_steps

    class State:
        global_step = 0

    seen = []

    class Recorder(progress.StepListener):
        def training_log(self, series, step, values):
            seen.append((series, step, values))

    class Broken(progress.StepListener):
        def training_log(self, series, step, values):
            raise ConnectionError("tracking store gone")

    callback = report_steps("phase 01_query")
    with progress.listening(Broken()), progress.listening(Recorder()):
        callback.on_train_begin(None, State(), None)
        for step in (1, 2):
            State.global_step = step
            callback.on_log(None, State(), None, logs={"loss": 0.5 * step, "reward": -1, "note": "text", "ok": True})
        callback.on_log(None, State(), None, logs={"train_runtime": 3.0, "train_loss": 0.75})  # the summary
    assert [(series, step) for series, step, _ in seen] == [("01_query", 1), ("01_query", 2)]
    assert [sorted(values) for _, _, values in seen] == [["loss", "reward", "step_seconds"]] * 2
    assert [values["loss"] for _, _, values in seen] == [0.5, 1.0] and all(v["step_seconds"] >= 0 for _, _, v in seen)
    assert [r.getMessage() for r in caplog.records if "live training metrics" in r.getMessage()] == [
        "live training metrics stopped (ConnectionError): tracking store gone"]
    assert [progress.series_name(w) for w in ("phase 00_sft (query generator)", "round_1 DPO", "S1a encoder", "")] == [
        "00_sft_query_generator", "round_1_dpo", "s1a_encoder", "training"]


@pytest.mark.slow
def test_failed_starts_leave_nothing_that_blocks_the_corrected_run(tmp_path, chdir):
    """A diverging SFT (learning rate 1e30) fails naming the knob and never checkpoints the phase; a
    bad generator id fails at once; neither blocks the corrected run into the same run folder."""
    from coevo.config import load_params
    from coevo.methods.base import method_class

    project = make_project(tmp_path / "p")
    chdir(project)
    prepared = invoke("data", "prepare", "metatool", "--source", "toy", "--out", "data/processed/toy")
    assert prepared.exit_code == 0, prepared.output

    bad_model = invoke("train", "cogr", "-q", "--set", "cogr.generator=./no/such/model")
    assert bad_model.exit_code == 2 and "./no/such/model" in bad_model.output, bad_model.output

    diverged = invoke("train", "cogr", "-q", "--set", "cogr.rounds=0", "--set", "cogr.sft.learning_rate=1e30")
    assert diverged.exit_code == 1, diverged.output
    message = _flat(diverged.output)
    assert "training diverged and the phase is not saved" in message and "learning_rate" in message and \
        "1e+30" in message, message
    assert stamp_state(project, "00_sft") == "running"  # not checkpointed
    assert not (project / RUN_DIR / "phases" / "00_sft").exists()
    run = method_class("cogr")(RUN_DIR, load_params("params.yaml", ["cogr.sft.learning_rate=1e30"]),
                               "data/processed/toy")
    assert not run.is_done("00_sft")

    fixed = invoke("train", "cogr", "-q", "--set", "cogr.rounds=0")
    assert fixed.exit_code == 0, fixed.output
    assert stamp_state(project, "00_sft") == "done" and stamp_state(project, "seed") == "done"
    assert not (project / "data/models/cogr/toy.lock.json").exists()


def test_generation_yield_fails_with_examples_above_the_share():
    from coevo.checks import GenerationError, check_generation_yield

    outputs = {"t1": ["weather"], "t2": [], "t3": None, "t4": ["flights"]}
    raw = {"t2": "I cannot help", "t3": "<unparseable>"}
    assert check_generation_yield(outputs, 0.5, "phase 00_sft, item generator", raw) == 0.5
    with pytest.raises(GenerationError, match=r"phase 00_sft, item generator: no usable output for 2 of 4 inputs "
                                              r"\(50%.*cogr\.max_empty_share = 0\.25.*t2: \"I cannot help\""):
        check_generation_yield(outputs, 0.25, "phase 00_sft, item generator", raw, knob="cogr.max_empty_share")


# ------------------------------------------------------------------------ no silent acceptance
def _prepared(tmp_path: Path, name: str = "ds") -> Path:
    from coevo.data.loaders import load_source

    return load_source("metatool", SAMPLE_DIR / "metatool").save(tmp_path / name)


def test_validation_fails_when_no_train_query_has_a_relevant_item(tmp_path):
    folder = _prepared(tmp_path)
    queries = pd.read_parquet(folder / "queries.parquet")
    qrels = pd.read_parquet(folder / "qrels.parquet")
    train = set(queries.loc[queries["split"] == "train", "query_id"])
    qrels[~qrels["query_id"].isin(train)].to_parquet(folder / "qrels.parquet", index=False)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    result = invoke("data", "validate", str(folder), "--report", str(tmp_path / "report.json"))
    assert result.exit_code == 1
    message = _flat(result.output)
    assert "at least one train query has a relevant item (grade > 0)" in message and "no 'train' value" in message
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # the data set is untouched


def test_bm25_baseline_refuses_qrels_naming_unknown_items(tmp_path):
    folder = _prepared(tmp_path)
    qrels = pd.read_parquet(folder / "qrels.parquet")
    qrels.loc[qrels.index[0], "item_id"] = "ghost-tool"
    qrels.to_parquet(folder / "qrels.parquet", index=False)
    result = invoke("baseline", "bm25", str(folder))
    assert result.exit_code == 2 and "name items not in the items table, e.g. 'ghost-tool'" in _flat(result.output)
    assert not (folder / "baseline_bm25").exists()
