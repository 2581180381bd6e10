"""`coevo train METHOD`: a method's train stage in-process (no Prefect server, no evaluation).

It runs the same phases with the same staleness keys as `coevo run`, in the same run folder
by default, so either command resumes, or re-runs only what a changed knob touches, after
the other. It opens an MLflow run of its own (``--no-track``: none) that charts each trainer
step and each phase's val metrics while it trains (``coevo.orchestration.flow.training_run``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from coevo import progress
from coevo.cli.common import console
from coevo.methods import SPECS

app = typer.Typer(help="Train a method in-process on a prepared data set (resumable).", no_args_is_help=True)


class _Notices(progress.StepListener):
    """Shows the library's notices (a finished phase whose outputs changed runs again) on screen."""

    def notice(self, text: str) -> None:
        console.print(f"[yellow]notice[/] {text}", highlight=False)


class TrainState:
    """What `coevo train` is doing, for the line printed when it is interrupted."""

    def __init__(self, method: str = "") -> None:
        self.run = None
        self.command = f"train-{method}"  # names the log file (coevo.cli.run.library_output)
        self.log_path = None

    def interrupted(self) -> str:
        from coevo.cli.common import resume_command

        parts = []
        if self.run is not None:
            try:
                done = [p for p in self.run.phases() if self.run.is_done(p.name)]
                running = _first_unfinished(self.run)
            except (OSError, ValueError):
                done, running = [], None
            if running is not None:
                parts.append(f"stopped during {running.label}")
            parts.append(f"last finished phase: {done[-1].label} ({done[-1].name})" if done
                         else f"no {self.run.name} phase has finished yet")
        parts.append(f"finished phases are kept; resume with: {resume_command()}")
        return "; ".join(parts)


def _first_unfinished(run):
    """The first phase of ``run`` not finished (the one running, or the one early stopping skipped)."""
    return next((p for p in run.phases() if not run.is_done(p.name)), None)


def _train(method: str, params: list[Path], overrides: list[str], data: Optional[Path], out: Optional[Path],
           quiet: bool, state: TrainState | None = None, verbose: bool = False, track: bool = False,
           **kwargs) -> None:
    from coevo import distributed
    from coevo.cli.run import library_output
    from coevo.checks import check_writable
    from coevo.config import load_params
    from coevo.layout import Layout, write_run_params
    from coevo.memory import release_freed_memory
    from coevo.methods.base import method_class

    state = state or TrainState()
    loaded = load_params(params, overrides, method=method)
    layout = Layout.of(loaded, method)
    data_dir = data or layout.processed
    run_dir = out or layout.run_dir
    check_writable(run_dir, "--out" if out else "run folder")
    distributed.start()  # under accelerate launch / torchrun: join the ranks before the first write
    quiet = quiet or not distributed.is_writer()  # rank 0 speaks for the launch
    with _rank_zero_lock(run_dir):  # first: a run in progress may be writing the data set right now
        if not (data_dir / "dataset.json").is_file():
            raise FileNotFoundError(f"{data_dir}: no prepared data set (dataset.json is missing); prepare it first "
                                    f"(`coevo run {method} --stage prepare` or `coevo data prepare`)")
        run = method_class(method)(run_dir, loaded, data_dir, progress=not quiet, **kwargs)
        state.run = run

        tracking = None  # the MLflow run, once open

        def done(phase, record) -> None:
            release_freed_memory()  # the next phase starts from what this one keeps, not from its peak
            if tracking is not None:
                tracking.phase_done()
            if not quiet:
                shown = " ".join(f"{k}={record['eval'][k]:.4f}" for k in run.table_metrics
                                 if k in record.get("eval", {}))
                console.print(f"[green]done[/] {phase.label}" + (f" {shown}" if shown else ""), highlight=False)

        # inputs checked: from here trainer dictionaries, progress bars and warnings go to logs/ (as in `coevo run`)
        write_run_params(run_dir, loaded)  # the run folder says how it was trained (coevo search -m RUN_DIR)
        with library_output(state, verbose), progress.listening(_Notices()), \
                _training_run(track, run, loaded, params, overrides, data_dir) as tracking:
            if tracking is not None and not quiet:
                console.print(f"MLflow run: {tracking.url}  (live; open it with: coevo ui)", highlight=False,
                              soft_wrap=True)
            rows = run.run(on_phase=done)
        # the method says so itself, but under the redirection above its line went to the log
        skipped = _first_unfinished(run)
        stopped = run.stop_before(skipped.name) if skipped is not None else None
        if stopped is not None and not quiet:
            console.print(f"early stopping before {skipped.name}: {stopped.metric} has not improved for "
                          f"{stopped.stale} evaluation(s) (best {stopped.best:.4f})", highlight=False)
    if not distributed.is_writer():
        return
    console.print(results_table(run, rows))
    console.print(f"run folder: {run_dir}  (best phase on val: {run.best_phase()})", highlight=False)


