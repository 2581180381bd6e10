"""`coevo baseline bm25|dense DATA_DIR`: reference retrievers scored with the project's metrics.

Each command checks the data set's links and that the output is writable, retrieves the
val and the evaluation split, chooses k for F1@k on val, prints two tables (the headline
with 95% bootstrap CIs, and every metric at every cut-off) and writes metrics.json.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Optional

import typer

from coevo.cli.common import console, user_errors

app = typer.Typer(
    help="Baseline retrievers (Lucene BM25; dense MiniLM + faiss) scored with the methods' metrics: "
    "all cut-offs, k for F1@k chosen on val, 95% bootstrap CIs.",
    no_args_is_help=True,
)

_SPLIT_HELP = "Query split to report on: train, val or test."
_VAL_HELP = "Split on which k for F1@k is chosen (argmax over the cut-offs)."
_DEPTH_HELP = "Items retrieved per query (cut-offs above it are dropped)."
_RESAMPLES_HELP = "Bootstrap resamples of queries for the 95% CIs."


def default_out(data_dir: Path, name: str = "bm25") -> Path:
    """Default metrics file of `coevo baseline <name>`: next to the data set, not in the cwd."""
    return data_dir / f"baseline_{name}" / "metrics.json"


def check_writable(path: Path, what: str = "--out") -> None:
    """Fail in one line, before any indexing, when ``path`` (a file to write) cannot be written."""
    if path.is_dir():
        raise ValueError(f"{what} {path}: is a folder; give the path of the JSON file to write")
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".coevo-write-check-", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ValueError(f"{what} {path}: cannot write there ({exc.strerror or exc})") from None


def check_folder_writable(path: Path, what: str) -> None:
    """The parent of a folder to create (an index) must be writable."""
    check_writable(path.parent / f"{path.name}.probe", what)


def headline_table(table: Any):
    """F1@k* and the headline metrics, each with its 95% CI."""
    from rich.table import Table

    title = (
        f"{table.label}: {table.dataset}, split {table.split} ({table.n_queries} queries); "
        f"k for F1@k chosen on {table.val_split} ({table.n_val_queries} queries): k*={table.chosen_k}"
    )
    out = Table(title=title, min_width=60)
    out.add_column("metric")
    out.add_column("mean", justify="right")
    out.add_column("95% CI", justify="right")
    for name, ci in table.headline().items():
        label = f"{name} (k* on {table.val_split})" if name == table.chosen_metric else name
        out.add_row(label, f"{ci.mean:.4f}", f"[{ci.ci_low:.4f}, {ci.ci_high:.4f}]")
    return out


def cutoff_table(table: Any):
    """Every ranked metric at every cut-off (means; CIs are in metrics.json)."""
    from rich.table import Table

    out = Table(title=f"all cut-offs ({table.split}, {table.n_queries} queries; val F1@k picks k*)")
    out.add_column("k", justify="right")
    for name in ("P@k", "R@k", "F1@k", "NDCG@k", "MRR@k", "val F1@k"):
        out.add_column(name, justify="right")
    for k in table.cutoffs:
        values = [table.metrics[f"{m}@{k}"].mean for m in ("precision", "recall", "f1", "ndcg", "mrr")]
        row = [f"{v:.4f}" for v in values] + [f"{table.val_f1[k]:.4f}"]
        out.add_row(f"{k}{' *' if k == table.chosen_k else ''}", *row)
    return out


def _report(table: Any, out: Path) -> None:
    from coevo.io import write_json

    write_json(out, table.as_dict())
    console.print(headline_table(table))
    console.print(cutoff_table(table))
    console.print(f"wrote {out}")


def _load(data_dir: Path):
    from coevo.baselines import check_links
    from coevo.data.schema import Dataset

    dataset = Dataset.load(data_dir)
    check_links(dataset)
    return dataset


@app.command()
def bm25(
    data_dir: Path = typer.Argument(..., help="A prepared data set folder (items/queries/qrels.parquet, dataset.json)."),
    split: str = typer.Option("test", "--split", help=_SPLIT_HELP),
    val_split: str = typer.Option("val", "--val-split", help=_VAL_HELP),
    k1: float = typer.Option(0.9, "--k1", min=0.0, help="BM25 k1 (term-frequency saturation); 0.9 = Lucene/Anserini default."),
    b: float = typer.Option(0.4, "--b", min=0.0, max=1.0, help="BM25 b (length normalisation); 0.4 = Lucene/Anserini default."),
    k: int = typer.Option(1000, "--k", min=1, help=_DEPTH_HELP),
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
    resamples: int = typer.Option(2000, "--resamples", min=1, help=_RESAMPLES_HELP),
    seed: int = typer.Option(0, "--seed", help="Bootstrap seed."),
) -> None:
    """Lucene BM25 (pyserini) over each item's title + text, queried with the query text.

    Analyzer: Anserini's DefaultEnglishAnalyzer (Lucene standard tokenizer, lower case,
    Lucene's English stopwords removed, Porter stemming), at index and search time.
    """
    with user_errors():
        from coevo.baselines import baseline_table

        out = out if out is not None else default_out(data_dir, "bm25")
        dataset = _load(data_dir)
        check_writable(out)
        if index_dir is not None:
            check_folder_writable(index_dir, "--index-dir")
        with console.status(f"BM25 on {dataset.name} ({val_split} + {split}, k1={k1:g}, b={b:g}): indexing and searching"):
            table = baseline_table(
                dataset, "bm25", split=split, val_split=val_split, k=k, k1=k1, b=b, threads=threads,
                index_dir=index_dir, resamples=resamples, seed=seed,
            )
        _report(table, out)


@app.command()
def dense(
    data_dir: Path = typer.Argument(..., help="A prepared data set folder (items/queries/qrels.parquet, dataset.json)."),
    split: str = typer.Option("test", "--split", help=_SPLIT_HELP),
    val_split: str = typer.Option("val", "--val-split", help=_VAL_HELP),
    encoder: str = typer.Option(
        "all-minilm-l6-v2", "--encoder",
        help="Text encoder: the offline alias all-minilm-l6-v2 (packaged weights), a sentence-transformers hub id or a local folder.",
    ),
    k: int = typer.Option(1000, "--k", min=1, help=_DEPTH_HELP),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o",
        help="Where to write the metrics JSON, atomically (default: DATA_DIR/baseline_dense/metrics.json).",
        show_default=False,
    ),
    batch_size: int = typer.Option(64, "--batch-size", min=1, help="Encoding batch size."),
    device: Optional[str] = typer.Option(None, "--device", help="Torch device for the encoder (default: cpu)."),
    resamples: int = typer.Option(2000, "--resamples", min=1, help=_RESAMPLES_HELP),
    seed: int = typer.Option(0, "--seed", help="Bootstrap seed."),
) -> None:
    """Dense retrieval: a frozen text encoder embeds each item as "title: text" and each
    query; faiss ranks items by cosine similarity (exact inner product)."""
    with user_errors():
        from coevo.baselines import baseline_table

        out = out if out is not None else default_out(data_dir, "dense")
        dataset = _load(data_dir)
        check_writable(out)
        with console.status(f"dense ({encoder}) on {dataset.name} ({val_split} + {split}): encoding and searching"):
            table = baseline_table(
                dataset, "dense", split=split, val_split=val_split, k=k, encoder=encoder,
                batch_size=batch_size, device=device, resamples=resamples, seed=seed,
            )
        _report(table, out)
