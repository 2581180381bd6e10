"""Variants side by side: efficacy runs of one method that differ in one setting, as rows of one report.

Each ``NAME=FOLDER`` is the ``--out`` folder of a finished ``bench/efficacy.py`` run of the same
method, data and seed (for example CoGR's default, ``--set cogr.item_context=title_only`` and
``--set cogr.query_context=search_results``, the rows of the CoGR paper's Table 4). The first
is the reference. Per variant, from what its run stamped (nothing is retrained or re-evaluated):

- the phase its val split chose and that phase's val headline metric (what picks a variant);
- the chosen phase's test mean with its 95% bootstrap CI, and the paired difference from the
  reference's chosen phase over the same test queries (95% paired-bootstrap CI, p-value);
- the same for the start phase (CoGR's SFT, GRAPE's untrained rewriter, CoHyDE's vanilla HyDE):
  the same training for every variant, so the setting's effect apart from how many phases each
  run's budget fitted;
- all of it on the vague split too where the runs measured it (``--vague test_copy``).

Printed: the table, then ``val chooses: <name>`` (the highest val headline; test is only read).
Written to ``--out``: ``variants.json``, ``variants.csv`` and ``variants.png`` (each split's
headline per variant with its CI).

Usage::

    python bench/variants.py default=/work/runs/cogr_default_s42 \\
        title_only=/work/runs/cogr_title_only_s42 search_results=/work/runs/cogr_search_results_s42
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


SPLITS = ("test", "vague")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="The runs must share method, data and seed: their test queries are paired by id.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="NAME=FOLDER",
                        help="an efficacy run's --out folder and the name of its row; the first is the reference")
    parser.add_argument("--out", type=Path, default=None,
                        help="where variants.json/.csv/.png go (default: the reference run's folder)")
    return parser.parse_args(argv)


def named_folders(specs: list[str]) -> dict[str, Path]:
    runs: dict[str, Path] = {}
    for spec in specs:
        name, sep, folder = spec.partition("=")
        if not sep or not name or not folder:
            raise SystemExit(f"variants: {spec!r} is not NAME=FOLDER")
        if name in runs:
            raise SystemExit(f"variants: the name {name!r} is given twice")
        runs[name] = Path(folder)
    return runs


def read_run(name: str, folder: Path) -> dict[str, Any]:
    """What one finished efficacy run stamped: its method, final tables and per-query values."""
    from coevo.orchestration.pipeline import STEPS_DIR
    from coevo.steps import read_stamp

    steps = folder / STEPS_DIR
    reports = sorted(steps.glob("*/*_efficacy/*-reports.json"))
    if not reports:
        raise SystemExit(f"variants: {name}: {folder} holds no finished efficacy run "
                         f"(no {STEPS_DIR}/<method>/<method>_efficacy/<method>-reports.json)")
    if len(reports) > 1:
        raise SystemExit(f"variants: {name}: {folder} holds runs of several methods: "
                         + ", ".join(str(p.relative_to(folder)) for p in reports))
    method = reports[0].parent.parent.name
    run = {"name": name, "folder": str(folder), "method": method, "table": _result(reports[0], name)["table"],
           "final": {}}
    for split in SPLITS:
        path = reports[0].parent / (f"{method}-final.json" if split == "test" else f"{method}-final-{split}.json")
        stamp = read_stamp(path)
        if split == "test" or (stamp and stamp.get("state") == "done"):
            run["final"][split] = _result(path, name, stamp)
        elif stamp:  # an evaluation still running (or killed): the split is left out, said once
            print(f"variants: {name}: its {split} evaluation has not finished; {split} is left out", file=sys.stderr)
    return run


def _result(path: Path, name: str, stamp: dict[str, Any] | None = None) -> dict[str, Any]:
    """The result of a finished step's stamp (read from ``path`` unless given)."""
    from coevo.steps import read_stamp

    stamp = stamp if stamp is not None else read_stamp(path)
    if not stamp or stamp.get("state") != "done" or "result" not in stamp:
        raise SystemExit(f"variants: {name}: {path} is not a finished step (state {stamp and stamp.get('state')!r})")
    return stamp["result"]


