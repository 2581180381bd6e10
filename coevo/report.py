"""Plots and tables of training runs: matplotlib PNGs, rich tables, per-phase CSVs.

Pure helpers over plain rows (lists of dicts): no MLflow, no Prefect. The flows call them
and log what they write.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from coevo.io import atomic_path, write_text

# The three numbers every results table shows, in this order (DESIGN: set F1, Recall@100, NDCG@10).
SUMMARY_METRICS: tuple[str, ...] = ("f1", "recall@100", "ndcg@10")
# Columns every final table adds to a method's own: the baselines' F1@k* (shown as "f1"), NDCG@5/@10, R@10.
BASELINE_COLUMNS: tuple[str, ...] = ("f1", "ndcg@5", "ndcg@10", "recall@10")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def metrics_table(
    rows: Sequence[Mapping[str, Any]],
    metrics: Sequence[str] = SUMMARY_METRICS,
    *,
    title: str | None = None,
    label_key: str = "label",
    best_of: str | None = None,
):
    """A rich Table: one row per entry (`label` + metric values), best value in bold.

    `best_of` names the metric whose best row is highlighted (default: the first metric);
    rows that carry a ``split`` are compared within their split only. What a table says
    about itself comes from its rows: ``split`` and ``n_queries`` add the columns "split"
    and "n"; baseline rows (``kind: baseline``) add a caption saying what their f1 is. When
    a row carries ``differences`` (a list of :func:`compare_rows` entries), the result is a
    rich Group: this table, then :func:`differences_table` (each difference with its 95% CI
    and p-value), so that both fit a terminal of 80 columns.
    """
    from rich.console import Group
    from rich.table import Table

    caption = ("Baselines: f1 is F1@k* (k* = the cut-off with the best F1@k on val)."
               if any(r.get("kind") == "baseline" for r in rows) else None)
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    table.add_column(label_key.replace("_", " "), style="bold")
    show_split = any("split" in r for r in rows)
    show_n = any("n_queries" in r for r in rows)
    if show_split:
        table.add_column("split")
    if show_n:
        table.add_column("n", justify="right")
    for name in metrics:
        table.add_column(name, justify="right")
    key = best_of or (metrics[0] if metrics else None)
    best: dict[Any, float] = {}
    for row in rows:
        value = _number(row.get(key)) if key else None
        if value is not None:
            group = row.get("split")
            best[group] = max(best.get(group, value), value)
    for row in rows:
        cells = []
        if show_split:
            cells.append(str(row.get("split", "")))
        if show_n:
            cells.append(str(row.get("n_queries", "")))
        for name in metrics:
            value = _number(row.get(name))
            text = "-" if value is None else f"{value:.4f}"
            if name == key and value is not None and value == best.get(row.get("split")):
                text = f"[bold green]{text}[/]"
            cells.append(text)
        table.add_row(str(row.get(label_key, "")), *cells)
    differences = [d for r in rows for d in (r.get("differences") or ())]
    return Group(table, differences_table(differences)) if differences else table


def differences_table(differences: Sequence[Mapping[str, Any]]):
    """Each paired difference a final table claims: what minus what, the metric, the mean
    difference, its CI and p-value, over how many queries of which split."""
    from rich.table import Table

    first = differences[0]
    table = Table(
        title=f"paired differences on {first['split']} ({first['n']} queries): {first['a']} minus ...",
        title_justify="left", caption_justify="left",
        caption=(f"{first['confidence']:.0%} CI: paired bootstrap over queries ({first['resamples']} resamples, "
                 f"seed {first['seed']}); p: two-sided paired randomisation test ({first['permutations']} sign "
                 "flips); bold: the CI excludes 0."),
    )
    for name, justify in (("minus", "left"), ("metric", "left"), ("Δ", "right"), (f"{first['confidence']:.0%} CI", "right"),
                          ("p", "right")):
        table.add_column(name, justify=justify)
    for d in differences:
        significant = d["ci_low"] > 0 or d["ci_high"] < 0
        delta = f"{d['mean']:+.4f}"
        other = d["b"].removesuffix(f" ({d['split']})")  # the title names the split
        table.add_row(f"{d['name'][3:]}: {other}", d["metric"], f"[bold]{delta}[/]" if significant else delta,
                      f"[{d['ci_low']:+.4f}, {d['ci_high']:+.4f}]", f"{d['p_value']:.3g}")
    return table


def difference_text(diff: Mapping[str, Any]) -> str:
    """``+0.0123 [-0.0200, +0.0400] p=0.41`` (one difference on one line)."""
    return f"{diff['mean']:+.4f} [{diff['ci_low']:+.4f}, {diff['ci_high']:+.4f}] p={diff['p_value']:.3g}"


def rows_to_csv(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """CSV text with a header; columns default to the union of keys in first-seen order."""
    if columns is None:
        seen: dict[str, None] = {}
        for row in rows:
            seen.update(dict.fromkeys(row))
        columns = list(seen)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: row.get(c, "") for c in columns})
    return buffer.getvalue()


def write_csv(rows: Sequence[Mapping[str, Any]], dest: str | Path, columns: Sequence[str] | None = None) -> Path:
    return write_text(dest, rows_to_csv(rows, columns))


def _save(fig, dest: str | Path) -> Path:
    import matplotlib.pyplot as plt

    dest = Path(dest)
    with atomic_path(dest) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return dest


def _use_agg() -> None:
    import matplotlib

    matplotlib.use("Agg", force=True)  # files only; never needs a display


def _figure(width: float = 6.4, height: float = 4.0):
    _use_agg()
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height))


def plot_metric_per_phase(
    steps: Sequence[int],
    values: Sequence[float],
    dest: str | Path,
    *,
    metric: str = "f1",
    start: float | None = None,
    start_label: str = "SFT start",
    baseline: float | None = None,
    baseline_label: str = "BM25",
    labels: Sequence[str] | None = None,
    title: str | None = None,
) -> Path:
    """Line of `metric` per phase, with horizontal lines for the start point and a baseline."""
    if len(steps) != len(values):
        raise ValueError(f"plot_metric_per_phase: {len(steps)} steps but {len(values)} values")
    fig, ax = _figure()
    ax.plot(list(steps), list(values), marker="o", label=f"eval {metric}")
    if start is not None:
        ax.axhline(start, color="tab:gray", linestyle="--", label=f"{start_label} ({start:.3f})")
    if baseline is not None:
        ax.axhline(baseline, color="tab:red", linestyle=":", label=f"{baseline_label} ({baseline:.3f})")
    if labels:
        ax.set_xticks(list(steps), list(labels), rotation=30, ha="right")
    ax.set_xlabel("phase")
    ax.set_ylabel(metric)
    ax.set_title(title or f"eval {metric} per phase")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    return _save(fig, dest)


def plot_series(
    steps: Sequence[int],
    series: Mapping[str, Sequence[float]],
    dest: str | Path,
    *,
    xlabel: str = "step",
    ylabel: str = "value",
    title: str | None = None,
    secondary: Iterable[str] = (),
) -> Path:
    """Several named curves over the same steps; names in `secondary` use a right-hand axis.

    Used for monitors whose scales differ (mean similarity vs Recall@1).
    """
    secondary = set(secondary)
    fig, ax = _figure()
    right = ax.twinx() if secondary else None
    handles = []
    colors = iter(["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"])
    for name, values in series.items():
        if len(values) != len(steps):
            raise ValueError(f"plot_series: series {name!r} has {len(values)} values for {len(steps)} steps")
        axis = right if name in secondary else ax
        (line,) = axis.plot(list(steps), list(values), marker="o", color=next(colors, None), label=name)
        handles.append(line)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if right is not None:
        right.set_ylabel(", ".join(sorted(secondary)))
    ax.set_title(title or ylabel)
    ax.grid(alpha=0.3)
    ax.legend(handles=handles, loc="best", fontsize="small")
    return _save(fig, dest)


def plot_grouped_counts(
    rows: Sequence[Mapping[str, Any]],
    dest: str | Path,
    *,
    x: str,
    group: str,
    value: str,
    facet: str | None = None,
    title: str | None = None,
) -> Path:
    """Lines of `value` over `x`, one line per `group` value, one panel per `facet` value.

    Keyword dynamics: x=phase, group=n-gram length, value=distinct keywords, facet=side.
    """
    _use_agg()
    import matplotlib.pyplot as plt

    facets = sorted({r[facet] for r in rows}, key=str) if facet else [None]
    fig, axes = plt.subplots(1, len(facets), figsize=(5.0 * len(facets), 3.8), squeeze=False)
    for ax, facet_value in zip(axes[0], facets):
        subset = [r for r in rows if facet is None or r[facet] == facet_value]
        for group_value in sorted({r[group] for r in subset}, key=str):
            points = sorted((r[x], r[value]) for r in subset if r[group] == group_value)
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"{group}={group_value}")
        ax.set_xlabel(x)
        ax.set_ylabel(value)
        ax.set_title(f"{facet}={facet_value}" if facet else (title or value))
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    if title and facet:
        fig.suptitle(title)
    return _save(fig, dest)


# ------------------------------------------------------------------------------ final tables
# A final table is one JSON document (what the flow prints, logs to MLflow and adds to
# metrics.json): rows for the baselines and the method's phases on val, then the baselines
# and the method's start and chosen phase on the final split, and the paired comparisons
# (mean difference, bootstrap CI, randomisation p-value) of every difference it claims.
VS_START, VS_BASELINE, VS_PAPER = "vs start", "vs best baseline", "vs paper baseline"


def table_columns(method_metrics: Sequence[str]) -> list[str]:
    """The method's headline metric (its first), the baseline columns, then its other metrics."""
    return list(dict.fromkeys((*method_metrics[:1], *BASELINE_COLUMNS, *method_metrics[1:])))


