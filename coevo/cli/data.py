"""`coevo data ...` commands: prepare, validate, summary, build-sample."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Optional

import typer

from coevo.cli.common import console, err_console, user_errors

app = typer.Typer(help="Prepare, validate and summarise data sets (items / queries / qrels).", no_args_is_help=True)

LOADER_NAMES = "metatool, stabletoolbench, wands, beir, image_captions, prepared"


def _parse_options(pairs: list[str]) -> dict[str, object]:
    """KEY=VALUE loader options; values are parsed as JSON where possible (true, 3, "x")."""
    options: dict[str, object] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"--option {pair!r}: expected KEY=VALUE, e.g. lang=en")
        key, raw = pair.split("=", 1)
        try:
            options[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            options[key.strip()] = raw
    return options


@app.command()
def prepare(
    dataset: str = typer.Argument(..., help=f"Data set name; also the loader unless --loader is given ({LOADER_NAMES})."),
    source: Path = typer.Option(..., "--source", "-s", help="Folder with the raw source files."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder to write items/queries/qrels.parquet and dataset.json into."),
    loader: Optional[str] = typer.Option(None, "--loader", "-l", help=f"Loader to use ({LOADER_NAMES}); default: DATASET."),
    seed: int = typer.Option(42, help="Seed of the train/val/test split (sources without a split)."),
    val_fraction: float = typer.Option(0.15, help="Share of queries (with a relevant item) drawn for val."),
    test_fraction: float = typer.Option(0.15, help="Share of queries (with a relevant item) drawn for test."),
    download: bool = typer.Option(False, "--download", help="wands only: fetch the official files into --source first (size-checked cache)."),
    option: list[str] = typer.Option([], "--option", help="Extra loader option KEY=VALUE, repeatable (e.g. lang=en for image_captions, include_multi_tool=false for metatool)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show tracebacks."),
) -> None:
    """Read a raw source into the three parquet tables, then print its summary."""
    with user_errors(verbose):
        from coevo.checks import check_writable
        from coevo.data.download import DownloadError
        from coevo.data.loaders import load_source
        from coevo.data.summary import print_summary, summarize

        check_writable(out, "--out")  # before reading the source
        options = _parse_options(option)
        if download:
            options["download"] = True
        try:
            with console.status(f"loading {source} ({loader or dataset})"):
                ds = load_source(
                    loader or dataset, source, seed=seed, val_fraction=val_fraction,
                    test_fraction=test_fraction, name=dataset, **options,
                )
        except DownloadError as exc:
            raise ValueError(str(exc)) from None
        ds.save(out)
        print_summary(summarize(ds), console)
        console.print(f"wrote {out}/{{items,queries,qrels}}.parquet and dataset.json; next: coevo data validate {out}")


@app.command()
def validate(
    directory: Path = typer.Argument(..., help="A prepared data set folder."),
    report: Optional[Path] = typer.Option(None, "--report", "-r", help="Report path (JSON; a .md twin is written beside it). Default: DIR/validation.json."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show tracebacks."),
) -> None:
    """Check the data contract with Great Expectations; exit 0 only when every expectation holds."""
    with user_errors(verbose):
        from coevo.checks import check_writable
        from coevo.data.validation import validate as run_validation

        report_path = report or directory / "validation.json"
        if report_path.is_dir():
            raise IsADirectoryError(errno.EISDIR, "is a folder; give the path of the JSON report to write", str(report_path))
        check_writable(report_path.parent, "--report")

        with console.status(f"validating {directory} (Great Expectations)"):
            result = run_validation(directory, report_path=report_path)
        if result.ok:
            console.print(f"[green]valid[/]: {result.dataset}, {len(result.checks)} expectations hold; report {result.report_path}")
            return
        err_console.print(result.message(), highlight=False, soft_wrap=True)
        raise typer.Exit(code=1)


@app.command()
def summary(
    directory: Path = typer.Argument(..., help="A prepared data set folder."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON instead of tables."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show tracebacks."),
) -> None:
    """Counts per split, relevant items per query, items never relevant, groups."""
    with user_errors(verbose):
        from coevo.data.schema import Dataset
        from coevo.data.summary import print_summary, summarize

        result = summarize(Dataset.load(directory))
        if as_json:
            typer.echo(json.dumps(result, indent=2, ensure_ascii=False))
        else:
            print_summary(result, console)


@app.command("build-sample")
def build_sample(
    name: str = typer.Argument(..., help="Sample to build: metatool or stabletoolbench."),
    source: Path = typer.Option(..., "--source", "-s", help="Folder of the full public data set."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder to write the sample into (e.g. data/sample/metatool)."),
    seed: int = typer.Option(42, help="Seed of the subset draw."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show tracebacks."),
) -> None:
    """Rebuild an embedded sample (raw format + LICENSE + ATTRIBUTION.md) from the full set."""
    with user_errors(verbose):
        from coevo.checks import check_writable

        check_writable(out, "--out")
        from coevo.data.sample import build_sample as run_build

        counts = run_build(name, source, out, seed=seed)
        console.print(f"wrote {out}: {json.dumps(counts)}")