def val_of(table: dict[str, Any], phase: str) -> float:
    """``phase``'s val headline value in the final table."""
    row = next((r for r in table["rows"] if r.get("split") == table["val_split"] and r.get("phase") == phase), None)
    if row is None:
        raise SystemExit(f"variants: the final table has no val row of phase {phase!r}")
    return float(row[table["headline"]])


def per_query(final: dict[str, Any], metric: str, phase: str = "best_phase") -> dict[str, float]:
    """The per-query ``metric`` of the run's chosen phase (``best_phase``) or of its start (``start_phase``)."""
    row = next(r for r in final["rows"] if r["phase"] == final[phase])
    return row["per_query"][metric]


def compare(runs: list[dict[str, Any]], bootstrap: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per variant: val choice, each split's mean and CI, and its difference from the first."""
    from coevo.stats import mean_ci, paired_difference

    reference = runs[0]
    metric = reference["table"]["headline"]
    settings = {"resamples": bootstrap["resamples"], "seed": bootstrap["seed"], "confidence": bootstrap["confidence"]}
    rows = []
    for run in runs:
        if run["method"] != reference["method"]:
            raise SystemExit(f"variants: {run['name']} is a {run['method']} run, {reference['name']} a "
                             f"{reference['method']} run: compare variants of one method")
        phase = run["table"]["best_phase"]
        row: dict[str, Any] = {"variant": run["name"], "phase": phase, f"val_{metric}": val_of(run["table"], phase),
                               f"val_start_{metric}": val_of(run["table"], run["table"]["start_phase"]),
                               "n_val": next(r["n_queries"] for r in run["table"]["rows"]
                                             if r.get("split") == run["table"]["val_split"])}
        for split in SPLITS:
            if split not in run["final"] or split not in reference["final"]:
                continue
            # The chosen phase, then the start phase: the same training for every variant (CoGR's SFT),
            # so the variant's effect apart from how many phases its budget fitted.
            for which, prefix in (("best_phase", split), ("start_phase", f"{split}_start")):
                values = per_query(run["final"][split], metric, which)
                ci = mean_ci(values, **settings)
                row.update({f"{prefix}_{metric}": ci.mean, f"{prefix}_ci_low": ci.ci_low,
                            f"{prefix}_ci_high": ci.ci_high, f"n_{split}": ci.n})
                if which == "start_phase":
                    row["start_phase"] = run["final"][split]["start_phase"]
                if run is reference:
                    continue
                try:
                    diff = paired_difference(values, per_query(reference["final"][split], metric, which),
                                             permutations=bootstrap["permutations"], **settings)
                except ValueError as exc:
                    raise SystemExit(f"variants: {run['name']} and {reference['name']} on {split}: {exc} "
                                     "(same method, data and seed needed)") from None
                row.update({f"{prefix}_minus_reference": diff.mean, f"{prefix}_minus_reference_ci_low": diff.ci_low,
                            f"{prefix}_minus_reference_ci_high": diff.ci_high,
                            f"{prefix}_minus_reference_p": diff.p_value})
        rows.append(row)
    return rows


def measured_splits(rows: list[dict[str, Any]], metric: str) -> list[str]:
    """The splits every variant was evaluated on."""
    return [s for s in SPLITS if all(f"{s}_{metric}" in r for r in rows)]


def rich_tables(rows: list[dict[str, Any]], metric: str, method: str) -> list[Any]:
    """Per split, two tables: each variant at the phase its val chose, then at its start phase (the
    same training for all); each with its paired difference from the reference (the first row)."""
    from rich.table import Table

    reference = rows[0]["variant"]
    tables = []
    for split in measured_splits(rows, metric):
        for prefix, phase_key, what in ((split, "phase", "the phase its val chose"),
                                        (f"{split}_start", "start_phase", "its start phase (the same training)")):
            table = Table(title=f"{method} variants on {split} (n={rows[0][f'n_{split}']}), each at {what}",
                          title_justify="left")
            for name in ("variant", "phase", f"val {metric}", f"{split} {metric} [95% CI]",
                         f"minus {reference} [95% CI]", "p"):
                table.add_column(name, justify="left" if name in ("variant", "phase") else "right", no_wrap=True)
            for row in rows:
                val = f"{row[f'val_{metric}' if phase_key == 'phase' else f'val_start_{metric}']:.4f}"
                cells = [row["variant"], row[phase_key], val,
                         f"{row[f'{prefix}_{metric}']:.4f} [{row[f'{prefix}_ci_low']:.4f}, {row[f'{prefix}_ci_high']:.4f}]"]
                if f"{prefix}_minus_reference" in row:
                    low, high = row[f"{prefix}_minus_reference_ci_low"], row[f"{prefix}_minus_reference_ci_high"]
                    text = f"{row[f'{prefix}_minus_reference']:+.4f} [{low:+.4f}, {high:+.4f}]"
                    cells += [f"[bold]{text}[/]" if low > 0 or high < 0 else text,
                              f"{row[f'{prefix}_minus_reference_p']:.2g}"]
                else:
                    cells += ["reference", ""]
                table.add_row(*cells)
            tables.append(table)
    return tables


def plot(rows: list[dict[str, Any]], metric: str, method: str, dest: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    splits = measured_splits(rows, metric)
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(rows) * len(splits), 4.0))
    width = 0.8 / len(rows)
    for i, row in enumerate(rows):
        xs = [j + (i - (len(rows) - 1) / 2) * width for j in range(len(splits))]
        means = [row[f"{s}_{metric}"] for s in splits]
        errors = [[m - row[f"{s}_ci_low"] for s, m in zip(splits, means)],
                  [row[f"{s}_ci_high"] - m for s, m in zip(splits, means)]]
        ax.bar(xs, means, width=width, yerr=errors, capsize=3, label=f"{row['variant']} ({row['phase']})")
    ax.set_xticks(range(len(splits)), [f"{s} (n={rows[0][f'n_{s}']})" for s in splits])
    ax.set_ylabel(metric)
    ax.set_title(f"{method}: variants, phase chosen on val (95% bootstrap CIs)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    fig.savefig(dest, dpi=120)
    plt.close(fig)
    return dest


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    from coevo import report
    from coevo.io import write_json

    args = parse_args(argv)
    folders = named_folders(args.runs)
    if len(folders) < 2:
        raise SystemExit("variants: give at least two runs (the reference first)")
    for name, folder in folders.items():
        if not folder.is_dir():
            raise SystemExit(f"variants: {name}: no such folder {folder}")
    runs = [read_run(name, folder) for name, folder in folders.items()]
    table = runs[0]["table"]
    metric, method = table["headline"], runs[0]["method"]
    rows = compare(runs, table["bootstrap"])
    out = (args.out or folders[next(iter(folders))]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "variants.json", {"method": method, "metric": metric, "reference": rows[0]["variant"],
                                       "runs": {r["name"]: r["folder"] for r in runs}, "rows": rows})
    report.write_csv(rows, out / "variants.csv")
    png = plot(rows, metric, method, out / "variants.png")
    console = Console(width=120)
    for rendered in rich_tables(rows, metric, method):
        console.print(rendered)
    read = measured_splits(rows, metric)
    console.print(f"95% CIs: bootstrap over queries; differences paired by query (bold: the CI excludes 0). Val "
                  f"chooses the variant; {' and '.join(read)} {'is' if len(read) == 1 else 'are'} read once.")
    best = max(rows, key=lambda r: r[f"val_{metric}"])
    console.print(f"written: {out / 'variants.json'}, {out / 'variants.csv'}, {png}")
    print(f"val chooses: {best['variant']} (val {metric} {best[f'val_{metric}']:.4f} with {best['phase']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
