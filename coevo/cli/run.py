"""`coevo run ...` (Prefect flows), `coevo demo` and `coevo ui`.

The flows are built by the installed package (`coevo.orchestration.flow.method_flow`); a
project's own `flows/<method>.py:<method>_flow` (prefect.yaml's entrypoint, a thin file over
the package or a custom flow) is loaded the way prefect.yaml loads it when the project has one,
so `coevo run` and a deployment run the same flow. Before Prefect starts, the same staleness keys
that the flow's tasks use tell whether anything would run at all: a finished pipeline
answers at once with its last results. While a flow runs, the screen shows one line per step,
the results and the MLflow URL; library output (trainer dictionaries, progress bars, warnings)
goes to ``logs/coevo-<command>-<time>.log`` (`coevo.cli.terminal`), or stays on screen with
``--verbose``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol, TYPE_CHECKING

import typer

from coevo.cli.common import (
    EXIT_INTERRUPT,
    console,
    err_console,
    interrupt_handled,
    resume_command,
    spawn_server,
    stop_server,
    user_errors,
    verbose_wanted,
)

from coevo import progress  # noqa: E402 - step events only (no dependencies)
from coevo.methods import SPECS  # noqa: E402 - names and help lines only; no method is imported

if TYPE_CHECKING:  # types only: importing them here would pull in heavy libraries or cycles
    from prefect import Flow
    from coevo.config import Params, Resolved
    from coevo.methods.base import Method
    from coevo.orchestration.pipeline import Pipeline

app = typer.Typer(help="Run a method's full pipeline as a Prefect flow.", no_args_is_help=True)

STAGE_HELP = "Run one DVC stage only (prepare, validate, train, evaluate), or all of them."
PARAMS_HELP = "Params file (YAML); repeat to overlay files, later ones win (e.g. -p params.yaml -p params/demo.yaml)."
VERBOSE_HELP = "Keep library output (trainer logs, warnings, Prefect's task logs) on screen; show tracebacks."
SET_HELP = "Override one param after the files, e.g. --set cogr.rounds=3 (repeatable)."
DEMO_PARAMS = (Path("params.yaml"), Path("params") / "cpu.yaml", Path("params") / "demo.yaml")


def _environment(verbose: bool) -> None:
    """A quiet Prefect console and time for the local server to start (offline models: `coevo.cli`)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    # The local server's usage telemetry races its own first database migration (a noisy
    # "database is locked" traceback) and phones home; neither helps a training run.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    if not verbose:
        # Failures reach the user as coevo's one-line error; Prefect's own log of them (a
        # traceback per failed task and flow run) is for --verbose.
        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "CRITICAL")
        import logging

        # Prefect's event queue logs "Still processing items" under this bare logger name while
        # it flushes at exit, outside the "prefect" logger tree the setting above quiets.
        logging.getLogger("EventsWorker").setLevel(logging.ERROR)


class _RichSteps(progress.StepListener):
    """Draws the flow's steps as a rich progress bar (one line per finished step)."""

    def __init__(self, log: Any = None) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        # With library output in a log (``log``, a LibraryOutputToLog), the bar must not take over
        # sys.stdout/sys.stderr (rich's default): it would print that output above the bar.
        self.log = log
        self.progress = Progress(
            SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), console=err_console, transient=False, redirect_stdout=log is None,
            redirect_stderr=log is None,
        )
        self.task_id = None
        self.title = ""
        self.started_at = 0.0
        self.current: str | None = None  # the step running now (named when interrupted)

    def plan(self, total: int, title: str) -> None:
        self.title = title
        if self.task_id is None:
            self.task_id = self.progress.add_task(title, total=total)
        else:
            self.progress.update(self.task_id, description=title, total=total, completed=0)

    def started(self, label: str) -> None:
        self.started_at = time.perf_counter()
        self.current = label
        if self.log is not None:
            self.log.note(f"{label}: started")
        if self.task_id is not None:
            self.progress.update(self.task_id, description=label)

    def finished(self, label: str, cached: bool) -> None:
        seconds = time.perf_counter() - self.started_at
        self.current = None
        how = "[dim]cached[/]" if cached else f"[green]done[/] in {seconds:.1f}s"
        self.progress.console.print(f"  {label}: {how}")
        if self.log is not None:
            self.log.note(f"{label}: {'cached' if cached else f'done in {seconds:.1f}s'}")
        if self.task_id is not None:
            self.progress.advance(self.task_id)
            if self.progress.tasks[0].finished:  # the bar stays on screen: name the run, not its last step
                self.progress.update(self.task_id, description=self.title)

    def notice(self, text: str) -> None:
        self.progress.console.print(f"  [yellow]notice[/] {text}", highlight=False)
        if self.log is not None:
            self.log.note(f"notice: {text}")


