"""`coevo train ...` commands: run a method's training loop in-process (no Prefect, no MLflow)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from coevo.cli.common import console, user_errors

app = typer.Typer(help="Train a method in-process on a prepared data set (resumable).", no_args_is_help=True)

TABLE_METRICS = ("eval/f1", "eval/recall@100", "eval/ndcg@10")


@app.command()
def cogr(
    params: Path = typer.Option(Path("params.yaml"), "--params", "-p", help="Params file (the cogr section is used)."),
    set_: list[str] = typer.Option([], "--set", help="Override a param, KEY=VALUE (repeatable), e.g. cogr.rounds=1."),
    data: Optional[Path] = typer.Option(
        None, "--data", "-d", help="Prepared data set folder; default: <data.root>/processed/<data.dataset>."
    ),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Run folder (checkpoints, indexes, metrics); default: <data.root>/models/cogr. "
        "Re-running with the same folder resumes at the last finished phase."
    ),
    bm25: bool = typer.Option(False, "--bm25", help="Add a BM25 (Lucene, raw item text) row to the table; needs Java."),
    vllm: bool = typer.Option(False, "--vllm", help="Generate GRPO rollouts with vLLM (GPU workers with vllm installed)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars."),
) -> None:
    """CoGR: Algorithm 1 SFT, then alternating query/item GRPO phases with early stopping."""
    with user_errors():
        from coevo.config import load_params
        from coevo.methods.cogr import CoGRRun

        loaded = load_params(params, set_)
        root = Path(loaded.data.root)
        data_dir = data or root / "processed" / loaded.data.dataset
        run_dir = out or root / "models" / "cogr"
        run = CoGRRun(run_dir, loaded, data_dir, progress=not quiet, use_vllm=vllm)
        history = run.run(progress=None if quiet else lambda m: console.print(f"[green]done[/] {m}", highlight=False))
        baseline = _bm25_row(run, data_dir) if bm25 else None
        console.print(results_table(history, baseline, split=loaded.cogr.eval_split))
        console.print(f"run folder: {run_dir}  (best phase: {run.best_phase()})", highlight=False)


def _bm25_row(run, data_dir: Path) -> dict[str, float] | None:
    try:
        from coevo.retrieval.lucene import bm25_baseline
    except ImportError as exc:  # the Lucene module belongs to the baseline work; absent = no row
        console.print(f"[yellow]BM25 row skipped:[/] {exc}")
        return None
    metrics = bm25_baseline(run.dataset, run.cfg.eval_split, 1000)
    return {f"eval/{k}": float(v) for k, v in metrics.items() if isinstance(v, (int, float))}


def results_table(history: list[dict], baseline: dict[str, float] | None = None, *, split: str = "val"):
    """Rich table: one row per phase (and BM25 when given) with set F1, Recall@100, NDCG@10."""
    from rich.table import Table

    table = Table(title=f"CoGR on the {split} split")
    table.add_column("phase")
    table.add_column("round", justify="right")
    for name in ("set F1", "Recall@100", "NDCG@10", "train reward", "train KL"):
        table.add_column(name, justify="right")
    if baseline:
        table.add_row("BM25 (raw text)", "", *(_fmt(baseline.get(m)) for m in TABLE_METRICS), "", "")
    for row in history:
        label = {"sft": "SFT (Algorithm 1)", "base": "base (no SFT)"}.get(row["kind"], f"{row['kind']} GRPO")
        table.add_row(
            label,
            str(row["round"]),
            *(_fmt(row.get(m)) for m in TABLE_METRICS),
            _fmt(row.get("train/reward_mean")),
            _fmt(row.get("train/kl")),
        )
    return table


def _fmt(value) -> str:
    return "" if value is None else f"{value:.4f}"