def numbers(record: Mapping[str, Any]) -> dict[str, float]:
    """The finite numeric entries of a record (nested values and flags dropped)."""
    return {k: float(v) for k, v in record.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def baseline_short(name: str) -> str:
    return {"bm25": "BM25", "dense": "dense"}.get(name, name)


def baseline_row(result: Mapping[str, Any], split: str) -> dict[str, Any]:
    """A baseline on one split as a table row: every mean, with ``f1`` = F1@k* (k* chosen on val)."""
    part = result["splits"][split]
    k = result["chosen_k"]
    metrics = dict(part["metrics"])
    return {"label": f"{baseline_short(result['baseline'])} @k*={k} ({split})", "kind": "baseline",
            "baseline": result["baseline"], "split": split, "n_queries": part["n_queries"], "chosen_k": k,
            **metrics, "f1": metrics[f"f1@{k}"]}


def compare_rows(name: str, a: Mapping[str, Any], b: Mapping[str, Any], metric: str,
                 a_values: Mapping[str, float], b_values: Mapping[str, float], split: str,
                 bootstrap: Mapping[str, Any]) -> dict[str, Any]:
    """``a`` minus ``b`` on ``metric`` over the same queries: coevo.stats.paired_difference."""
    from coevo.stats import paired_difference

    try:
        diff = paired_difference(a_values, b_values, resamples=bootstrap["resamples"],
                                 permutations=bootstrap["permutations"], seed=bootstrap["seed"],
                                 confidence=bootstrap["confidence"])
    except ValueError as exc:
        raise ValueError(f"{a['label']} {name} ({b['label']}), {metric}: {exc}") from None
    return {"name": name, "a": a["label"], "b": b["label"], "metric": metric, "split": split, "n": diff.n,
            "mean": diff.mean, "ci_low": diff.ci_low, "ci_high": diff.ci_high, "p_value": diff.p_value,
            "mean_a": diff.mean_a, "mean_b": diff.mean_b, "significant": diff.significant,
            "confidence": diff.confidence, "resamples": diff.resamples, "permutations": diff.permutations,
            "seed": diff.seed, "method": f"paired bootstrap ({diff.method}) + paired randomisation (sign flips)"}


def best_baseline(baselines: Mapping[str, Mapping[str, Any]], metric: str, val_split: str) -> tuple[str, str]:
    """(baseline, metric): the baseline with the best ``metric`` on val (F1@k* for "f1"); a
    metric no baseline reports falls back to "f1". Chosen on val, never on the final split."""
    def value(result: Mapping[str, Any], name: str) -> float | None:
        return _number(baseline_row(result, val_split).get(name))

    if not baselines:
        raise ValueError("no baseline result to compare against")
    if all(value(r, metric) is None for r in baselines.values()):
        metric = "f1"
    scored = [(value(r, metric), i, name) for i, (name, r) in enumerate(baselines.items())]
    return max(scored, key=lambda t: (-math.inf if t[0] is None else t[0], -t[1]))[2], metric


def evaluation_table(
    *,
    method: str,
    dataset: str,
    columns: Sequence[str],
    val_rows: Sequence[Mapping[str, Any]],
    final: Mapping[str, Any],
    baselines: Mapping[str, Mapping[str, Any]],
    bootstrap: Mapping[str, Any],
    cutoffs: Sequence[int],
    val_split: str = "val",
    paper_baseline: str | None = None,
) -> dict[str, Any]:
    """The final table of one method's run (see the section notes).

    ``val_rows``: the method's phases on val ({label, phase, n_queries, metrics...});
    ``final``: :meth:`coevo.methods.base.Method.final_evaluation`'s result, rows with
    ``per_query`` ({metric: {query_id: value}}); ``baselines``: {name: the pipeline's
    baseline result} with per-query values on the final split. The chosen phase is
    compared with the method's start (``final["start_phase"]``, default its first row) and
    with the baseline that is best on val by the headline metric (``columns[0]``), on every
    column both sides have per-query values for. ``paper_baseline`` (the baseline the method's paper
    claims to beat: a name of ``baselines``, compared at its k* chosen on val, or a phase of the
    final rows) adds the comparisons ``vs paper baseline``;
    None means the paper's baseline is the best baseline (``vs best baseline`` answers it).
    """
    split = final["split"]
    rows: list[dict[str, Any]] = []
    for s in dict.fromkeys((val_split, split)):
        rows += [baseline_row(r, s) for r in baselines.values() if s in r["splits"]]
        if s == val_split:
            rows += [{"label": f"{r['label']} ({val_split})", "kind": "phase", "phase": r["phase"], "split": val_split,
                      **numbers(r["metrics"]), **({"n_queries": int(r["n_queries"])} if "n_queries" in r else {})}
                     for r in val_rows]
    start_phase = final.get("start_phase", final["rows"][0]["phase"])
    best_index = max(i for i, r in enumerate(final["rows"]) if r["phase"] == final["best_phase"])
    start_index = next(i for i, r in enumerate(final["rows"]) if r["phase"] == start_phase)
    method_rows = []
    for i, r in enumerate(final["rows"]):
        kind = "final" if i == best_index else "start" if i == start_index else "method"
        method_rows.append({"label": f"{r['label']} ({split})", "kind": kind, "phase": r["phase"], "split": split,
                            **numbers(r), "n_queries": int(r["n_queries"])})
    best_row, start_row = method_rows[best_index], method_rows[start_index]
    best_values = final["rows"][best_index].get("per_query", {})
    headline = columns[0]
    chosen, baseline_metric = best_baseline(baselines, headline, val_split)
    baseline_split_rows = [r for r in rows if r["kind"] == "baseline" and r["split"] == split]
    reference = next(r for r in baseline_split_rows if r["baseline"] == chosen)
    others = [(VS_START, start_row, final["rows"][start_index].get("per_query", {})),
              (VS_BASELINE, reference, baselines[chosen].get("per_query", {}))]
    if paper_baseline in baselines:  # a retrieval baseline at its k* chosen on val (CoGR: BM25)
        paper_row = next(r for r in baseline_split_rows if r["baseline"] == paper_baseline)
        others.append((VS_PAPER, paper_row, baselines[paper_baseline].get("per_query", {})))
    elif paper_baseline is not None:  # a row of the method's own final evaluation (GRAPE: raw query, CoHyDE: S1a)
        paper_index = next((i for i, r in enumerate(final["rows"]) if r["phase"] == paper_baseline), None)
        if paper_index is None:
            raise ValueError(f"{method}: the paper's baseline {paper_baseline!r} is neither a baseline "
                             f"({', '.join(baselines)}) nor a row of the final evaluation "
                             f"(rows: {', '.join(r['phase'] for r in final['rows'])})")
        others.append((VS_PAPER, method_rows[paper_index], final["rows"][paper_index].get("per_query", {})))
    comparisons = []
    for name, other, other_values in others:
        for metric in columns:
            if metric in best_values and metric in other_values:
                comparisons.append(compare_rows(name, best_row, other, metric, best_values[metric],
                                                other_values[metric], split, bootstrap))
    best_row["differences"] = comparisons
    rows += method_rows
    return {
        "method": method, "dataset": dataset, "split": split, "n_queries": best_row["n_queries"],
        "val_split": val_split, "cutoffs": list(cutoffs), "columns": list(columns), "headline": headline,
        "start_phase": start_phase, "best_phase": final["best_phase"],
        "best_baseline": {"baseline": chosen, "metric": baseline_metric, "chosen_on": val_split,
                          "chosen_k": baselines[chosen]["chosen_k"]},
        "paper_baseline": {"name": VS_PAPER if paper_baseline else VS_BASELINE,
                           "row": baseline_short(paper_baseline or chosen)},
        "bootstrap": dict(bootstrap), "rows": rows, "comparisons": comparisons,
    }


def tracking_metrics(table: Mapping[str, Any]) -> dict[str, float]:
    """The final table as MLflow metrics: ``<baseline>/<split>/<metric>``,
    ``<split>/<phase>/<metric>`` for the method's final rows, ``<split>/n_queries``, and
    ``compare/<vs_start|vs_best_baseline>/<metric>/{delta,ci_low,ci_high,p_value,n}``.
    (The method's val rows are its learning curve, logged per step by the flow.)"""
    out: dict[str, float] = {}
    for row in table["rows"]:
        if row["kind"] == "baseline":
            prefix = f"{row['baseline']}/{row['split']}"
        elif row["split"] == table["split"] and row["kind"] != "phase":
            prefix = f"{row['split']}/{row['phase']}"
        else:
            continue
        out.update({f"{prefix}/{k}": v for k, v in numbers(row).items()})
    for c in table["comparisons"]:
        base = f"compare/{c['name'].replace(' ', '_')}/{c['metric']}"
        out.update({f"{base}/delta": c["mean"], f"{base}/ci_low": c["ci_low"], f"{base}/ci_high": c["ci_high"],
                    f"{base}/p_value": c["p_value"], f"{base}/n": float(c["n"])})
    out[f"{table['split']}/n_queries"] = float(table["n_queries"])
    return out


def summary_metrics(table: Mapping[str, Any]) -> dict[str, float]:
    """The handful of numbers a comparer looks at first, under ``summary/``: the served (chosen) phase's
    headline on val and on the final split, and its differences (with CI bounds) from its start, the
    best baseline and the paper's baseline on that metric."""
    headline, split = table["headline"], table["split"]
    out: dict[str, float] = {}
    for row in table["rows"]:
        if row.get("phase") == table["best_phase"] and row["kind"] in ("phase", "final") and headline in row:
            out[f"summary/{'val' if row['split'] == table['val_split'] else split}_{headline}"] = float(row[headline])
    names = {VS_START: "vs_start", VS_BASELINE: "vs_best_baseline", VS_PAPER: "vs_paper_baseline"}
    for c in table["comparisons"]:
        if c["metric"] == headline and c["name"] in names:
            base = f"summary/{names[c['name']]}"
            out.update({base: c["mean"], f"{base}_ci_low": c["ci_low"], f"{base}_ci_high": c["ci_high"]})
    return out


def table_artifacts(table: Mapping[str, Any], final: Mapping[str, Any]) -> dict[str, dict[str, list[Any]]]:
    """The final table, its paired differences and the served phase's per-query scores, column-wise
    ({artifact file: {column: values}}, what ``MlflowClient.log_table`` takes)."""
    def columns(rows: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> dict[str, list[Any]]:
        return {k: [r.get(k) for r in rows] for k in keys}

    rows = [{k: v for k, v in r.items() if k != "differences"} for r in table["rows"]]
    # The row's name, then its numbers: MLflow's table comparison (the runs page's Evaluation view)
    # groups by the first column and compares the second, so two runs open on their headline metric.
    row_keys = ["label", *table["columns"], "kind", "split", "phase", "n_queries"]
    diff_keys = ["name", "mean", "ci_low", "ci_high", "p_value", "significant", "a", "b", "metric", "split", "n"]
    best = next(r for r in reversed(final["rows"]) if r["phase"] == final["best_phase"])
    per_query = best.get("per_query") or {}
    query_ids = sorted({q for values in per_query.values() for q in values})
    scores = {"query_id": query_ids, **{m: [per_query[m].get(q) for q in query_ids] for m in sorted(per_query)}}
    return {"tables/results.json": columns(rows, row_keys),
            "tables/differences.json": columns(table["comparisons"], diff_keys),
            f"tables/per_query_{final['best_phase']}.json": scores}


def table_tags(table: Mapping[str, Any]) -> dict[str, str]:
    """What the table says about itself, as MLflow tags."""
    best = table["best_baseline"]
    return {"eval.split": table["split"], "eval.n_queries": str(table["n_queries"]),
            "eval.cutoffs": ",".join(map(str, table["cutoffs"])),
            "eval.best_baseline": f"{best['baseline']} (by {best['metric']} on {best['chosen_on']})",
            "eval.bootstrap": ", ".join(f"{k}={v}" for k, v in table["bootstrap"].items())}