def load_flow(method: str) -> Flow:
    """`flows/<method>.py:<method>_flow` of the project in the working directory when it has one,
    loaded as prefect.yaml's entrypoints are (a deployment runs that file too); otherwise (a
    registered method without such a file, or a project without `flows/`) the installed package's
    flow of the method (``coevo.orchestration.flow.method_flow``)."""
    entry = Path("flows") / f"{method}.py"
    if entry.exists():
        from prefect.flows import load_flow_from_entrypoint

        return load_flow_from_entrypoint(f"{entry}:{method}_flow")
    from coevo.orchestration.flow import method_flow

    return method_flow(method)


class CommandState(Protocol):
    """What the log and error handling of a command read (RunState here, coevo.cli.train.TrainState)."""

    command: str  # names the log file
    log_path: Path | None

    def interrupted(self) -> str: ...


class RunState:
    """What a `coevo run` is doing, for the line printed when it is interrupted or fails."""

    def __init__(self, method: str, command: str | None = None) -> None:
        self.method = method
        self.command = command or f"run-{method}"  # names the log file
        self.pipe: Pipeline | None = None
        self.steps: _RichSteps | None = None
        self.log_path: Path | None = None  # library output, once the flow's work started

    def interrupted(self) -> str:
        """"during <step>; last finished phase: <label> (<name>); ... resume with: <command>"."""
        parts = []
        if self.steps is not None and self.steps.current:
            parts.append(f"stopped during {self.steps.current}")
        if self.pipe is not None:
            parts.append(last_finished_phase(self.pipe.method_cls, self.pipe))
        parts.append(f"finished steps are kept; resume with: {resume_command()}")
        return "; ".join(parts)


def last_finished_phase(method_cls: type[Method], pipe: Pipeline) -> str:
    """"last finished phase: SFT (00_sft)", or that none has finished."""
    try:
        method = pipe.method
        done = [p for p in method.phases() if method.is_done(p.name)]
    except (FileNotFoundError, ValueError, OSError):
        done = []
    if not done:
        return f"no {method_cls.name} phase has finished yet"
    return f"last finished phase: {done[-1].label} ({done[-1].name})"


def preflight(method: str, params: Params, stage: str) -> None:
    """Every check that needs no model and no data: before any work."""
    from coevo.checks import TrackingError, check_reachable, check_writable
    from coevo.layout import Layout
    from coevo.orchestration.pipeline import wants

    if wants(stage, "evaluate"):
        try:
            check_reachable(params.tracking.uri)
        except TrackingError as exc:
            raise ValueError(str(exc)) from None
    lay = Layout.of(params, method)
    outputs = {"data.root": lay.root}
    if wants(stage, "validate") or wants(stage, "evaluate"):
        outputs["reports folder"] = Path("reports")
    if wants(stage, "evaluate"):
        outputs["tracking.artifact_root"] = Path(params.tracking.artifact_root)
    for what, path in outputs.items():
        check_writable(path, what)


def check_stage_inputs(pipe: Pipeline, stage: str) -> None:
    """A stage run on its own needs what the earlier stages wrote: fail in one line, before Prefect."""
    if stage in ("validate", "train", "evaluate"):
        pipe.data_fingerprint()  # FileNotFoundError naming data/processed/<dataset> and the stage to run
    if stage in ("train", "evaluate"):
        pipe.require_validated()
    if stage == "evaluate":
        pipe.final()  # FileNotFoundError when no phase has finished


