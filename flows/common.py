"""What the three method flows share: stages, file layout, data steps, run-dir reconciliation,
step progress, and the MLflow run that every flow run opens.

Stages (also the DVC stages): prepare -> validate -> train -> evaluate. A flow called with
`stage="all"` runs them in order; with one stage name it runs only that stage and reads the
previous stages' outputs from their fixed paths (that is how `dvc repro` calls it).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from prefect import Task, get_run_logger

from coevo.config import Params, load_params
from coevo.io import read_json, write_json
from tasks.common import fingerprint

STAGES: tuple[str, ...] = ("prepare", "validate", "train", "evaluate")
ALL = "all"
R = TypeVar("R")


# ---------------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class Layout:
    """Where each artifact of a method's pipeline lives (relative to the project root)."""

    root: Path
    dataset: str
    method: str

    @classmethod
    def of(cls, params: Params, method: str) -> "Layout":
        return cls(Path(params.data.root), params.data.dataset, method)

    @property
    def processed(self) -> Path:
        return self.root / "processed" / self.dataset

    @property
    def validation_report(self) -> Path:
        return Path("reports") / "validation" / self.dataset / "validation.json"

    @property
    def run_dir(self) -> Path:
        """Checkpoints of the library run (one per method and data set; resumable)."""
        return self.root / "models" / self.method / self.dataset

    @property
    def index_dir(self) -> Path:
        return self.root / "indexes" / self.method / self.dataset

    @property
    def report_dir(self) -> Path:
        """Evaluate-stage outputs besides the metrics file: PNGs, tables, examples."""
        return Path("reports") / self.method / self.dataset

    @property
    def metrics_file(self) -> Path:
        # CoGR is the project's headline method: its metrics sit at the root (DESIGN, dvc.yaml).
        return Path("metrics.json") if self.method == "cogr" else Path("reports") / self.method / "metrics.json"

    @property
    def plots_csv(self) -> Path:
        return Path("plots") / f"{self.method}_phases.csv"


# ------------------------------------------------------------------------------ params
def load_checked(params_path: str, overrides: Sequence[str] | None) -> Params:
    """Validated params; a bad key raises ParamsError before any task runs."""
    return load_params(params_path, list(overrides or []))


def check_stage(stage: str) -> str:
    if stage != ALL and stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; expected one of {', '.join((ALL, *STAGES))}")
    return stage


def wants(stage: str, name: str) -> bool:
    return stage == ALL or stage == name


def params_hash(obj: Any) -> str:
    return hashlib.md5(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


# --------------------------------------------------------------------------- progress
class StepListener:
    """Receives step events from flows running in this process (the CLI draws a progress bar)."""

    def plan(self, total: int, title: str) -> None: ...
    def started(self, label: str) -> None: ...
    def finished(self, label: str, cached: bool) -> None: ...


_listeners: list[StepListener] = []
_counts = {"executed": 0, "cached": 0}


@contextmanager
def listening(listener: StepListener) -> Iterator[None]:
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)


def plan(total: int, title: str) -> None:
    _counts.update(executed=0, cached=0)
    for listener in _listeners:
        listener.plan(total, title)


def step_counts() -> dict[str, int]:
    return dict(_counts)


def run_step(step: Task[..., R], *, label: str, outputs: Sequence[str | Path] = (), **kwargs: Any) -> R:
    """Call a cached task and report whether it ran or came from the cache.

    If an output the task wrote earlier has vanished, the cache entry is refreshed (a cache
    hit would hand back paths to deleted files).
    """
    for listener in _listeners:
        listener.started(label)
    if any(not Path(p).exists() for p in outputs):
        step = step.with_options(refresh_cache=True)
    state = step(**kwargs, return_state=True)
    result = state.result()  # raises the task's own exception on failure
    cached = state.name == "Cached"
    _counts["cached" if cached else "executed"] += 1
    for listener in _listeners:
        listener.finished(label, cached)
    return result


# ---------------------------------------------------------------------------- data steps
@dataclass(frozen=True)
class DataRef:
    dataset_dir: str
    fingerprint: str
    report: str | None = None


