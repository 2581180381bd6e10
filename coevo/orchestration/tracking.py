"""MLflow tracking for the flows: one experiment per method, one MLflow run per flow run.

Logging is done from the flow body (not from cached tasks) so that a fully cached re-run
still produces a complete MLflow run. Metric names are stable across methods:
`eval/<metric>` and `train/<metric>` with `step` = phase index (0 = the SFT/start point).

How the MLflow UI meets a user: every coevo experiment carries the experiment-type tag
``mlflow.experimentKind = custom_model_development`` (MLflow 3's "model training" type: runs
and metric charts rather than GenAI traces; MLflow 3.17's sidebar switch GenAI | Model
training, which starts on GenAI in a fresh browser, overrides it: :data:`MODEL_TRAINING_VIEW`
in a UI link selects Model training); runs are named
``<method>-<dataset>-<stage or date>`` (:func:`run_name`) instead of MLflow's random names;
each run's description (``mlflow.note.content``, :func:`run_description`) says which data
set and generator it trained and holds the final table.

Numerics: logging params that hold ``runtime.precision`` also tags the run with what that knob
resolves to on this machine and the rest of :func:`coevo.runtime.numerics` (device, CPU ISA,
threads, library versions) as ``numerics.<key>`` tags (:func:`numerics_tags`).
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
# MLflow 3's experiment-type tag; "custom_model_development" is the UI's "model training" type.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING = "custom_model_development"
NOTE_TAG = "mlflow.note.content"  # the run's description in the UI (markdown)
NUMERICS_TAG_PREFIX = "numerics."  # coevo.runtime.numerics() of the run, one tag per key
PRECISION_PARAM = "runtime.precision"
# The URL parameter that opens MLflow 3.17's UI on its "Model training" view (kept while navigating).
MODEL_TRAINING_VIEW = "workflowType=machine_learning"

from coevo.checks import TrackingError, check_reachable  # noqa: E402,F401 - re-exported for the flows
from coevo.interrupts import acting_on_interrupt, release_interrupted_logging_lock  # noqa: E402


def init_tracking_store(uri: str) -> None:
    """Create a local (sqlite) MLflow database once, under a lock beside it (``<db>.lock``).

    MLflow creates its tables when a store is first opened; two processes doing that at once
    on a fresh file fail (``table ... already exists``, ``duplicate column name``). Holding the
    lock while the first store opens makes the other wait and then find the tables made.
    Other stores need nothing. Every flow's :class:`Tracker` opens its store through it.
    """
    from urllib.parse import urlparse

    from coevo.checks import sqlite_file

    if urlparse(uri).scheme.lower() != "sqlite":
        return
    db = sqlite_file(uri)
    if db is None:
        return
    from filelock import FileLock
    from mlflow.tracking import MlflowClient  # imported before the lock: it takes seconds

    db = db.resolve()
    with FileLock(db.with_name(f"{db.name}.lock"), timeout=600, thread_local=False):
        MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments(max_results=1)


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


def numerics_tags(numerics: Mapping[str, Any]) -> dict[str, str]:
    """``{"numerics.precision": "bf16", ...}``: a :func:`coevo.runtime.numerics` record as MLflow tags."""
    return {f"{NUMERICS_TAG_PREFIX}{key}": str(value) for key, value in numerics.items()}


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

    def __init__(self, *, uri: str, artifact_root: str, experiment: str, run_name: str | None = None,
                 system_metrics_s: float = 0.0, attach_to: str | None = None) -> None:
        """``attach_to``: the id of a run another process opened and will end (the flow that handed
        this one its train stage); this tracker logs into it and leaves its status alone."""
        check_reachable(uri)
        import mlflow
        from mlflow.tracking import MlflowClient

        # Every flow (`coevo run`, `dvc repro`, a deployment) opens a fresh sqlite store under one
        # lock, so that two first runs do not race on its tables.
        init_tracking_store(uri)

        self.uri = absolute_uri(uri)
        self.experiment = experiment
        self.run_name = run_name
        self.client = MlflowClient(tracking_uri=self.uri, registry_uri=self.uri)  # the registry in the same store
        existing = self.client.get_experiment_by_name(experiment)
        if existing is None:
            location = (Path(artifact_root) / experiment).resolve().as_uri()
            try:
                self.experiment_id = self.client.create_experiment(experiment, artifact_location=location,
                                                                   tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING})
            except mlflow.exceptions.MlflowException:
                existing = self.client.get_experiment_by_name(experiment)  # another run created it meanwhile
                if existing is None:
                    raise
        if existing is not None:
            self.experiment_id = existing.experiment_id
            if existing.tags.get(EXPERIMENT_KIND_TAG) != MODEL_TRAINING:  # experiments made before the tag
                self.client.set_experiment_tag(self.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING)
        self.run_id: str | None = None
        self.attach_to = attach_to
        self._mlflow = mlflow
        self.system_metrics_s = system_metrics_s
        self._system_monitor = None

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> "Tracker":
        if self.attach_to is not None:
            run = self.client.get_run(self.attach_to)  # a wrong id fails here, before any training
            if run.info.experiment_id != self.experiment_id:
                raise ValueError(f"MLflow run {self.attach_to} belongs to another experiment than {self.experiment!r}")
            self.run_id, self.run_name = run.info.run_id, run.info.run_name
            return self
        name = self.run_name or run_name(self.experiment)
        run = self.client.create_run(self.experiment_id, run_name=name)
        self.run_id = run.info.run_id
        self.run_name = name
        if self.system_metrics_s > 0:  # MLflow's own sampler thread: the run's System metrics tab
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            self._system_monitor = SystemMetricsMonitor(self.run_id, sampling_interval=self.system_metrics_s,
                                                        tracking_uri=self.uri)
            self._system_monitor.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is KeyboardInterrupt:
            acting_on_interrupt()  # no repeated interrupt may cut the KILLED status short (coevo.interrupts)
            release_interrupted_logging_lock()  # before joining the sampler thread, which logs (coevo.interrupts)
        if self.run_id is None or self.attach_to is not None:  # an attached run is its opener's to end
            return
        if self._system_monitor is not None:
            self._system_monitor.finish()
        status = "FINISHED" if exc_type is None else ("KILLED" if exc_type is KeyboardInterrupt else "FAILED")
        self.client.set_terminated(self.run_id, status=status)

    # -- logging -----------------------------------------------------------------------------
    def log_params(self, flat: Mapping[str, Any]) -> None:
        """Log the flat params; when they hold ``runtime.precision``, tag the run with its numerics."""
        from mlflow.entities import Param

        params = [Param(k, json.dumps(v) if isinstance(v, (list, dict)) else str(v)) for k, v in sorted(flat.items())]
        for start in range(0, len(params), 100):  # MLflow caps a batch at 100 params
            self.client.log_batch(self.run_id, params=params[start : start + 100])
        if PRECISION_PARAM in flat:
            from coevo.runtime import numerics

            self.set_tags(numerics_tags(numerics(flat[PRECISION_PARAM])))

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

    def log_table(self, columns: Mapping[str, list[Any]], artifact_file: str) -> None:
        """A table the UI renders (Artifacts tab; Evaluation compares it across runs): {column: values}."""
        self.client.log_table(self.run_id, data=dict(columns), artifact_file=artifact_file)

    def log_input(self, path: str | Path, *, name: str, digest: str, context: str = "training") -> None:
        """A data set folder as the run's input (the run page's Datasets; ``digest`` = its DVC md5)."""
        from mlflow.data.meta_dataset import MetaDataset
        from mlflow.data.sources import LocalArtifactDatasetSource
        from mlflow.entities import DatasetInput, InputTag
        from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

        dataset = MetaDataset(LocalArtifactDatasetSource(str(Path(path).resolve())), name=name, digest=digest)
        self.client.log_inputs(self.run_id, [DatasetInput(dataset=dataset._to_mlflow_entity(),
                                                          tags=[InputTag(key=MLFLOW_DATASET_CONTEXT, value=context)])])

    def log_text(self, text: str, name: str, artifact_path: str | None = None) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            file = Path(tmp) / name
            file.write_text(text, encoding="utf-8")
            self.client.log_artifact(self.run_id, str(file), artifact_path)

    def rename(self, name: str) -> None:
        """The run's name in the UI (``<method>-<dataset>-<stage or date>``, :func:`run_name`)."""
        self.client.update_run(self.run_id, name=name)
        self.run_name = name

    def describe(self, markdown: str) -> None:
        """The run's description in the UI (the ``mlflow.note.content`` tag; markdown)."""
        self.client.set_tag(self.run_id, NOTE_TAG, markdown)

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