def run_method(
    method: str,
    params_paths: list[Path],
    overrides: list[str],
    stage: str = "all",
    verbose: bool = False,
    extra: dict[str, Any] | None = None,
    always: bool = False,
    state: RunState | None = None,
    resolved: Resolved | None = None,
) -> dict[str, Any]:
    """Validate params, run the method's flow with progress (or report it up to date), print the table.

    Before any work: params, stage, tracking store and output folders are checked, and the
    run folder's lock is taken (a second run on the same method and data set fails at once).
    The params are read once (here, or by the caller: ``resolved``, `coevo demo`'s), the Pipeline
    built once, the lock taken once: the flow takes this run over (``handed_over``) and gets the
    resolved tree as its `resolved` parameter (a plain dict, as a Prefect parameter must be).
    """
    from coevo.config import resolve_params
    from coevo.layout import Layout
    from coevo.orchestration.lock import run_lock
    from coevo.orchestration.pipeline import Pipeline, check_stage, wants

    state = state or RunState(method)
    # bad params: fail here, before any work
    params, tree = resolved or resolve_params(params_paths, overrides, method=method)
    check_stage(stage)
    preflight(method, params, stage)
    started = time.perf_counter()
    with run_lock(Layout.of(params, method).run_dir):
        pipe = Pipeline(method, params)
        state.pipe = pipe
        check_stage_inputs(pipe, stage)
        if not (extra or always) and pipe.up_to_date(stage):
            last = pipe.last_summary() if wants(stage, "evaluate") else None
            summary = dict(last or {"method": method, "rows": []})
            summary.update(steps={"executed": 0, "cached": 0}, seconds=time.perf_counter() - started, up_to_date=True)
            what = "step" if stage == "all" else f"{stage} step"
            console.print(f"[green]up to date[/]: every {what} of {method} on {params.data.dataset} is finished with "
                          "these inputs (data, params, code); nothing ran.", soft_wrap=True)
            print_summary(summary)
            return summary
        with library_output(state, verbose) as log:
            _environment(verbose)
            flow_fn = load_flow(method)
            start_local_prefect()
            steps = state.steps = _RichSteps(log)
            with progress.listening(steps), steps.progress, _handing_over(method, stage, tree, params, pipe) as hand:
                summary = flow_fn(params_path=[str(p) for p in params_paths], overrides=list(overrides),
                                  stage=stage, **hand(flow_fn), **(extra or {}))
            summary["seconds"] = time.perf_counter() - started
            print_summary(summary)
    return summary


@contextlib.contextmanager
def _handing_over(method: str, stage: str, tree: dict[str, Any], params: Params,
                  pipe: Pipeline) -> Iterator[Any]:
    """While the flow runs, the run prepared here is the flow's (coevo.orchestration.flow.handed_over);
    yields ``hand(flow_fn)``: the flow's `resolved` argument, or none for a project's own flow that
    takes no such parameter (that one reads the params files again)."""
    import inspect

    from coevo.orchestration.flow import PreparedRun, handed_over

    def hand(flow_fn: Flow) -> dict[str, Any]:
        parameters = inspect.signature(flow_fn.fn).parameters
        takes = "resolved" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())
        return {"resolved": tree} if takes else {}

    with handed_over(PreparedRun(method, stage, tree, params, pipe)):
        yield hand


@contextlib.contextmanager
def library_output(state: CommandState, verbose: bool) -> Iterator[Any]:
    """Library output (trainer dictionaries, progress bars, warnings, the Prefect server's lines) to
    ``logs/coevo-<command>-<time>.log``, named once on the screen; ``--verbose`` keeps it all on screen."""
    if verbose_wanted(verbose):
        yield None
        return
    from coevo.cli.terminal import LibraryOutputToLog, new_log_path

    state.log_path = new_log_path(state.command)
    err_console.print(f"[dim]library output: {state.log_path}[/]", highlight=False, soft_wrap=True)
    with LibraryOutputToLog(state.log_path) as log:
        yield log


