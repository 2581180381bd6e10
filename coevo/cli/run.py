"""`coevo run ...` (Prefect flows), `coevo demo` and `coevo ui`.

The flows live in the project's top-level `flows/` folder and are loaded the way
prefect.yaml entrypoints are (`flows/<method>.py:<method>_flow`), so nothing is installed
under the bare names `flows` or `tasks`. Before Prefect starts, the same staleness keys
that the flow's tasks use tell whether anything would run at all: a finished pipeline
answers at once with its last results.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import typer

from coevo.cli.common import console, err_console, user_errors

app = typer.Typer(help="Run a method's full pipeline as a Prefect flow.", no_args_is_help=True)

METHODS = ("cogr", "grape", "cohyde")
STAGE_HELP = "Run one DVC stage only (prepare, validate, train, evaluate), or all of them."
PARAMS_HELP = "Params file (YAML); repeat to overlay files, later ones win (e.g. -p params.yaml -p params/demo.yaml)."
SET_HELP = "Override one param after the files, e.g. --set cogr.rounds=3 (repeatable)."
DEMO_PARAMS = (Path("params.yaml"), Path("params") / "demo.yaml")


def _environment(verbose: bool) -> None:
    """Offline models, a quiet Prefect console, and time for the local server to start."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    # The local server's usage telemetry races its own first database migration (a noisy
    # "database is locked" traceback) and phones home; neither helps a training run.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    if not verbose:
        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


class _RichSteps:
    """Draws the flow's steps as a rich progress bar (one line per finished step)."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), console=err_console, transient=False,
        )
        self.task_id = None
        self.started_at = 0.0

    def plan(self, total: int, title: str) -> None:
        if self.task_id is None:
            self.task_id = self.progress.add_task(title, total=total)
        else:
            self.progress.update(self.task_id, description=title, total=total, completed=0)

    def started(self, label: str) -> None:
        self.started_at = time.perf_counter()
        if self.task_id is not None:
            self.progress.update(self.task_id, description=label)

    def finished(self, label: str, cached: bool) -> None:
        seconds = time.perf_counter() - self.started_at
        how = "[dim]cached[/]" if cached else f"[green]done[/] in {seconds:.1f}s"
        self.progress.console.print(f"  {label}: {how}")
        if self.task_id is not None:
            self.progress.advance(self.task_id)


def load_flow(method: str) -> Any:
    """`flows/<method>.py:<method>_flow` of the project in the working directory."""
    entry = Path("flows") / f"{method}.py"
    if not entry.exists():
        raise FileNotFoundError(f"{entry.resolve()}: no such flow; run coevo from the project root (the folder "
                                "holding params.yaml, flows/ and tasks/)")
    from prefect.flows import load_flow_from_entrypoint

    return load_flow_from_entrypoint(f"{entry}:{method}_flow")


def run_method(
    method: str,
    params_paths: list[Path],
    overrides: list[str],
    stage: str = "all",
    verbose: bool = False,
    extra: dict[str, Any] | None = None,
    always: bool = False,
) -> dict[str, Any]:
    """Validate params, run the method's flow with progress (or report it up to date), print the table."""
    from coevo.checks import TrackingError, check_reachable
    from coevo.config import load_params
    from coevo.pipeline import Pipeline, check_stage, wants

    params = load_params(params_paths, overrides)  # bad params: fail here, before any work
    check_stage(stage)
    if wants(stage, "evaluate"):
        try:
            check_reachable(params.tracking.uri)
        except TrackingError as exc:
            raise ValueError(str(exc)) from None
    started = time.perf_counter()
    pipe = Pipeline(method, params)
    if not (extra or always) and pipe.up_to_date(stage):
        last = pipe.last_summary() if wants(stage, "evaluate") else None
        summary = dict(last or {"method": method, "rows": []})
        summary.update(steps={"executed": 0, "cached": 0}, seconds=time.perf_counter() - started, up_to_date=True)
        what = "step" if stage == "all" else f"{stage} step"
        console.print(f"[green]up to date[/]: every {what} of {method} on {params.data.dataset} is finished with "
                      "these inputs (data, params, code); nothing ran.", soft_wrap=True)
        print_summary(summary)
        return summary
    _environment(verbose)
    flow_fn = load_flow(method)
    from coevo import progress

    steps = _RichSteps()
    with progress.listening(steps), steps.progress:
        summary = flow_fn(params_path=[str(p) for p in params_paths], overrides=list(overrides), stage=stage,
                          **(extra or {}))
    summary["seconds"] = time.perf_counter() - started
    print_summary(summary)
    return summary