def run_name(method: str, dataset: str | None = None, stage: str | None = None, when: float | None = None) -> str:
    """``<method>-<dataset>-<stage>`` for a single-stage run (DVC), else ``<method>-<dataset>-<UTC date>``."""
    if stage and stage != "all":
        tail = stage
    else:
        tail = time.strftime("%Y-%m-%d-%H%M%S", time.gmtime(time.time() if when is None else when))
    return "-".join(p for p in (method, dataset, tail) if p)


def _cell(value: Any) -> str:
    if _finite(value):
        return f"{value:.4f}" if isinstance(value, float) else str(value)
    return str(value if value is not None else "").replace("|", "\\|")


def markdown_table(rows: Iterable[Mapping[str, Any]], columns: Iterable[str]) -> str:
    """Rows as a markdown table: label, split, n and the metric columns (4 decimals)."""
    rows, columns = list(rows), list(columns)
    head = ["label"] + [c for c in ("split", "n_queries") if any(c in r for r in rows)] + columns
    lines = ["| " + " | ".join("n" if h == "n_queries" else h for h in head) + " |",
             "|" + "|".join("---" for _ in head) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(h, "")) for h in head) + " |")
    return "\n".join(lines)


def run_description(*, title: str, dataset: str, generator: str, rows: Iterable[Mapping[str, Any]] = (),
                    columns: Iterable[str] = (), notes: Iterable[str] = ()) -> str:
    """The run's description: what was trained on what, the final table, then any notes."""
    parts = [f"**{title}** on data set `{dataset}` with generator `{generator}`."]
    rows = list(rows)
    if rows:
        parts.append(markdown_table(rows, columns))
    parts.extend(n for n in notes if n)
    return "\n\n".join(parts)
