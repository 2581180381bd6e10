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

    `best_of` names the metric whose best row is highlighted (default: the first metric).
    """
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    table.add_column(label_key.replace("_", " "), style="bold")
    for name in metrics:
        table.add_column(name, justify="right")
    key = best_of or (metrics[0] if metrics else None)
    values = [_number(r.get(key)) for r in rows] if key else []
    best = max((v for v in values if v is not None), default=None)
    for row in rows:
        cells = []
        for name in metrics:
            value = _number(row.get(name))
            text = "-" if value is None else f"{value:.4f}"
            if name == key and value is not None and value == best:
                text = f"[bold green]{text}[/]"
            cells.append(text)
        table.add_row(str(row.get(label_key, "")), *cells)
    return table


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