def prepare_stage(params: Params, layout: Layout) -> DataRef:
    from tasks.data import prepare_data

    out = layout.processed
    result = run_step(
        prepare_data,
        label="prepare data",
        outputs=[out],
        loader=params.data.loader,
        source=params.data.source,
        source_fingerprint=fingerprint(params.data.source),
        name=params.data.dataset,
        seed=params.seed,
        val_fraction=params.data.val_fraction,
        test_fraction=params.data.test_fraction,
        out_dir=str(out),
    )
    return DataRef(result["dataset_dir"], result["fingerprint"])


def existing_data(layout: Layout) -> DataRef:
    """The prepared data set on disk (a later stage run on its own, e.g. by DVC)."""
    if not (layout.processed / "dataset.json").exists():
        raise FileNotFoundError(
            f"{layout.processed}: no prepared data set; run the prepare stage first "
            "(`dvc repro prepare` or `coevo run ...`)"
        )
    report = layout.validation_report
    return DataRef(str(layout.processed), fingerprint(layout.processed), str(report) if report.exists() else None)


def validate_stage(data: DataRef, layout: Layout) -> DataRef:
    from tasks.data import validate_data

    result = run_step(
        validate_data,
        label="validate data",
        outputs=[layout.validation_report],
        dataset_dir=data.dataset_dir,
        dataset_fingerprint=data.fingerprint,
        report_path=str(layout.validation_report),
    )
    return DataRef(data.dataset_dir, data.fingerprint, result["report"])


def data_stages(params: Params, layout: Layout, stage: str) -> DataRef | None:
    """Run prepare and validate as asked; return the data set later stages use."""
    data = prepare_stage(params, layout) if wants(stage, "prepare") else None
    if stage == "prepare":
        return data
    if data is None:
        data = existing_data(layout)
    if wants(stage, "validate"):
        data = validate_stage(data, layout)
    elif data.report is None:
        raise FileNotFoundError(
            f"{layout.validation_report}: the data set has not been validated; run the validate stage first"
        )
    return data


# ------------------------------------------------------------------ run-dir reconciliation
@dataclass(frozen=True)
class Part:
    """A piece of a library run dir: the params it depends on, the paths it owns, its inputs."""

    name: str
    params: Any
    paths: tuple[str, ...]
    after: tuple[str, ...] = ()


STAMP = "params-stamp.json"


def reconcile_run_dir(run_dir: Path, parts: Sequence[Part], data_fingerprint: str) -> tuple[list[str], dict[str, str]]:
    """Drop the checkpoints whose params (or inputs' params, or the data) changed.

    The library phases are idempotent over a run dir: a finished phase's marker makes it
    return its stored result. That is right after a crash (resume) and wrong after a params
    change, so the flow keeps a stamp of each part's effective params hash and removes a
    part's paths when its hash differs, keeping everything that does not depend on the
    change. Returns (names of the parts removed, part -> key); the key is also each part's
    task cache-key input.
    """
    effective: dict[str, str] = {}
    for part in parts:
        upstream = [effective[n] for n in part.after]
        effective[part.name] = params_hash([part.params, upstream, data_fingerprint])
    stamp_path = run_dir / STAMP
    old = read_json(stamp_path) if stamp_path.exists() else {}
    removed = []
    for part in parts:
        if old.get(part.name) == effective[part.name]:
            continue
        for pattern in part.paths:
            for path in run_dir.glob(pattern):
                shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        if old or run_dir.exists():
            removed.append(part.name)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(stamp_path, effective)
    return removed, effective


def read_part_keys(run_dir: Path) -> dict[str, str]:
    stamp = run_dir / STAMP
    return read_json(stamp) if stamp.exists() else {}


# ------------------------------------------------------------------------------ tracking
def tracking_tags(params: Params, layout: Layout, data: DataRef | None) -> dict[str, str]:
    from prefect.context import FlowRunContext

    from tasks.tracking import git_commit

    sha, dirty = git_commit()
    tags = {
        "git.commit": sha,
        "git.dirty": str(dirty).lower(),
        "mlflow.source.git.commit": sha,
        "dataset": params.data.dataset,
        "method": layout.method,
        f"dvc.md5.{layout.processed}": data.fingerprint if data else fingerprint(layout.processed),
        f"dvc.md5.{layout.run_dir}": fingerprint(layout.run_dir),
    }
    if layout.index_dir.exists():
        tags[f"dvc.md5.{layout.index_dir}"] = fingerprint(layout.index_dir)
    ctx = FlowRunContext.get()
    if ctx is not None and ctx.flow_run is not None:
        tags["prefect.flow_run_id"] = str(ctx.flow_run.id)
        tags["prefect.flow_run_name"] = ctx.flow_run.name
    return tags


