"""Seeds side by side: efficacy runs of one method and setting that differ only in their seed.

Each FOLDER is the ``--out`` folder of a finished ``bench/efficacy.py`` run (or its
``efficacy.json``): the same method, data and ``--set`` list, another ``--seed`` (another split,
other sampling, another training). Nothing is retrained or re-evaluated: each run's record holds
its final tables with every paired comparison (95% bootstrap CI over that seed's queries).

Per seed and split (test, and vague where measured): the phase val chose, the metric of the run's
target line (efficacy.py's headline: CoGR f1, GRAPE recall@10, CoHyDE ndcg@5),
the paper's baseline on the same queries, the difference from it and the gain over the method's
start, each with its per-seed 95% CI and n. Across seeds: the mean and standard deviation of each
difference, a 95% t interval over the seeds (a seed is one draw of split and training, so with
three seeds the interval is wide), and in how many seeds the per-seed CI lies above 0.

Printed: the tables, then last ``<method>_seeds_vs_baseline_mean=<x> sd=<y> above_0=<k>/<n>`` on
the split the paper's comparison is read on (efficacy.py's target split). Written to ``--out``:
``seeds.json``, ``seeds.csv`` and ``seeds.png`` (each seed's difference with its CI).

Usage::

    python bench/seeds.py /work/runs/cogr_s42 /work/runs/cogr_s43 /work/runs/cogr_s44 --out /work/runs/cogr_seeds
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any


RECORD = "efficacy.json"  # what bench/efficacy.py writes in its --out folder
DIFFERENCES = ("vs_baseline", "gain")  # per seed: the paper's comparison, then the gain over the start


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="The runs must share method, data and --set list; each seed once.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="FOLDER",
                        help=f"an efficacy run's --out folder (or its {RECORD}), one per seed")
    parser.add_argument("--out", type=Path, default=None,
                        help="where seeds.json/.csv/.png go (default: the first run's folder)")
    return parser.parse_args(argv)


def read_record(path: Path) -> dict[str, Any]:
    """One finished efficacy run's record (``<folder>/efficacy.json``)."""
    file = path if path.suffix == ".json" else path / RECORD
    if not file.is_file():
        raise SystemExit(f"seeds: {path}: no {RECORD} (a finished run of bench/efficacy.py writes it; on an "
                         f"older finished folder, `bench/efficacy.py ... --budget-min 0 --out {path}` writes it "
                         "without training)")
    try:
        record = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SystemExit(f"seeds: {file}: not JSON ({exc})") from None
    missing = [k for k in ("method", "seed", "data", "overrides", "target_split", "tables") if k not in record]
    if missing:
        raise SystemExit(f"seeds: {file}: not an efficacy record (missing {', '.join(missing)})")
    return {**record, "file": str(file)}


def check_comparable(records: list[dict[str, Any]]) -> None:
    """One method, data and setting; every seed once (else the spread is not the seed's)."""
    first = records[0]
    for record in records[1:]:
        for key in ("method", "data", "overrides"):
            if record[key] != first[key]:
                raise SystemExit(f"seeds: {record['file']} has {key} {record[key]!r}, {first['file']} "
                                 f"{first[key]!r}: give runs that differ in their seed only")
    seeds = [r["seed"] for r in records]
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise SystemExit(f"seeds: seed {repeated[0]} is given twice: "
                         + ", ".join(r["file"] for r in records if r["seed"] == repeated[0]))


def target_metric(record: dict[str, Any]) -> str:
    """The metric of the run's target line (``<method>_vs_baseline_ci_low``): bench/efficacy.py's per-method
    headline (GRAPE: recall@10), which need not be the table's first column (GRAPE's: recall@1)."""
    versus = (record.get("vs_baseline") or {}).get(record["target_split"]) or {}
    return versus.get("metric") or record["tables"][record["target_split"]]["headline"]


def comparison(table: dict[str, Any], name: str, metric: str) -> dict[str, Any]:
    """The table's paired comparison ``name`` on ``metric``."""
    found = next((c for c in table["comparisons"] if c["name"] == name and c["metric"] == metric), None)
    if found is None:
        raise SystemExit(f"seeds: the {table['split']} table has no {name!r} comparison on {metric}")
    return found


