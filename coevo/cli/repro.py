"""`coevo repro check|record`: the expected-score matrix in repro/expected.yaml.

`check` runs the entries and prints every figure as matched or failed with its difference
(exit 1 when one fails); `record` runs them (twice by default) and writes the figures as the
expected values. Fast entries use the committed samples; `--slow` adds the full data sets
under ../shared/data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from coevo.cli.common import console, err_console

app = typer.Typer(
    help="Expected-score matrix (repro/expected.yaml): data set x baseline or method x metric -> expected value. "
    "`check` re-runs the entries and compares; `record` writes the values from real runs.",
    no_args_is_help=True,
)

_SLOW = "Also run the slow entries (full data sets under ../shared/data); an absent source is reported as skipped."
_ONLY = ("Run only entries whose id matches this glob, e.g. 'metatool_sample/*' or '*@fp32' (repeatable). An id is "
         "DATASET/SYSTEM, with @bf16 or @fp32 for an entry whose figures hold for one numerics only.")
_FILE = "The matrix file (default: repro/expected.yaml of the project)."


def _file(path: Optional[Path]) -> Path:
    from coevo.orchestration.repro_matrix import EXPECTED

    return path if path is not None else EXPECTED


def _say(message: str) -> None:
    err_console.print(f"[dim]{message}[/]", highlight=False)


class _ReproState:
    """What `coevo repro` is doing, for the log file's name and the line printed when it is interrupted."""

    def __init__(self, command: str) -> None:
        self.command = f"repro-{command}"
        self.log_path: Path | None = None

    def interrupted(self) -> str:
        return f"coevo {self.command.replace('-', ' ')} interrupted: nothing was written to the matrix"


_VERBOSE = "Keep library output (trainer logs, progress bars) on the terminal instead of logs/coevo-repro-*.log."


def outcome_tables(outcomes, commands=None):
    """One table per entry (its command under the title): metric, expected, got, difference,
    tolerance, status."""
    from rich import box
    from rich.table import Table

    colours = {"matched": "green", "failed": "bold red", "missing": "bold red", "unrecorded": "yellow",
               "skipped": "yellow"}

    def fmt(value) -> str:
        return "-" if value is None else f"{value:.6g}"

    tables = []
    for entry in dict.fromkeys(o.entry for o in outcomes):
        mine = [o for o in outcomes if o.entry == entry]
        matched = sum(o.status == "matched" for o in mine)
        title = f"{entry}: {matched}/{len(mine)} matched"
        command = (commands or {}).get(entry)
        table = Table(title=title, title_justify="left", caption=command, caption_justify="left", box=box.SIMPLE)
        for name, justify in (("metric", "left"), ("expected", "right"), ("got", "right"), ("difference", "right"),
                              ("tolerance", "right"), ("status", "left")):
            table.add_column(name, justify=justify, overflow="fold")
        for o in mine:
            diff = o.difference
            status = f"[{colours[o.status]}]{o.status}[/]" + (f" ({o.note})" if o.note else "")
            table.add_row(o.metric, fmt(o.expected), fmt(o.got), "-" if diff is None else f"{diff:+.2g}",
                          f"{o.tolerance:.0e}", status)
        tables.append(table)
    return tables


@app.command()
def check(
    slow: bool = typer.Option(False, "--slow", help=_SLOW),
    only: list[str] = typer.Option([], "--only", help=_ONLY),
    file: Optional[Path] = typer.Option(None, "--file", help=_FILE),
    verbose: bool = typer.Option(False, "--verbose", "-v", help=_VERBOSE),
) -> None:
    """Run the matrix's entries and print each figure as matched or failed, with the difference."""
    from coevo.cli.run import library_output, run_errors

    state = _ReproState("check")
    with run_errors(state, verbose):
        from coevo.orchestration import repro_matrix

        path = _file(file)
        repro_matrix.load(path)  # a malformed matrix is refused before any output is redirected
        with library_output(state, verbose):
            outcomes = repro_matrix.check(path, slow=slow, only=only, say=_say)
        commands = {e.id: e.command for e in repro_matrix.load(path).entries}
        for table in outcome_tables(outcomes, commands):
            console.print(table)
        counts = repro_matrix.summary(outcomes)
        line = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        ok = repro_matrix.passed(outcomes)
        console.print(f"{'[green]passed[/]' if ok else '[bold red]FAILED[/]'}: {line}", highlight=False)
        if not ok:
            raise typer.Exit(code=1)


@app.command()
def record(
    slow: bool = typer.Option(False, "--slow", help="Also record the slow entries (full data sets under ../shared/data)."),
    only: list[str] = typer.Option([], "--only", help=_ONLY),
    runs: int = typer.Option(2, "--runs", min=1, help="Runs per entry; a figure that differs between runs by more "
                             "than its tolerance is not recorded (an error names it)."),
    vary_threads: bool = typer.Option(False, "--vary-threads", help="Run k uses k torch threads (another summation "
                                      "order, as on another CPU), so a figure that passes is stable across both."),
    file: Optional[Path] = typer.Option(None, "--file", help=_FILE),
    verbose: bool = typer.Option(False, "--verbose", "-v", help=_VERBOSE),
) -> None:
    """Run the entries (twice by default) and write their figures as the expected values.

    Refuses a tree with uncommitted changes (each entry is stamped with the commit and the numerics
    it ran under). Entries keyed by other numerics than this machine's are left as they are;
    ONEDNN_MAX_CPU_ISA=AVX2 records the fp32 ones on a bf16 CPU.
    """
    from coevo.cli.run import library_output, run_errors

    state = _ReproState("record")
    with run_errors(state, verbose):
        from coevo.orchestration import repro_matrix

        path = _file(file)
        repro_matrix.load(path)
        with library_output(state, verbose):
            recorded = repro_matrix.record(path, slow=slow, only=only, runs=runs, vary_threads=vary_threads, say=_say)
        figures = sum(len(v) for v in recorded.values())
        console.print(f"recorded {figures} figures of {len(recorded)} entries into {path} "
                      f"(each reproduced over {runs} run(s))")


if __name__ == "__main__":
    app()