def print_summary(summary: dict[str, Any]) -> None:
    from coevo.report import metrics_table

    metrics = summary.get("table_metrics") or ("f1", "recall@100", "ndcg@10")
    if summary.get("up_to_date") and summary.get("mlflow"):
        console.print("results of the last run:")
    if summary.get("rows"):
        console.print(metrics_table(summary["rows"], metrics, title=f"{summary['method']}: results"))
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


def _method_command(method: str, doc: str) -> None:
    def command(
        params: list[Path] = typer.Option([Path("params.yaml")], "--params", "-p", help=PARAMS_HELP),
        overrides: list[str] = typer.Option([], "--set", "-s", help=SET_HELP),
        stage: str = typer.Option("all", "--stage", help=STAGE_HELP),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="Show Prefect's task logs."),
        log_run: bool = typer.Option(False, "--log-run", help="Start the flow even when every step is up to date "
                                     "(a new Prefect flow run and MLflow run, all steps from cache)."),
    ) -> None:
        with user_errors():
            run_method(method, params, overrides, stage, verbose, always=log_run)

    command.__doc__ = doc
    app.command(method, help=doc)(command)


_method_command("cogr", "CoGR: Algorithm 1 SFT, alternating query/item GRPO rounds, BM25 baseline, Lucene export.")
_method_command("grape", "GRAPE: GRPO query rewriter against a frozen retriever, corpus-rank reward.")
_method_command("cohyde", "CoHyDE: co-train a HyDE rewriter (DPO) and a dense encoder, per-group metrics.")


def register_top_level(root: typer.Typer) -> None:
    """Commands that sit at the top level of `coevo`."""

    @root.command("demo")
    def demo(
        overrides: list[str] = typer.Option([], "--set", "-s", help="Extra overrides on top of params/demo.yaml."),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="Show Prefect's task logs."),
    ) -> None:
        """The whole CoGR pipeline on the embedded MetaTool sample, on CPU, with SmolLM2-135M
        (params.yaml overlaid with params/demo.yaml)."""
        with user_errors():
            console.print("[bold]coevo demo[/]: CoGR on data/sample/metatool with smollm2-135m (CPU), "
                          "params.yaml + params/demo.yaml", soft_wrap=True)
            run_method("cogr", list(DEMO_PARAMS), list(overrides), "all", verbose)
            console.print(
                "next: `coevo ui` (MLflow at http://127.0.0.1:5000), `dvc repro` (pipeline), "
                "`dvc metrics show`, `dvc plots show`", soft_wrap=True
            )

    @root.command("ui")
    def ui(
        params: Path = typer.Option(Path("params.yaml"), "--params", "-p", help="Params file (tracking.uri)."),
        port: int = typer.Option(5000, "--port", help="MLflow UI port."),
        prefect: bool = typer.Option(False, "--prefect", help="Also start the Prefect UI (port 4200)."),
        prefect_port: int = typer.Option(4200, "--prefect-port", help="Prefect UI port."),
    ) -> None:
        """Start the MLflow UI (and the Prefect UI with --prefect) on 127.0.0.1 and print the URLs."""
        with user_errors():
            serve_uis(params, port, prefect, prefect_port)


def serve_uis(params_path: Path, port: int, prefect: bool, prefect_port: int, wait: bool = True) -> list[Any]:
    import shutil
    import subprocess
    import sys

    from coevo.config import load_params

    params = load_params(params_path)
    bin_dir = Path(sys.executable).parent
    mlflow_bin = shutil.which("mlflow", path=str(bin_dir)) or "mlflow"
    procs = [
        subprocess.Popen(
            [mlflow_bin, "ui", "--backend-store-uri", params.tracking.uri, "--host", "127.0.0.1", "--port", str(port),
             "--workers", "1"]
        )
    ]
    console.print(f"MLflow UI:  http://127.0.0.1:{port}   (store {params.tracking.uri}, artifacts {params.tracking.artifact_root}/)")
    if prefect:
        prefect_bin = shutil.which("prefect", path=str(bin_dir)) or "prefect"
        procs.append(
            subprocess.Popen([prefect_bin, "server", "start", "--host", "127.0.0.1", "--port", str(prefect_port)])
        )
        console.print(f"Prefect UI: http://127.0.0.1:{prefect_port}")
    if not wait:
        return procs
    console.print("Ctrl-C stops them.")
    import signal

    def _stop(_signum: int, _frame: Any) -> None:  # `kill`/`timeout` must stop the servers too
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    try:
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
    failed = [p for p in procs if p.returncode not in (0, -15, None)]
    if failed:
        raise typer.Exit(code=1)
    return procs

