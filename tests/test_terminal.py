"""Library output goes to a log file, coevo's own lines to the terminal (issue 12).

The terminal class is exercised in a subprocess (it redirects the process's file descriptors
1 and 2); the real `coevo run cogr` with the `tiny` model checks that TRL's per-step
dictionaries, tqdm bars and warnings land in the log and not on the CLI's stdout/stderr.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import make_project, shared_prefect_env

COEVO = str(Path(sys.executable).parent / "coevo")

SCRIPT = r"""
import os, subprocess, sys, warnings
from pathlib import Path
from coevo.cli.common import console, err_console
from coevo.cli.terminal import LibraryOutputToLog

print("before: ours")
with LibraryOutputToLog(Path(sys.argv[1])) as term:
    console.print("[bold]ours on stdout[/]")
    err_console.print("ours on stderr")
    print("ours via term.out", file=term.out)
    os.write(1, b"noise on fd 1\n")
    os.write(2, b"noise on fd 2\n")
    print({"loss": 1.25, "grad_norm": 0.5})  # what TRL's progress callback prints
    sys.stderr.write("Map: 100%|##########| 34/34 [00:00<00:00, 1510.80 examples/s]\n")
    warnings.warn("a library will change", FutureWarning)
    subprocess.run(["echo", "a child process"], check=True)
    term.note("a note of ours")
try:
    with LibraryOutputToLog(Path(sys.argv[1])):
        raise ValueError("it broke")
except ValueError:
    pass