def open_tracker(params: Params, layout: Layout, run_name: str | None = None):
    from tasks.tracking import Tracker

    return Tracker(
        uri=params.tracking.uri,
        artifact_root=params.tracking.artifact_root,
        experiment=layout.method,
        run_name=run_name,
    )


def log_common(tracker: Any, params: Params, layout: Layout, data: DataRef | None) -> None:
    """Params, provenance tags and the data-validation report: the same for every method."""
    tracker.log_params(params.flat())
    tracker.set_tags(tracking_tags(params, layout, data))
    if data is not None and data.report:
        tracker.log_artifact(Path(data.report).parent, "data_validation")  # .json + readable .md


def logger():
    try:
        return get_run_logger()
    except Exception:  # noqa: BLE001 - outside a run (unit tests calling helpers)
        import logging

        return logging.getLogger("coevo.flows")


def finish_summary(
    rows: list[dict[str, Any]], tracker: Any | None, layout: Layout, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "method": layout.method,
        "rows": rows,
        "steps": step_counts(),
        "metrics_file": str(layout.metrics_file),
        "report_dir": str(layout.report_dir),
        **(extra or {}),
    }
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    if ctx is not None and ctx.flow_run is not None:
        summary["flow_run_id"] = str(ctx.flow_run.id)
    if tracker is not None:
        summary["mlflow"] = {
            "experiment": tracker.experiment,
            "run_id": tracker.run_id,
            "url": tracker.run_url(),
            "artifact_uri": tracker.artifact_uri,
            "tracking_uri": tracker.uri,
        }
    return summary




def run_stages(
    method: str,
    title: str,
    params_path: str,
    overrides: Sequence[str] | None,
    stage: str,
    *,
    train_steps: int | Any,
    train_stage: Any,
    evaluate_stage: Any,
) -> dict[str, Any]:
    """The stage skeleton GRAPE and CoHyDE share: data stages, then train, then evaluate.

    ``train_steps`` is the number of progress steps the train stage reports (an int, or a
    callable of the params); ``train_stage(params, layout, data)`` and
    ``evaluate_stage(params, layout, data)`` are the method's own stages.
    """
    params = load_checked(params_path, overrides)
    check_stage(stage)
    layout = Layout.of(params, method)
    if wants(stage, "evaluate"):
        from tasks.tracking import check_reachable

        check_reachable(params.tracking.uri)
    n_train = train_steps(params) if callable(train_steps) else train_steps
    plan(sum(wants(stage, s) for s in ("prepare", "validate")) + n_train * wants(stage, "train")
         + wants(stage, "evaluate"), f"{title} on {params.data.dataset}")
    data = data_stages(params, layout, stage)
    if stage in ("prepare", "validate"):
        return finish_summary([], None, layout)
    if wants(stage, "train"):
        train_stage(params, layout, data)
    if stage == "train":
        return finish_summary([], None, layout)
    return evaluate_stage(params, layout, data)

def main(flow_fn: Any, argv: Sequence[str] | None = None) -> None:
    """`python -m flows.<method> [--params FILE] [--set k=v ...] [--stage S]` (no rich UI)."""
    import argparse

    parser = argparse.ArgumentParser(prog=f"python -m flows.{flow_fn.name}", description=flow_fn.description)
    parser.add_argument("--params", default="params.yaml", help="params file (default params.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="override key=value")
    parser.add_argument("--stage", default=ALL, choices=(ALL, *STAGES), help="one DVC stage, or all")
    args = parser.parse_args(argv)
    from coevo.config import ParamsError

    try:
        load_checked(args.params, args.overrides)  # bad params: fail before the server starts
    except ParamsError as exc:
        parser.exit(2, f"error: {exc}\n")
    summary = flow_fn(params_path=args.params, overrides=args.overrides, stage=args.stage)
    print(json.dumps({k: summary[k] for k in ("method", "steps", "mlflow") if k in summary}, indent=2, default=str))