def seed_rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per split of one seed's run: the chosen phase against the paper's baseline and its start."""
    from coevo.report import VS_START

    rows = []
    metric = target_metric(record)
    for split, table in record["tables"].items():
        phase = table["best_phase"]
        val = next((r[metric] for r in table["rows"]
                    if r["kind"] == "phase" and r["split"] == table["val_split"] and r["phase"] == phase), math.nan)
        versus, gain = comparison(table, table["paper_baseline"]["name"], metric), comparison(table, VS_START, metric)
        row = {"seed": record["seed"], "split": split, "n": versus["n"], "phase": phase, f"val_{metric}": val,
               metric: versus["mean_a"], "baseline": table["paper_baseline"]["row"], f"baseline_{metric}": versus["mean_b"],
               "start_phase": table["start_phase"],
               # a run resumed from an earlier process's phases has no total of its own
               "minutes": None if record.get("phases_reused") else (record.get("minutes") or {}).get("total"),
               "precision": (record.get("numerics") or {}).get("precision")}
        for name, found in zip(DIFFERENCES, (versus, gain)):
            row.update({name: found["mean"], f"{name}_ci_low": found["ci_low"], f"{name}_ci_high": found["ci_high"],
                        f"{name}_p": found["p_value"]})
        rows.append(row)
    return rows


def across_seeds(rows: list[dict[str, Any]], split: str, name: str, confidence: float = 0.95) -> dict[str, Any]:
    """Mean, sd and a t interval over the seeds of one difference, and how many seeds' CIs lie above 0."""
    values = [r[name] for r in rows if r["split"] == split]
    n = len(values)
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if n > 1 else math.nan
    if n > 1:
        from scipy.stats import t

        half = float(t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    else:
        half = math.nan
    return {"split": split, "difference": name, "seeds": n, "mean": mean, "sd": sd,
            "t_ci_low": mean - half, "t_ci_high": mean + half,
            "above_0": sum(r[f"{name}_ci_low"] > 0 for r in rows if r["split"] == split),
            "below_0": sum(r[f"{name}_ci_high"] < 0 for r in rows if r["split"] == split)}


def rich_tables(rows: list[dict[str, Any]], summary: list[dict[str, Any]], metric: str, method: str) -> list[Any]:
    """Per split: one row per seed, then the differences across seeds."""
    from rich.table import Table

    def diff_text(mean: float, low: float, high: float) -> str:
        text = f"{mean:+.4f} [{low:+.4f}, {high:+.4f}]"
        return f"[bold]{text}[/]" if low > 0 or high < 0 else text

    def columns(table: Table, names: list[str]) -> Table:
        for name in names:
            table.add_column(name, justify="left" if name in ("phase", "difference") else "right", no_wrap=True)
        return table

    tables = []
    for split in dict.fromkeys(r["split"] for r in rows):
        split_rows = [r for r in rows if r["split"] == split]
        baseline = split_rows[0]["baseline"]
        per_seed = columns(Table(title=f"{method} on {split}, per seed (the phase val chose)", title_justify="left"),
                           ["seed", "n", "phase", f"val {metric}", metric, baseline, f"minus {baseline} [95% CI]",
                            "gain over start [95% CI]", "minutes"])
        for r in split_rows:
            per_seed.add_row(str(r["seed"]), str(r["n"]), r["phase"], f"{r[f'val_{metric}']:.4f}", f"{r[metric]:.4f}",
                             f"{r[f'baseline_{metric}']:.4f}",
                             diff_text(r["vs_baseline"], r["vs_baseline_ci_low"], r["vs_baseline_ci_high"]),
                             diff_text(r["gain"], r["gain_ci_low"], r["gain_ci_high"]),
                             "resumed" if r["minutes"] is None else f"{r['minutes']:.0f}")
        across = columns(Table(title=f"{method} on {split}, across {len(split_rows)} seeds", title_justify="left"),
                         ["difference", "mean", "sd", "95% t interval over seeds", "seeds CI > 0", "seeds CI < 0"])
        for name, label in zip(DIFFERENCES, (f"minus {baseline}", "gain over start")):
            x = next(x for x in summary if x["split"] == split and x["difference"] == name)
            across.add_row(label, f"{x['mean']:+.4f}", f"{x['sd']:.4f}",
                           diff_text(x["mean"], x["t_ci_low"], x["t_ci_high"]),
                           f"{x['above_0']}/{x['seeds']}", f"{x['below_0']}/{x['seeds']}")
        tables += [per_seed, across]
    return tables


def plot(rows: list[dict[str, Any]], summary: list[dict[str, Any]], metric: str, method: str, dest: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    splits = list(dict.fromkeys(r["split"] for r in rows))
    fig, axes = plt.subplots(1, len(splits), figsize=(4.2 * len(splits), 3.6), sharey=True, squeeze=False)
    for ax, split in zip(axes[0], splits):
        split_rows = [r for r in rows if r["split"] == split]
        for j, name in enumerate(DIFFERENCES):
            xs = [i + (j - 0.5) * 0.3 for i in range(len(split_rows))]
            means = [r[name] for r in split_rows]
            errors = [[m - r[f"{name}_ci_low"] for m, r in zip(means, split_rows)],
                      [r[f"{name}_ci_high"] - m for m, r in zip(means, split_rows)]]
            label = f"minus {split_rows[0]['baseline']}" if name == "vs_baseline" else "gain over its start"
            ax.errorbar(xs, means, yerr=errors, fmt="o", capsize=3, label=label)
            s = next(x for x in summary if x["split"] == split and x["difference"] == name)
            ax.axhline(s["mean"], linestyle=":", color=f"C{j}", linewidth=1)
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(split_rows)), [f"seed {r['seed']}" for r in split_rows])
        ax.set_title(f"{split} (n={'/'.join(str(r['n']) for r in split_rows)})", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel(f"difference in {metric}")
    axes[0][0].legend(fontsize="small", loc="best")
    fig.suptitle(f"{method}: per-seed differences with 95% CIs (dotted: mean over seeds)", fontsize=10)
    fig.tight_layout()
    fig.savefig(dest, dpi=120)
    plt.close(fig)
    return dest


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    from coevo import report
    from coevo.io import write_json

    args = parse_args(argv)
    if len(args.runs) < 2:
        raise SystemExit("seeds: give at least two runs (one per seed)")
    records = sorted((read_record(Path(p)) for p in args.runs), key=lambda r: r["seed"])
    check_comparable(records)
    method, target = records[0]["method"], records[0]["target_split"]
    metric = target_metric(records[0])
    rows = [row for record in records for row in seed_rows(record)]
    splits = [s for s in dict.fromkeys(r["split"] for r in rows) if all(s in rec["tables"] for rec in records)]
    rows = [r for r in rows if r["split"] in splits]  # a split some seed did not measure is left out
    summary = [across_seeds(rows, split, name) for split in splits for name in DIFFERENCES]
    out = (args.out or Path(records[0]["file"]).parent).resolve()
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "seeds.json", {"method": method, "metric": metric, "target_split": target,
                                    "runs": {str(r["seed"]): r["file"] for r in records},
                                    "rows": rows, "across_seeds": summary})
    report.write_csv(rows, out / "seeds.csv")
    png = plot(rows, summary, metric, method, out / "seeds.png")
    console = Console(width=120)
    for rendered in rich_tables(rows, summary, metric, method):
        console.print(rendered)
    console.print("Per seed: paired bootstrap 95% CI over that seed's queries (bold: excludes 0). Across seeds: mean "
                  "and sd of the per-seed differences, a 95% t interval over seeds, and the seeds whose own CI "
                  "excludes 0.")
    console.print(f"written: {out / 'seeds.json'}, {out / 'seeds.csv'}, {png}")
    s = next(x for x in summary if x["split"] == target and x["difference"] == "vs_baseline")
    print(f"{method}_seeds_vs_baseline_mean={s['mean']:.4f} sd={s['sd']:.4f} above_0={s['above_0']}/{s['seeds']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
