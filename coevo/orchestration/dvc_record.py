"""A run's DVC record: the params it really used, the stages that rebuild it, its files in DVC's cache.

At the end of a whole `coevo run <method>` (or a flow run of a deployment) in a DVC project:

1. ``records/<method>.yaml`` receives the params the run resolved (params.yaml, its overlays and
   ``--set``, merged), and ``dvc.yaml`` is rewritten from the records (:mod:`coevo.orchestration.dvc_stages`);
2. ``dvc commit`` records the stages' deps, params and outs in ``dvc.lock`` and stores the outs
   (data, checkpoints, index, reports) in DVC's cache: `dvc status` is clean;
3. ``dvc exp save`` keeps the workspace as a DVC experiment named like the MLflow run, so
   `dvc exp show` lists the runs side by side and `dvc exp apply <name>` brings one back;
4. with ``dvc.push``, ``dvc push`` uploads the recorded outs to the default remote.

A single DVC stage (``--stage``, which is how `dvc repro` calls the flow) records nothing: DVC
records it. Outside a DVC project (no ``.dvc/``) or outside git, the run says why it left no
record and goes on.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from coevo.config import Params
from coevo.io import write_text
from coevo.layout import Layout
from coevo.orchestration.dvc_stages import DVC_FILE, RECORDS_DIR, read_records, record_file, render, targets
from coevo.steps import fingerprint

RECORD_HEADER = """\
# The params the last whole `coevo run {method}` resolved (params.yaml + overlays + --set), written
# by coevo: the {method} stages of dvc.yaml run with this file, so `dvc repro` rebuilds that run.
"""
DVC_TIMEOUT_S = 3600.0  # hashing and caching a large checkpoint folder can take minutes


class RecordError(RuntimeError):
    """A DVC command of the record failed; the message names it and DVC's own last line."""


@dataclass
class Record:
    """What a run left in DVC (or why it left nothing)."""

    method: str
    skipped: str | None = None
    experiment: str | None = None
    experiment_rev: str | None = None
    record_file: str | None = None
    checkpoint_md5: str | None = None
    pushed: bool = False
    stages: list[str] = field(default_factory=list)

    def tags(self) -> dict[str, str]:
        """Tags of the registered model version: from the champion back to its exact files."""
        if self.skipped:
            return {"dvc.record": f"none ({self.skipped})"}
        return {"dvc.record": str(self.record_file), "dvc.experiment": str(self.experiment),
                "dvc.experiment_rev": str(self.experiment_rev), "dvc.checkpoint_md5": str(self.checkpoint_md5),
                "dvc.pushed": str(self.pushed).lower()}

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v not in (None, [], False) or k == "pushed"}


def why_not_recordable(root: Path = Path(".")) -> str | None:
    """None when ``root`` is a DVC project inside a git work tree with a commit, else the reason."""
    if not (root / ".dvc").is_dir():
        return "not a DVC project: `git init && dvc init` to record runs"
    head = subprocess.run(["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=root, capture_output=True, text=True)
    if head.returncode != 0:
        return "the project's git repository has no commit yet (a DVC experiment is a commit on top of HEAD)"
    return None


def write_record(method: str, tree: dict[str, Any], root: Path = Path(".")) -> Path:
    """``records/<method>.yaml`` := the resolved params tree (atomically: a crash leaves the old one)."""
    path = root / record_file(method)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, RECORD_HEADER.format(method=method) + yaml.safe_dump(tree, sort_keys=False, width=120))
    return path


def _dvc_executable() -> str:
    beside = Path(sys.executable).parent / "dvc"  # the project's environment, even when PATH lacks it
    return str(beside) if beside.exists() else (shutil.which("dvc") or "dvc")


def dvc(*args: str, root: Path = Path(".")) -> str:
    """Run ``dvc <args>`` in ``root``; :class:`RecordError` naming the command and DVC's last line."""
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    try:
        done = subprocess.run([_dvc_executable(), *args], cwd=root, capture_output=True, text=True,
                              timeout=DVC_TIMEOUT_S, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RecordError(f"`dvc {' '.join(args)}` could not run: {exc}") from None
    if done.returncode != 0:
        lines = [ln.strip() for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
        raise RecordError(f"`dvc {' '.join(args)}` failed: {lines[-1] if lines else f'exit code {done.returncode}'}")
    return done.stdout


def experiment_rev(name: str, root: Path = Path(".")) -> str | None:
    """The commit of DVC experiment ``name`` (its ref is refs/exps/<base>/<name>)."""
    refs = subprocess.run(["git", "for-each-ref", "--format=%(objectname) %(refname)", "refs/exps"], cwd=root,
                          capture_output=True, text=True).stdout.splitlines()
    found = [line.split()[0] for line in refs if line.endswith(f"/{name}")]
    return found[-1] if found else None


def record_run(method: str, params: Params, tree: dict[str, Any], experiment: str,
               root: Path = Path(".")) -> Record:
    """Leave the DVC record of a finished whole run (see the module notes); returns what was recorded."""
    if not params.dvc.record:
        return Record(method, skipped="dvc.record is false")
    reason = why_not_recordable(root)
    if reason:
        return Record(method, skipped=reason)
    record = write_record(method, tree, root)
    records = read_records(root)
    write_text(root / DVC_FILE, render(records, root))
    stages = targets(method, records[method])
    dvc("commit", "--force", "--quiet", *stages, root=root)  # dvc.lock + the outs into DVC's cache
    include = [str(DVC_FILE), "dvc.lock", *(str(record_file(n)) for n in records)]
    if (root / ".gitignore").exists():
        include.append(".gitignore")  # DVC adds its outs there
    dvc("exp", "save", "--quiet", "--force", "--name", experiment,
        *(arg for path in include for arg in ("--include-untracked", path)), *stages, root=root)
    if params.dvc.push:
        dvc("push", "--quiet", *stages, root=root)
    return Record(method, experiment=experiment, experiment_rev=experiment_rev(experiment, root),
                  record_file=str(record.relative_to(root)), stages=stages, pushed=params.dvc.push,
                  checkpoint_md5=fingerprint(root / Layout.of(params, method).run_dir))


__all__ = ["RECORDS_DIR", "Record", "RecordError", "dvc", "experiment_rev", "record_run", "why_not_recordable",
           "write_record"]
