"""`coevo train METHOD`: a method's train stage in-process (no Prefect, no MLflow).

It runs the same phases with the same staleness keys as `coevo run`, in the same run folder
by default, so either command resumes, or re-runs only what a changed knob touches, after
the other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from coevo.cli.common import console, user_errors

app = typer.Typer(help="Train a method in-process on a prepared data set (resumable).", no_args_is_help=True)


def _train(method: str, params: list[Path], overrides: list[str], data: Optional[Path], out: Optional[Path],
           quiet: bool, **kwargs) -> None:
    from coevo.config import load_params
    from coevo.layout import Layout
    from coevo.methods.base import method_class

    loaded = load_params(params, overrides)
    layout = Layout.of(loaded, method)
    data_dir = data or layout.processed
    run_dir = out or layout.run_dir
    run = method_class(method)(run_dir, loaded, data_dir, progress=not quiet, **kwargs)

    def done(phase, record) -> None:
        if not quiet:
            shown = " ".join(f"{k}={record['eval'][k]:.4f}" for k in run.table_metrics if k in record.get("eval", {}))
            console.print(f"[green]done[/] {phase.label} {shown}", highlight=False)

    rows = run.run(on_phase=done)
    console.print(results_table(run, rows))
    console.print(f"run folder: {run_dir}  (best phase on val: {run.best_phase()})", highlight=False)


def _command(method: str, doc: str, vllm: bool = False) -> None:
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
        use_vllm: bool = typer.Option(False, "--vllm", help="Generate GRPO rollouts with vLLM (GPU workers)."),
    ) -> None:
        with user_errors():
            _train(method, params, set_, data, out, quiet, **({"use_vllm": use_vllm} if use_vllm else {}))

    command.__doc__ = doc
    app.command(method, help=doc)(command)


_command("cogr", "CoGR: Algorithm 1 SFT, then alternating query/item GRPO phases with early stopping on val.")
_command("grape", "GRAPE: GRPO query rewriter against a frozen retriever (corpus-rank reward).")
_command("cohyde", "CoHyDE: S1a encoder, S1b rewriter warm-up, then rounds of S2-S4 + DPO with early stopping.")


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
