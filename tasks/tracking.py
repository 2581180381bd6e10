"""MLflow tracking for the flows: one experiment per method, one MLflow run per flow run.

Logging is done from the flow body (not from cached tasks) so that a fully cached re-run
still produces a complete MLflow run. Metric names are stable across methods:
`eval/<metric>` and `train/<metric>` with `step` = phase index (0 = the SFT/start point).
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

# A remote store that vanishes mid-run should fail in seconds, not after MLflow's default
# ~4 minutes of retries; users can still raise these through the environment.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")

MLFLOW_UI_PORT = 5000

from coevo.checks import TrackingError, check_reachable  # noqa: E402,F401 - re-exported for the flows


def git_commit(root: Path = Path(".")) -> tuple[str, bool]:
    """(commit sha or "unknown", whether tracked files differ from it)."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=root, capture_output=True, text=True, timeout=10, check=True,
            ).stdout.strip()
        )
        return sha, dirty
    except (OSError, subprocess.SubprocessError):
        return "unknown", False


def metric_name(name: str) -> str:
    """MLflow forbids '@' in names: `eval/recall@100` is logged as `eval/recall_at_100`."""
    return name.replace("@", "_at_")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def absolute_uri(uri: str) -> str:
    """`sqlite:///mlflow.db` -> `sqlite:////<cwd>/mlflow.db`: MLflow caches stores by URI, so
    a relative one would keep pointing at the first working directory it was opened in."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(uri[len("sqlite:///"):]).resolve())
    return uri


class Tracker:
    """One MLflow run. Use as a context manager; failure inside marks the run FAILED."""

    def __init__(self, *, uri: str, artifact_root: str, experiment: str, run_name: str | None = None) -> None:
        check_reachable(uri)
        import mlflow
        from mlflow.tracking import MlflowClient

        self.uri = absolute_uri(uri)
        self.experiment = experiment
        self.run_name = run_name
        self.client = MlflowClient(tracking_uri=self.uri)
        existing = self.client.get_experiment_by_name(experiment)
        if existing is None:
            location = (Path(artifact_root) / experiment).resolve().as_uri()
            self.experiment_id = self.client.create_experiment(experiment, artifact_location=location)
        else:
            self.experiment_id = existing.experiment_id
        self.run_id: str | None = None
        self._mlflow = mlflow

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> "Tracker":
        run = self.client.create_run(self.experiment_id, run_name=self.run_name)
        self.run_id = run.info.run_id
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.run_id is None:
            return
        status = "FINISHED" if exc_type is None else ("KILLED" if exc_type is KeyboardInterrupt else "FAILED")
        self.client.set_terminated(self.run_id, status=status)

    # -- logging -----------------------------------------------------------------------------
    def log_params(self, flat: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(k, json.dumps(v) if isinstance(v, (list, dict)) else str(v)) for k, v in sorted(flat.items())]
        for start in range(0, len(params), 100):  # MLflow caps a batch at 100 params
            self.client.log_batch(self.run_id, params=params[start : start + 100])

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_metrics(self, metrics: Mapping[str, Any], step: int = 0) -> None:
        """Log every finite numeric value under its stable name (`eval/f1`, `eval/recall_at_100`)."""
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        batch = [Metric(metric_name(k), float(v), stamp, step) for k, v in sorted(metrics.items()) if _finite(v)]
        for start in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[start : start + 1000])

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        path = Path(path)
        if path.is_dir():
            self.client.log_artifacts(self.run_id, str(path), artifact_path)
        elif path.exists():
            self.client.log_artifact(self.run_id, str(path), artifact_path)

    def log_json(self, obj: Any, name: str, artifact_path: str | None = None) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            file = Path(tmp) / name
            file.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
            self.client.log_artifact(self.run_id, str(file), artifact_path)

    def log_text(self, text: str, name: str, artifact_path: str | None = None) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            file = Path(tmp) / name
            file.write_text(text, encoding="utf-8")
            self.client.log_artifact(self.run_id, str(file), artifact_path)

    # -- where to look -----------------------------------------------------------------------
    @property
    def artifact_uri(self) -> str:
        return self.client.get_run(self.run_id).info.artifact_uri

    def run_url(self) -> str:
        """Browser URL of the run (for a local store: the URL `coevo ui` serves)."""
        base = self.uri if urlparse(self.uri).scheme in ("http", "https") else f"http://127.0.0.1:{MLFLOW_UI_PORT}"
        return f"{base.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{self.run_id}"


def phase_metrics(record: Mapping[str, Any], prefixes: Iterable[str] = ("eval", "train")) -> dict[str, float]:
    """Keep the `eval/...` and `train/...` numbers of a per-phase record."""
    keep = tuple(f"{p}/" for p in prefixes)
    return {k: float(v) for k, v in record.items() if k.startswith(keep) and _finite(v)}