console.print("after: ours")
os.write(2, b"after: fd 2 is the terminal again\n")
"""


def run_script(tmp_path: Path) -> tuple[subprocess.CompletedProcess, str]:
    log = tmp_path / "logs" / "x.log"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(log)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "120"})
    assert proc.returncode == 0, proc.stderr
    return proc, log.read_text()


def test_library_output_goes_to_the_log_and_ours_to_the_terminal(tmp_path):
    proc, log = run_script(tmp_path)
    assert proc.stdout.splitlines() == ["before: ours", "ours on stdout", "ours via term.out", "after: ours"]
    assert proc.stderr.splitlines() == ["ours on stderr", "after: fd 2 is the terminal again"]
    for noise in ("noise on fd 1", "noise on fd 2", "{'loss': 1.25, 'grad_norm': 0.5}", "34/34 [00:00",
                  "FutureWarning: a library will change", "a child process", "a note of ours"):
        assert noise in log, noise
    assert "ours" not in log.replace("a note of ours", "")  # our terminal lines are not copied into the log


def test_an_exception_leaving_the_block_is_logged_with_its_traceback(tmp_path):
    _, log = run_script(tmp_path)
    tail = log.split("a note of ours", 1)[1]
    assert "Traceback (most recent call last)" in tail and "ValueError: it broke" in tail


# ------------------------------------------------------------------ the real CLI, tiny model
def cli(project: Path, *args: str, own_prefect: bool = False) -> subprocess.CompletedProcess:
    """`coevo ...` as a user runs it; flows go to the job slot's Prefect server when there is one, unless
    ``own_prefect``: the command starts its own, whose output must stay off the screen too."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "COEVO_VERBOSE"))}
    env.update(PREFECT_HOME=str(project / ".prefect_home"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PREFECT_SERVER_ANALYTICS_ENABLED="false", TOKENIZERS_PARALLELISM="false", COLUMNS="200")
    if not own_prefect:
        env.update(shared_prefect_env())
    return subprocess.run([COEVO, *args], cwd=project, env=env, capture_output=True, text=True, timeout=900)


NOISE = ("{'loss'", "Warning", "it/s]", "examples/s]", "INFO", "WARNING", "Traceback")
LOG_LINE = re.compile(r"^library output: (logs/coevo-run-cogr-\d{8}-\d{6}(-\d+)?\.log)$")


@pytest.mark.slow
def test_coevo_run_shows_steps_table_and_url_and_logs_the_library_output(tmp_path):
    project = make_project(tmp_path / "p")
    proc = cli(project, "run", "cogr", own_prefect=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    screen = proc.stdout + proc.stderr
    assert not [n for n in NOISE if n in screen], screen
    errs = proc.stderr.splitlines()
    match = LOG_LINE.match(errs[0])
    assert match, errs[0]
    steps = [l for l in errs[1:] if re.fullmatch(r"  .+: (done in \d+\.\ds|cached)", l)]
    assert [s.split(":")[0].strip() for s in steps][:4] == ["prepare data", "validate data", "Algorithm 1 seeds", "SFT"]
    rest = [l for l in errs[1:] if l not in steps]  # the finished progress bar, named after the run
    assert len(rest) == 1 and rest[0].strip().startswith("CoGR on toy ━"), errs
    assert f" {len(steps)}/{len(steps)} " in rest[0], errs
    assert "cogr: results" in proc.stdout and "MLflow run: http://127.0.0.1:5000/#/experiments/" in proc.stdout
    log = (project / match.group(1)).read_text()
    for noise in ("{'loss'", "FutureWarning", "it/s]", "[coevo ", "SFT: done in"):
        assert noise in log, noise


@pytest.mark.slow
def test_a_failure_names_the_log_holding_its_traceback_and_verbose_keeps_everything_on_screen(tmp_path):
    project = make_project(tmp_path / "p")
    args = ("run", "cogr", "--stage", "prepare", "--set", "data.source=no_such_source")
    proc = cli(project, *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errs = [l for l in proc.stderr.splitlines() if l.strip()]
    assert LOG_LINE.match(errs[0]) and errs[-2].startswith("error:") and "no_such_source" in errs[-2], errs
    log_path = LOG_LINE.match(errs[0]).group(1)
    assert errs[-1] == f"details: {log_path}", errs
    log = (project / log_path).read_text()
    assert "Traceback (most recent call last)" in log and "no_such_source" in log

    verbose = cli(project, *args, "--verbose")
    assert verbose.returncode == 2
    assert not [l for l in verbose.stderr.splitlines() if l.startswith(("library output:", "details:"))]
    assert "Traceback" in verbose.stderr  # --verbose: the traceback on screen, nothing sent to a log
    assert sorted(p.name for p in (project / "logs").iterdir()) == [Path(log_path).name]



@pytest.mark.slow
def test_coevo_train_shows_its_phases_and_table_and_logs_the_library_output(tmp_path):
    project = make_project(tmp_path / "p")
    for stage in ("prepare", "validate"):
        prepared = cli(project, "run", "cogr", "--stage", stage)
        assert prepared.returncode == 0, prepared.stdout + prepared.stderr
    # no rise of val F1 counts (min_delta 1.0): the first GRPO phase is stale and the next one is skipped
    proc = cli(project, "train", "cogr", "--set", "cogr.rounds=2", "--set", "cogr.early_stopping.patience=1",
               "--set", "cogr.early_stopping.min_delta=1.0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    screen = proc.stdout + proc.stderr
    assert not [n for n in NOISE if n in screen], screen
    match = re.search(r"^library output: (logs/coevo-train-cogr-\d{8}-\d{6}(-\d+)?\.log)$", proc.stderr, re.M)
    assert match, proc.stderr
    assert re.search(r"^done .*f1=\d\.\d{4}", proc.stdout, re.M), proc.stdout  # a phase's val metrics
    assert "run folder: data/models/cogr/toy" in proc.stdout, proc.stdout
    # the method's own early-stopping line went to the log with the library output; the screen shows it too
    assert re.search(r"^early stopping before 02_item: f1 has not improved for 1 evaluation\(s\)", proc.stdout, re.M), \
        proc.stdout
    log = (project / match.group(1)).read_text()
    assert "{'loss'" in log and "it/s]" in log, log[-2000:]

    # its MLflow run opened before the first phase and charted each phase while the training ran
    url = re.search(r"^MLflow run: (http://127\.0\.0\.1:5000/#/experiments/\d+/runs/(\w+))  \(live", proc.stdout, re.M)
    assert url, proc.stdout
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    run = client.get_run(url.group(2))
    assert run.info.status == "FINISHED" and run.info.run_name.startswith("cogr-toy-train-"), run.info
    assert run.data.tags["coevo.command"] == "coevo train" and run.data.params["cogr.rounds"] == "2"
    assert [i.dataset.name for i in run.inputs.dataset_inputs] == ["toy"]
    val = client.get_metric_history(run.info.run_id, "val/f1")
    assert [m.step for m in val] == [0, 1], val  # SFT and 01_query; early stopping skipped 02_item
    steps = client.get_metric_history(run.info.run_id, "live/01_query/loss")
    assert steps and all(val[0].timestamp <= m.timestamp <= val[1].timestamp for m in steps), (val, steps)
    assert val[0].timestamp < run.info.end_time - 1000  # logged when SFT ended, not when the run did
