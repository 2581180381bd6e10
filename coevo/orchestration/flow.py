"""The pipeline every method's flow runs: data steps, the method's phases, evaluation, MLflow.

:func:`method_flow` makes the Prefect flow of any registered method (coevo.methods.SPECS).
A project's `flows/<method>.py` files are thin entry points over it for prefect.yaml's
deployments (``cogr_flow = method_flow("cogr")``); a method without such a file runs the flow
made here (`coevo run` falls back to it).

Stages (also the DVC stages): prepare -> validate -> train -> evaluate. With ``stage="all"``
they run in order; with one stage name only that stage runs, reading the earlier stages'
outputs from their fixed paths (that is how `dvc repro` calls it). Each step is one cached
Prefect task (coevo.orchestration.prefect_tasks); what a step depends on is declared in
coevo.orchestration.pipeline and the library (coevo.methods).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TYPE_CHECKING

import yaml
from prefect import Flow, flow, get_run_logger

from coevo import progress, report
from coevo.config import Params, load_tree, params_from_tree, resolve_params
from coevo.io import write_json
from coevo.layout import Layout
from coevo.methods.base import MONITOR_SPLIT
from coevo.orchestration.dvc_record import Record, RecordError, record_run
from coevo.orchestration.lock import holds, run_lock
from coevo.orchestration.pipeline import ALL, Pipeline, check_stage, wants
from coevo.orchestration.prefect_tasks import execute, fan_out
from coevo.orchestration.publish import publish
from coevo.orchestration.tracking import Tracker, check_reachable, git_commit, run_name
from coevo.steps import fingerprint

if TYPE_CHECKING:  # types only: importing them here would pull in heavy libraries or cycles
    from coevo.methods.base import Method


def method_flow(method: str) -> Flow:
    """The Prefect flow of ``method`` (named after it): the pipeline end to end, or one DVC stage."""
    from coevo.methods import spec_of

    spec = spec_of(method)

    @flow(name=method, description=spec.run_help)
    def pipeline_flow(params_path: str | list[str] = "params.yaml", overrides: list[str] | None = None,
                      stage: str = ALL, train_deployment: str | None = None,
                      live_run_id: str | None = None, resolved: dict[str, Any] | None = None) -> dict[str, Any]:
        """The method end to end (or one DVC stage). `resolved` is the params tree already resolved
        (the files, their overlays and --set, merged: `coevo run` passes what it read); without it
        the flow reads `params_path` and `overrides`. `train_deployment` (e.g. "cogr/train-gpu") hands
        the train stage to a deployment on another work pool (the GPU pool) and waits for it; that
        deployment's flow gets this run's resolved params and `live_run_id`, the MLflow run of this
        one, and charts its trainer steps there while they train."""
        run = prepare_run(method, params_path, overrides, stage, resolved)
        train = None
        if train_deployment:
            def train(run_id: str | None) -> None:
                train_elsewhere(train_deployment, params_path, overrides, live_run_id=run_id, resolved=run.tree)
        return run_pipeline(method, params_path, overrides, stage, train=train, live_run_id=live_run_id,
                            resolved=run)

    return pipeline_flow


def train_elsewhere(deployment: str, params_path: str | list[str], overrides: list[str] | None,
                    live_run_id: str | None = None, resolved: dict[str, Any] | None = None) -> None:
    """Run the train stage as a flow run of `deployment` (e.g. on the GPU pool) and wait; it trains with
    ``resolved`` (this run's params tree) when given, else with what it reads from ``params_path`` and
    ``overrides``; its trainer steps go to the MLflow run ``live_run_id`` while they train."""
    from prefect.deployments import run_deployment

    parameters: dict[str, Any] = {"params_path": params_path, "overrides": overrides or [], "stage": "train",
                                  "live_run_id": live_run_id}
    if resolved is not None:
        parameters["resolved"] = resolved
    run = run_deployment(deployment, parameters=parameters)
    if not run.state or not run.state.is_completed():
        raise RuntimeError(f"train stage on deployment {deployment!r} ended "
                           f"{run.state.name if run.state else 'without a state'}")


@dataclass
class PreparedRun:
    """One run's params, resolved once, and the pipeline built on them.

    ``tree``: the params files, their overlays and ``--set``, merged, before validation (a plain
    dict: what the run logs as params.yaml, records for DVC and hands to a deployment); ``params``:
    its validation; ``pipe``: the one :class:`Pipeline` of the run; ``stage``: the stage it was checked
    for. `coevo run` prepares its run before the flow starts (and holds the run folder's lock):
    the flow it starts in this process takes that run over (:func:`handed_over`) instead of
    resolving the same params again."""

    method: str
    stage: str
    tree: dict[str, Any]
    params: Params
    pipe: Pipeline


_handed: PreparedRun | None = None  # the run the CLI of this process prepared for the flow it starts


@contextmanager
def handed_over(run: PreparedRun) -> Iterator[PreparedRun]:
    """For the block, a flow of this process started with ``run``'s method, stage and resolved tree
    takes ``run`` over (its params, its Pipeline) instead of validating the tree again."""
    global _handed
    previous, _handed = _handed, run
    try:
        yield run
    finally:
        _handed = previous


def prepare_run(method: str, params_path: str | Sequence[str] = "params.yaml", overrides: Sequence[str] | None = None,
                stage: str = ALL, resolved: dict[str, Any] | None = None) -> PreparedRun:
    """The params of a flow run, resolved once: the run handed over by the CLI of this process when
    ``resolved`` is its tree, else ``resolved`` validated, else the files read (a deployment or `python
    flows/<method>.py` has only their paths)."""
    ready = _handed
    if (resolved is not None and ready is not None and (ready.method, ready.stage) == (method, stage)
            and ready.tree == resolved):
        return ready
    check_stage(stage)
    if resolved is not None:
        tree, params = resolved, params_from_tree(resolved, source="the resolved params given to the flow",
                                                  method=method)
    else:
        params, tree = resolve_params(_paths(params_path), list(overrides or []), method=method)
    return PreparedRun(method, stage, tree, params, Pipeline(method, params))


def run_pipeline(method: str, params_path: str | Sequence[str] = "params.yaml", overrides: Sequence[str] | None = None,
                 stage: str = ALL, train: Callable[[str | None], None] | None = None, live_run_id: str | None = None,
                 resolved: dict[str, Any] | PreparedRun | None = None) -> dict[str, Any]:
    """Run ``stage`` of ``method``'s pipeline; ``train`` replaces the train stage (e.g. a GPU deployment:
    it is given the id of this flow's MLflow run); ``live_run_id`` is the run of the flow that handed
    this one its train stage, where the trainer steps are charted while they train. The params:
    ``resolved`` (a prepared run, or a resolved tree), else ``params_path`` and ``overrides`` read
    (:func:`prepare_run`).

    The flow holds the lock of its method's run folder while it runs (coevo.orchestration.lock), so a
    flow started by a deployment is refused like a second CLI; when this process holds the lock
    already (the `coevo run` that started the flow took it before any work), the flow runs under it."""
    run = resolved if isinstance(resolved, PreparedRun) else prepare_run(method, params_path, overrides, stage,
                                                                         resolved)
    run_dir = run.pipe.layout.run_dir
    with contextlib.nullcontext() if holds(run_dir) else run_lock(run_dir, f"{method} flow"):
        return _run(run, stage, train, live_run_id)


def _run(run: PreparedRun, stage: str, train: Callable[[str | None], None] | None,
         live_run_id: str | None = None) -> dict[str, Any]:
    params, pipe = run.params, run.pipe
    if wants(stage, "evaluate"):
        check_reachable(params.tracking.uri)  # fail now, not after an hour of training
    lay = pipe.layout
    progress.plan(sum(wants(stage, s) for s in ("prepare", "validate")) + wants(stage, "train") * pipe.phase_count()
                  + wants(stage, "evaluate") * pipe.evaluate_step_count(), f"{pipe.method_cls.title} on {lay.dataset}")
    if not wants(stage, "evaluate"):  # a DVC stage on its own: no MLflow run (the evaluate stage makes it)
        _data(pipe, stage)
        if live_run_id and wants(stage, "train"):  # a handed-over train stage charts into its opener's run
            with Tracker(uri=params.tracking.uri, artifact_root=params.tracking.artifact_root, experiment=pipe.name,
                         attach_to=live_run_id) as tracker, progress.listening(LiveSteps(tracker)):
                _train(pipe, stage, train)
        else:
            _train(pipe, stage, train)
        return summary(pipe, [])
    # The MLflow run opens now and fills in while the flow runs: params and tags first, the prepared
    # data set as its input before training starts, each phase's val metrics (and its GRPO/DPO step
    # curves) as the phase ends, then the final table. It ends FINISHED, FAILED, or KILLED on Ctrl-C
    # (Tracker.__exit__).
    with Tracker(uri=params.tracking.uri, artifact_root=params.tracking.artifact_root,
                 experiment=pipe.name, system_metrics_s=params.tracking.system_metrics_s) as tracker:
        tracker.log_params(params.flat())
        tracker.set_tags({**_tags(pipe), "coevo.stage": stage})
        # the resolved tree (before validation) as one file, besides the params
        tracker.log_text(yaml.safe_dump(run.tree, sort_keys=False), "params.yaml")
        live = LiveSeries(tracker)
        _data(pipe, stage)
        tracker.log_input(pipe.layout.processed, name=pipe.layout.dataset, digest=fingerprint(pipe.layout.processed))
        with progress.listening(LiveSteps(tracker)):  # each trainer step as it is logged
            _train(pipe, stage, train, live)
        # a whole run leaves its DVC record (its resolved params); a single stage is DVC's to record
        return evaluate(pipe, tracker, live, resolved=run.tree if stage == ALL else None, stage=stage)


@dataclass(frozen=True)
class TrainingRun:
    """An open MLflow run of `coevo train`: where to watch it, and what to call when a phase ends."""

    url: str
    phase_done: Callable[[], None]


@contextmanager
def training_run(method: Method, params: Params, params_path: str | Sequence[str], overrides: Sequence[str] | None,
                 data_dir: Path, resolved: dict[str, Any] | None = None) -> Iterator[TrainingRun]:
    """The MLflow run of `coevo train`: the train stage only, so no evaluation, model or registry.

    It opens before the first phase with what `coevo run`'s run opens with (params and numerics
    tags, params.yaml, the data set as input), charts each trainer step while it trains
    (``live/*``), and logs each phase's val metrics when the caller calls ``phase_done`` (after
    every phase). It ends FINISHED, FAILED, or KILLED on Ctrl-C, like `coevo run`'s. ``resolved``: the
    params tree ``params`` were validated from (``coevo.config.resolve_params``); without it the files
    are read again for the run's params.yaml."""
    pipe = Pipeline(method.name, params)
    name = run_name(pipe.name, f"{pipe.layout.dataset}-train")  # <method>-<dataset>-train-<UTC date>
    with Tracker(uri=params.tracking.uri, artifact_root=params.tracking.artifact_root, experiment=pipe.name,
                 run_name=name, system_metrics_s=params.tracking.system_metrics_s) as tracker:
        tracker.log_params(params.flat())
        tracker.set_tags({**_tags(pipe, (data_dir, method.run_dir)), "coevo.stage": "train",
                          "coevo.command": "coevo train"})
        if resolved is None:
            resolved = load_tree(_paths(params_path), list(overrides or []))
        tracker.log_text(yaml.safe_dump(resolved, sort_keys=False), "params.yaml")
        tracker.log_input(data_dir, name=pipe.layout.dataset, digest=fingerprint(data_dir))
        live = LiveSeries(tracker)
        with progress.listening(LiveSteps(tracker)):
            yield TrainingRun(tracker.run_url(), lambda: live.log(method))
        live.log(method)  # phases that were already done (resumed) are charted too
        tracker.set_tags(_tags(pipe, (data_dir, method.run_dir)))  # the run folder's DVC md5 now that it trained


def _paths(params_path: str | Sequence[str]) -> list[str]:
    return [params_path] if isinstance(params_path, str) else list(params_path)


class LiveSeries:
    """Logs a method's per-phase and per-step series to the open MLflow run, each point once.

    A phase's evaluation is on the val split (early stopping and phase selection never see
    test), so its ``eval/<metric>`` is logged as ``val/<metric>``: the chart names its split."""

    def __init__(self, tracker: Tracker) -> None:
        self.tracker = tracker
        self.logged: set[tuple[str, int]] = set()

    def log(self, method: Method) -> None:
        for kind, series in (("phase", method.tracking_series()), ("step", method.training_curve_series())):
            for step_no, metrics in series:
                if (kind, step_no) not in self.logged:
                    self.tracker.log_metrics(phase_metric_names(metrics) if kind == "phase" else metrics, step=step_no)
                    self.logged.add((kind, step_no))


class LiveSteps(progress.StepListener):
    """Charts every logged training step while its phase trains: ``live/<trainer>/<value>`` at the
    trainer's own step (``live/01_query/reward``, ``live/00_sft_query_generator/loss``), so a chart
    names its phase. A train stage handed to a deployment charts into this run from its own process
    (``live_run_id``); steps of a trainer on a Ray worker do not come here: their curves arrive
    with the phase's record (``grpo/*``)."""

    def __init__(self, tracker: Tracker) -> None:
        self.tracker = tracker

    def training_log(self, series: str, step: int, values: dict[str, float]) -> None:
        self.tracker.log_metrics({f"live/{series}/{key}": value for key, value in values.items()}, step=step)


def phase_metric_names(metrics: dict[str, float]) -> dict[str, float]:
    """``eval/f1`` -> ``val/f1``, ``eval/val/G1/ndcg_at_5`` -> ``val/G1/ndcg_at_5`` (the split named
    once); other names as they are."""
    def name(key: str) -> str:
        if not key.startswith("eval/"):
            return key
        rest = key[len("eval/"):]
        return f"{MONITOR_SPLIT}/{rest.removeprefix(MONITOR_SPLIT + '/')}"

    return {name(k): v for k, v in metrics.items()}


def _data(pipe: Pipeline, stage: str) -> None:
    """Prepare and validate the data set, as far as ``stage`` wants; later stages need it validated."""
    if wants(stage, "prepare"):
        execute(pipe.prepare())
    if wants(stage, "validate"):
        execute(pipe.validate())
    elif stage != "prepare":
        pipe.require_validated()


def _train(pipe: Pipeline, stage: str, train: Callable[[str | None], None] | None,
           live: LiveSeries | None = None) -> None:
    if wants(stage, "train"):
        pipe.record_params()
        if train is not None:
            train(live.tracker.run_id if live is not None else None)  # where a deployment charts its steps
        else:
            for step in pipe.train_steps():
                execute(step)
                if live is not None:
                    live.log(pipe.method)


def evaluate(pipe: Pipeline, tracker: Tracker, live: LiveSeries, resolved: dict[str, Any] | None = None,
             stage: str = ALL) -> dict[str, Any]:
    steps = pipe.evaluate_steps()
    independent = {b.name for b in pipe.baseline_steps()}
    # The baselines depend on the data only: with compute.backend=ray they run as Prefect tasks on
    # Ray while the method's own steps run here; the last step (reports) reads them all.
    with fan_out(pipe) as submit:
        waiting = {step.name: submit(step) for step in steps if step.name in independent}
        results = {}
        for step in steps:
            if step is steps[-1]:
                results.update({name: wait() for name, wait in waiting.items()})
            if step.name not in independent:
                results[step.name] = execute(step)
    method, lay = pipe.method, pipe.layout
    final = results[pipe.on_split(f"{pipe.name}-final")]
    table = results[f"{pipe.name}-reports"]["table"]  # baselines at val-chosen k, the method, CIs of every delta
    rows = table["rows"]
    tracker.set_tags(_tags(pipe))  # again: the run folder's DVC md5 now that training is done
    live.log(method)  # what ran outside this flow (a GPU deployment's train stage, a cached phase)
    tracker.log_metrics({**report.tracking_metrics(table), **report.summary_metrics(table)})
    tracker.set_tags({**report.table_tags(table), "best_phase": final["best_phase"], "chosen_phase": final["best_phase"]})
    tracker.log_params({"chosen_phase": final["best_phase"]})
    for artifact_file, columns in report.table_artifacts(table, final).items():
        tracker.log_table(columns, artifact_file)
    tracker.log_artifact(lay.metrics_file)
    tracker.log_artifact(lay.plots_csv, "plots")
    tracker.log_artifact(lay.report_dir, "report")
    tracker.log_artifact(lay.validation_dir, "data_validation")
    name = run_name(pipe.name, lay.dataset, stage)
    record = record_dvc(pipe, resolved, name) if resolved is not None else None
    if record is not None:
        tracker.set_tags(record.tags())
    registry = publish(pipe, tracker, table=table, final=final, run_label=name,  # MLflow model, challenger, champion gate
                       version_tags=record.tags() if record is not None else None)
    out = summary(pipe, rows, tracker, best_phase=final["best_phase"], table_metrics=table["columns"], registry=registry,
                  dvc=record.as_dict() if record is not None else None,
                  evaluation={k: table[k] for k in ("split", "n_queries", "best_baseline", "comparisons")})
    write_json(pipe.summary_path, out)  # what the CLI prints when nothing needs to run
    return out


def record_dvc(pipe: Pipeline, resolved: dict[str, Any], experiment: str) -> Record:
    """The run's DVC record (coevo.orchestration.dvc_record); a failing DVC command is reported, the trained
    run kept."""
    try:
        return record_run(pipe.name, pipe.params, resolved, experiment)
    except RecordError as exc:
        logger().warning("no DVC record of this run: %s", exc)
        return Record(pipe.name, skipped=str(exc))


def _tags(pipe: Pipeline, paths: Sequence[Path] | None = None) -> dict[str, str]:
    """Lineage tags: git commit, data set, method, the DVC md5 of each of ``paths`` (default: the
    layout's data set, run folder and index) that exists, the Prefect flow run."""
    from prefect.context import FlowRunContext

    lay = pipe.layout
    sha, dirty = git_commit()
    tags = {"git.commit": sha, "git.dirty": str(dirty).lower(), "mlflow.source.git.commit": sha,
            "dataset": lay.dataset, "method": pipe.name}
    for path in paths or (lay.processed, lay.run_dir, lay.index_dir):
        if path.exists():
            tags[f"dvc.md5.{path}"] = fingerprint(path)
    ctx = FlowRunContext.get()
    if ctx is not None and ctx.flow_run is not None:
        tags["prefect.flow_run_id"] = str(ctx.flow_run.id)
        tags["prefect.flow_run_name"] = ctx.flow_run.name
    return tags


def summary(pipe: Pipeline, rows: list[dict[str, Any]], tracker: Tracker | None = None,
            **extra: Any) -> dict[str, Any]:
    from prefect.context import FlowRunContext

    lay = pipe.layout
    out: dict[str, Any] = {"method": pipe.name, "rows": rows, "steps": progress.counts(),
                           "table_metrics": list(pipe.method_cls.table_metrics), "metrics_file": str(lay.metrics_file),
                           "report_dir": str(lay.report_dir), **extra}
    ctx = FlowRunContext.get()
    if ctx is not None and ctx.flow_run is not None:
        out["flow_run_id"] = str(ctx.flow_run.id)
    if tracker is not None:
        out["mlflow"] = {"experiment": tracker.experiment, "run_id": tracker.run_id, "url": tracker.run_url(),
                         "artifact_uri": tracker.artifact_uri, "tracking_uri": tracker.uri}
    return out


def logger():
    try:
        return get_run_logger()
    except Exception:  # noqa: BLE001 - outside a run
        import logging

        return logging.getLogger("coevo.flows")


def main(flow_fn: Flow, argv: Sequence[str] | None = None) -> None:
    """`python flows/<method>.py [--params FILE ...] [--set k=v ...] [--stage S]` (no rich UI)."""
    import argparse
    import json

    from coevo.orchestration.pipeline import STAGES

    parser = argparse.ArgumentParser(prog=f"flows/{flow_fn.name}.py", description=flow_fn.description)
    parser.add_argument("--params", action="append", default=None, help="params file(s) (default params.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="override key=value")
    parser.add_argument("--stage", default=ALL, choices=(ALL, *STAGES), help="one DVC stage, or all")
    args = parser.parse_args(argv)
    result = flow_fn(params_path=args.params or ["params.yaml"], overrides=args.overrides, stage=args.stage)
    print(json.dumps({k: result[k] for k in ("method", "steps", "mlflow") if k in result}, indent=2, default=str))