@contextlib.contextmanager
def run_errors(state: CommandState, verbose: bool) -> Iterator[None]:
    """`user_errors`, then the log's path under a failure's one line (its traceback is there)."""
    try:
        with user_errors(verbose, state.interrupted):
            yield
    except typer.Exit as stop:
        if 0 < stop.exit_code < EXIT_INTERRUPT and state.log_path is not None:
            err_console.print(f"details: {state.log_path}", highlight=False, soft_wrap=True)
        raise


def start_local_prefect() -> Any:
    """Start Prefect's local (ephemeral) server now, in its own session, watched by the watchdog.

    Without PREFECT_API_URL, Prefect starts a local server on first use
    (``prefect.server.api.server.SubprocessASGIServer``, a `python -m uvicorn` child in the CLI's
    own process group): a Ctrl-C in the terminal reached it too, so the CLI could not report the
    interrupted flow run, and a `kill -9` of the CLI left it running. Prefect keeps one instance
    per port in ``SubprocessASGIServer._instances``; registering ours there first makes Prefect
    use it. Returns the server, or None when an API URL is configured.
    """
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return None
    from prefect.server.api.server import SubprocessASGIServer

    existing = SubprocessASGIServer._instances.get(None)
    if existing is not None and existing.running:
        return existing
    SubprocessASGIServer._instances.pop(None, None)
    server = _local_prefect_server_class()()
    server.start()
    return server


@functools.lru_cache(maxsize=1)
def _local_prefect_server_class() -> type:
    """Built on first use: prefect is imported only when a flow starts."""
    from prefect.server.api.server import SubprocessASGIServer

    class LocalPrefectServer(SubprocessASGIServer):
        """Prefect's ephemeral server, started in a session of its own and stopped with its group."""

        def _run_uvicorn_command(self) -> Any:
            # Same command and environment as SubprocessASGIServer._run_uvicorn_command (Prefect
            # 3.9), started through spawn_server: own session, killed with the CLI.
            import sys

            import prefect
            from prefect.settings import get_current_settings

            env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
                   "PREFECT__SERVER_FINAL": "1", **get_current_settings().to_environment_variables(exclude_unset=True)}
            return spawn_server(
                [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect.__module_path__.parent), "--factory",
                 "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(self.port),
                 "--log-level", "error", "--lifespan", "on"],
                env=env,
            )

        def stop(self) -> None:
            if self.server_process is not None:
                stop_server(self.server_process, grace_s=3.0)
                self.server_process = None
            super().stop()

    return LocalPrefectServer


def print_summary(summary: dict[str, Any]) -> None:
    from coevo.report import metrics_table

    metrics = summary.get("table_metrics") or ("f1", "recall@100", "ndcg@10")
    if summary.get("up_to_date") and summary.get("mlflow"):
        console.print("results of the last run:")
    if summary.get("rows"):
        console.print(metrics_table(summary["rows"], metrics, title=f"{summary['method']}: results"))
    if summary.get("registry"):
        from coevo.serving.registry import decision_lines

        for line in decision_lines(summary["registry"]):
            console.print(line, soft_wrap=True, highlight=False)
    steps = summary.get("steps", {})
    console.print(
        f"steps: {steps.get('executed', 0)} executed, {steps.get('cached', 0)} from cache; "
        f"{summary.get('seconds', 0):.0f}s"
    )
    if "mlflow" in summary:
        ml = summary["mlflow"]
        console.print(f"MLflow run: {ml['url']}  (experiment {ml['experiment']}, run {ml['run_id']})", soft_wrap=True)
        console.print(f"  artifacts: {ml['artifact_uri']}", soft_wrap=True)
        if not ml["tracking_uri"].startswith(("http://", "https://")):
            console.print("  open it with: coevo ui")
    if summary.get("rows"):
        console.print(f"metrics: {summary['metrics_file']}   reports: {summary['report_dir']}")
    record = summary.get("dvc")
    if record and record.get("skipped"):
        console.print(f"DVC record: none ({record['skipped']})", soft_wrap=True, highlight=False)
    elif record:
        pushed = ", pushed to the DVC remote" if record.get("pushed") else ""
        console.print(f"DVC record: experiment {record['experiment']} ({record['record_file']}, dvc.yaml, dvc.lock"
                      f"{pushed}); audit: `dvc repro -f` (every stage from the record), compare: `dvc exp show`",
                      soft_wrap=True, highlight=False)


