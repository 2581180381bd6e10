"""`coevo baseline ...` commands: reference retrievers evaluated with the project's metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from coevo.cli.common import console, user_errors

app = typer.Typer(help="Baseline retrievers (Lucene BM25) evaluated with the same metrics as the methods.", no_args_is_help=True)


def metrics_table(metrics: dict[str, float], title: str):
    """A rich table: set metrics first, then ranked metrics grouped by cut-off."""
    from rich.table import Table

    table = Table(title=title, min_width=max(40, len(title) + 4), show_lines=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    set_keys = [k for k in ("precision", "recall", "f1") if k in metrics]
    ranked = sorted((k for k in metrics if "@" in k), key=lambda k: (int(k.split("@")[1]), k.split("@")[0]))
    others = sorted(k for k in metrics if k not in set_keys and k not in ranked)
    for key in set_keys + ranked + others:
        table.add_row(key if "@" in key else f"{key} (set)" if key in set_keys else key, f"{metrics[key]:.4f}")
    return table


def default_out(data_dir: Path) -> Path:
    """Default metrics file of `coevo baseline bm25`: next to the data set, not in the cwd."""
    return data_dir / "baseline_bm25" / "metrics.json"


@app.command()
def bm25(
    data_dir: Path = typer.Argument(..., help="A prepared data set folder (items/queries/qrels.parquet, dataset.json)."),
    split: str = typer.Option("test", "--split", help="Query split to evaluate: train, val or test."),
    k: int = typer.Option(1000, "--k", min=1, help="Documents retrieved per query; set metrics use this top-k as the retrieved set."),
    out: Optional[Path] = typer.Option(
        None,
        "--out",
        "-o",
        help="Where to write the metrics JSON, atomically (default: DATA_DIR/baseline_bm25/metrics.json, "
        "never the pipeline's metrics.json in the current folder).",
        show_default=False,
    ),
    index_dir: Optional[Path] = typer.Option(None, "--index-dir", help="Keep the Lucene index here (default: a temporary folder)."),
    threads: int = typer.Option(2, "--threads", min=1, help="Indexing and search threads."),
) -> None:
    """Lucene BM25 (pyserini) over each item's title + text, queried with the query text."""
    with user_errors():
        from coevo.data.schema import Dataset
        from coevo.io import write_json
        from coevo.retrieval.lucene import bm25_baseline

        dataset = Dataset.load(data_dir)
        with console.status(f"BM25 on {dataset.name} ({split}, k={k}): indexing and searching"):
            metrics = bm25_baseline(dataset, split=split, k=k, index_dir=index_dir, threads=threads)
        out = out if out is not None else default_out(data_dir)
        write_json(out, metrics)
        console.print(metrics_table(metrics, f"BM25 baseline: {dataset.name}, split {split}, top {k}"))
        console.print(f"wrote {out}")