def _training_run(track: bool, run, loaded, params: list[Path], overrides: list[str], data_dir: Path):
    """The MLflow run of this training (``coevo.orchestration.flow.training_run``), or none:
    ``--no-track``, or a rank other than 0."""
    import contextlib

    from coevo import distributed

    if not track or not distributed.is_writer():
        return contextlib.nullcontext()
    from coevo.orchestration.flow import training_run

    return training_run(run, loaded, [str(p) for p in params], overrides, data_dir)


def _rank_zero_lock(run_dir: Path):
    """The run folder's lock, taken by rank 0 only under a multi-process launch (`accelerate launch`,
    torchrun): the ranks of one job share the run folder, a second job does not."""
    import contextlib

    from coevo import distributed
    from coevo.orchestration.lock import run_lock

    return run_lock(run_dir) if distributed.is_writer() else contextlib.nullcontext()


def _command(method: str, doc: str, vllm: bool) -> None:
    """`coevo train <method>`; ``--vllm`` only where the method's spec says its generation runs on vLLM."""
    def command(
        params: list[Path] = typer.Option([Path("params.yaml")], "--params", "-p",
                                          help="Params file(s); repeat to overlay, later ones win."),
        set_: list[str] = typer.Option([], "--set", help="Override a param, KEY=VALUE (repeatable), e.g. cogr.rounds=1."),
        data: Optional[Path] = typer.Option(None, "--data", "-d", help="Prepared data set folder; default: "
                                            "<data.root>/processed/<data.dataset>."),
        out: Optional[Path] = typer.Option(None, "--out", "-o", help="Run folder; default: the one `coevo run` uses, "
                                           f"<data.root>/models/{method}/<data.dataset>. Re-running resumes; a changed "
                                           "knob re-runs only the phases that depend on it."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars."),
        track: bool = typer.Option(True, "--track/--no-track", envvar="COEVO_TRACK", help="Open an MLflow run "
                                   "(tracking.uri of the params) that charts every trainer step and each phase's "
                                   "val metrics while it trains; it ends FINISHED, FAILED or KILLED."),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="Keep library output (trainer logs, progress "
                                     "bars, warnings) on screen; show tracebacks."),
        use_vllm: bool = False,
    ) -> None:
        from coevo.cli.run import run_errors

        state = TrainState(method)
        with run_errors(state, verbose):  # one line; under it the log's path, which holds the traceback
            _train(method, params, set_, data, out, quiet, state, verbose, track,
                   **({"use_vllm": True} if use_vllm else {}))

    _declare_vllm(command, vllm)
    command.__doc__ = doc
    app.command(method, help=doc)(command)


def _declare_vllm(command, offered: bool) -> None:
    """Give ``command``'s ``use_vllm`` parameter the ``--vllm`` flag, or hide it from typer (not offered)."""
    import inspect

    signature = inspect.signature(command)
    params = [p for p in signature.parameters.values() if p.name != "use_vllm"]
    if offered:
        params.append(signature.parameters["use_vllm"].replace(default=typer.Option(
            False, "--vllm", help="Generate GRPO rollouts and keyword sets with vLLM (GPU workers with vllm "
            "installed).")))
    command.__signature__ = signature.replace(parameters=params)


for _spec in SPECS.values():  # one command per registered method (coevo.methods.SPECS)
    _command(_spec.name, _spec.train_help, _spec.supports_vllm)


def results_table(run, rows: list[dict]):
    """Rich table: one row per evaluated phase, the method's table metrics on the val split."""
    from rich.table import Table

    table = Table(title=f"{run.title} on the val split")
    table.add_column("phase")
    for name in run.table_metrics:
        table.add_column(name, justify="right")
    table.add_column("train reward", justify="right")
    for row in rows:
        reward = (row.get("train") or {}).get("reward_mean") if isinstance(row.get("train"), dict) else None
        table.add_row(row["label"], *(_fmt(row["eval"].get(m)) for m in run.table_metrics), _fmt(reward))
    return table


def _fmt(value) -> str:
    return "" if value is None else f"{value:.4f}"