def _method_command(method: str, doc: str) -> None:
    def command(
        params: list[Path] = typer.Option([Path("params.yaml")], "--params", "-p", help=PARAMS_HELP),
        overrides: list[str] = typer.Option([], "--set", "-s", help=SET_HELP),
        stage: str = typer.Option("all", "--stage", help=STAGE_HELP),
        verbose: bool = typer.Option(False, "--verbose", "-v", help=VERBOSE_HELP),
        log_run: bool = typer.Option(False, "--log-run", help="Start the flow even when every step is up to date "
                                     "(a new Prefect flow run and MLflow run, all steps from cache)."),
    ) -> None:
        state = RunState(method)
        with run_errors(state, verbose):
            run_method(method, params, overrides, stage, verbose, always=log_run, state=state)

    command.__doc__ = doc
    app.command(method, help=doc)(command)


for _spec in SPECS.values():  # one command per registered method (coevo.methods.SPECS)
    _method_command(_spec.name, _spec.run_help)


def register_top_level(root: typer.Typer) -> None:
    """Commands that sit at the top level of `coevo`."""

    @root.command("demo")
    def demo(
        overrides: list[str] = typer.Option([], "--set", "-s", help="Extra overrides on top of params/demo.yaml."),
        verbose: bool = typer.Option(False, "--verbose", "-v", help=VERBOSE_HELP),
    ) -> None:
        """The whole CoGR pipeline on the embedded MetaTool sample, on CPU, with SmolLM2-135M
        (params.yaml overlaid with params/cpu.yaml and params/demo.yaml)."""
        state = RunState("cogr", command="demo")
        with run_errors(state, verbose):
            from coevo.config import resolve_params
            from coevo.runtime import describe_numerics, numerics

            resolved = resolve_params(list(DEMO_PARAMS), list(overrides), method="cogr")  # read once, run with it
            # the numerics decide the figures (bf16 where the CPU has it, else fp32): say which up front
            shown = describe_numerics(numerics(resolved.params))
            console.print(f"[bold]coevo demo[/]: CoGR on data/sample/metatool with smollm2-135m on CPU, {shown}; "
                          "params.yaml + params/cpu.yaml + params/demo.yaml", soft_wrap=True)
            summary = run_method("cogr", list(DEMO_PARAMS), list(overrides), "all", verbose, state=state,
                                 resolved=resolved)
            audit = ("`dvc repro -f` re-runs every stage from records/cogr.yaml (its steps hit the cache by key), "
                     "`dvc status`, `dvc exp show`" if (summary.get("dvc") or {}).get("experiment") else
                     "`git init && dvc init`, then `coevo demo` again records the run for DVC")
            console.print(f"next: `coevo ui` (MLflow at http://127.0.0.1:5000); audit with DVC: {audit}; "
                          "`dvc metrics show`, `dvc plots show`", soft_wrap=True)

    @root.command("ui")
    def ui(
        params: Path = typer.Option(Path("params.yaml"), "--params", "-p", help="Params file (tracking.uri)."),
        port: int = typer.Option(5000, "--port", min=1, max=65535, help="MLflow UI port."),
        prefect: bool = typer.Option(False, "--prefect", help="Also start the Prefect UI (port 4200)."),
        prefect_port: int = typer.Option(4200, "--prefect-port", min=1, max=65535, help="Prefect UI port."),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="Show tracebacks."),
    ) -> None:
        """Start the MLflow UI (and the Prefect UI with --prefect) on 127.0.0.1 and print the URLs.

        Ctrl-C (or SIGTERM) stops them; they also stop when this command is killed."""
        with user_errors(verbose):
            serve_uis(params, port, prefect, prefect_port)


UI_START_TIMEOUT_S = 120.0
# MLflow 3 opens on its GenAI views; this query parameter keeps the classic model-training view
CLASSIC_VIEW = "workflowType=machine_learning"


