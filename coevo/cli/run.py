"""`coevo run ...` (Prefect flows), `coevo demo` and `coevo ui`."""

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

# `coevo demo`: the whole CoGR pipeline on the committed MetaTool sample, sized so that it
# finishes within 15 minutes on 2 CPU cores with the offline SmolLM2-135M (measured; see
# the README). Everything else comes from params.yaml.
DEMO_OVERRIDES: tuple[str, ...] = (
    "data.dataset=metatool_sample",
    "data.loader=metatool",
    "data.source=data/sample/metatool",
    "cogr.generator=smollm2-135m",
    "cogr.rounds=1",
    "cogr.max_train_queries=48",
    # Measured on this sample: G_0 seeds at 0.3 and LoRA on every linear layer are what let
    # a few minutes of SFT fit the Algorithm 1 targets (val F1 0.33 vs 0.03 with q/v only).
    "cogr.seed_temperature=0.3",
    "cogr.lora.r=16",
    "cogr.lora.alpha=32",
    "cogr.lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
    "cogr.sft.epochs=3",
    "cogr.sft.learning_rate=1e-3",
    "cogr.grpo.num_generations=4",
    "cogr.grpo.batch_size=8",
    "cogr.grpo.max_prompts_per_phase=4",
    "cogr.grpo.max_completion_length=32",
    "cogr.sampling.max_new_tokens=32",
)


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


def run_method(
    method: str,
    params_path: Path,
    overrides: list[str],
    stage: str = "all",
    verbose: bool = False,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Validate params, run the method's flow with progress, print the results table."""
    from coevo.config import load_params

    params = load_params(params_path, overrides)  # bad params: fail here, before any work
    if stage not in ("all", "prepare", "validate", "train", "evaluate"):
        raise ValueError(f"--stage {stage!r}: expected all, prepare, validate, train or evaluate")
    _environment(verbose)
    from tasks.tracking import TrackingError, check_reachable

    if stage in ("all", "evaluate"):
        try:
            check_reachable(params.tracking.uri)
        except TrackingError as exc:
            raise ValueError(str(exc)) from None

    import importlib

    from flows.common import listening

    flow_fn = getattr(importlib.import_module(f"flows.{method}"), f"{method}_flow")
    steps = _RichSteps()
    started = time.perf_counter()
    with listening(steps), steps.progress:
        summary = flow_fn(params_path=str(params_path), overrides=list(overrides), stage=stage, **(extra or {}))
    summary["seconds"] = time.perf_counter() - started
    print_summary(summary)
    return summary


def print_summary(summary: dict[str, Any]) -> None:
    from coevo.report import metrics_table

    metrics = summary.get("table_metrics") or ("f1", "recall@100", "ndcg@10")
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
        params: Path = typer.Option(Path("params.yaml"), "--params", "-p", help="Params file (YAML)."),
        overrides: list[str] = typer.Option(
            [], "--set", "-s", help="Override one param, e.g. --set cogr.rounds=3 (repeatable)."
        ),
        stage: str = typer.Option("all", "--stage", help=STAGE_HELP),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="Show Prefect's task logs."),
    ) -> None:
        with user_errors():
            run_method(method, params, overrides, stage, verbose)

    command.__doc__ = doc
    app.command(method, help=doc)(command)


_method_command("cogr", "CoGR: Algorithm 1 SFT, alternating query/item GRPO rounds, BM25 baseline, Lucene export.")
_method_command("grape", "GRAPE: GRPO query rewriter against a frozen retriever, corpus-rank reward.")
_method_command("cohyde", "CoHyDE: co-train a HyDE rewriter (DPO) and a dense encoder, per-group metrics.")


def register_top_level(root: typer.Typer) -> None:
    """Commands that sit at the top level of `coevo`."""

    @root.command("demo")
    def demo(
        params: Path = typer.Option(Path("params.yaml"), "--params", "-p", help="Params file (YAML)."),
        overrides: list[str] = typer.Option([], "--set", "-s", help="Extra overrides on top of the demo's."),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="Show Prefect's task logs."),
    ) -> None:
        """The whole CoGR pipeline on the embedded MetaTool sample, on CPU, with SmolLM2-135M."""
        with user_errors():
            console.print(
                "[bold]coevo demo[/]: CoGR on data/sample/metatool with smollm2-135m (CPU). "
                "Demo-sized knobs: " + " ".join(DEMO_OVERRIDES), soft_wrap=True
            )
            run_method("cogr", params, [*DEMO_OVERRIDES, *overrides], "all", verbose)
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