def model_training_links(uri: str, base: str) -> list[tuple[str, str]]:
    """(label, URL) of the pages a model trainer opens: the experiments, each coevo method's runs, the registry."""
    from mlflow.tracking import MlflowClient

    from coevo.methods import SPECS

    links = [("experiments", f"{base}/#/experiments?{CLASSIC_VIEW}")]
    for experiment in MlflowClient(uri).search_experiments():
        if experiment.name in SPECS:
            links.append((f"{experiment.name} runs", f"{base}/#/experiments/{experiment.experiment_id}?{CLASSIC_VIEW}"))
    links.append(("model registry", f"{base}/#/models"))
    return links


def _port_free(port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _wait_until_serving(name: str, proc: Any, url: str, timeout_s: float) -> None:
    """Poll ``url`` until it answers 200; a server that exits first is an error naming its code."""
    import requests

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with code {proc.returncode} before serving {url}")
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{name} did not answer {url} within {timeout_s:.0f}s")


def serve_uis(params_path: Path, port: int, prefect: bool, prefect_port: int, wait: bool = True,
              timeout_s: float = UI_START_TIMEOUT_S) -> list[Any]:
    """Start the MLflow UI (and the Prefect UI) as servers that die with this process.

    Each runs in a session of its own (spawn_server): Ctrl-C or SIGTERM stops the whole group
    (the MLflow server's uvicorn and huey consumer processes included), and the watchdog kills
    it if this process is killed. Ports are checked before anything starts.
    """
    import shutil
    import sys

    from coevo.checks import TrackingError, check_reachable
    from coevo.config import load_params

    params = load_params(params_path)
    try:
        check_reachable(params.tracking.uri)
    except TrackingError as exc:
        raise ValueError(str(exc)) from None
    ports = {"--port": port, **({"--prefect-port": prefect_port} if prefect else {})}
    if prefect and port == prefect_port:
        raise ValueError(f"--port and --prefect-port are both {port}; give two different ports")
    for flag, value in ports.items():
        if not _port_free(value):
            raise ValueError(f"{flag} {value}: the port is in use on 127.0.0.1; stop what listens there or pick "
                             f"another port ({flag} N)")
    bin_dir = Path(sys.executable).parent
    mlflow_bin = shutil.which("mlflow", path=str(bin_dir)) or "mlflow"
    procs: list[Any] = []
    handed_over = False
    try:
        procs.append(spawn_server([mlflow_bin, "ui", "--backend-store-uri", params.tracking.uri, "--host", "127.0.0.1",
                                   "--port", str(port), "--workers", "1"]))
        if prefect:
            prefect_bin = shutil.which("prefect", path=str(bin_dir)) or "prefect"
            procs.append(spawn_server([prefect_bin, "server", "start", "--host", "127.0.0.1", "--port",
                                       str(prefect_port)]))
        _wait_until_serving("the MLflow UI", procs[0], f"http://127.0.0.1:{port}/health", timeout_s)
        console.print(f"MLflow UI:  http://127.0.0.1:{port}   (store {params.tracking.uri}, artifacts "
                      f"{params.tracking.artifact_root}/)", soft_wrap=True)
        for label, url in model_training_links(params.tracking.uri, f"http://127.0.0.1:{port}"):
            console.print(f"  {label:<20} {url}", soft_wrap=True, highlight=False)
        if prefect:
            _wait_until_serving("the Prefect UI", procs[1], f"http://127.0.0.1:{prefect_port}/api/health", timeout_s)
            console.print(f"Prefect UI: http://127.0.0.1:{prefect_port}")
        if not wait:
            handed_over = True  # the caller stops them (stop_server)
            return procs
        console.print("Ctrl-C stops them.")
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
        dead = next(p for p in procs if p.poll() is not None)
        raise RuntimeError(f"{' '.join(dead.args[:2])} exited with code {dead.returncode}; the other UI was stopped")
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (user_errors turns SIGTERM into one): the way to stop the UIs
        interrupt_handled()
        console.print("stopping the UIs")
        return procs
    finally:
        if not handed_over:
            for proc in procs:
                stop_server(proc)
