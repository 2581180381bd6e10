"""Counts and relevant-per-query statistics of a data set, as a dict and as rich tables."""

from __future__ import annotations

from typing import Any

import pandas as pd

from coevo.data.schema import DERIVED_SPLITS, SPLITS, Dataset


def _stats(values: pd.Series) -> dict[str, float]:
    if values.empty:
        return {"min": 0, "mean": 0.0, "median": 0.0, "max": 0}
    return {
        "min": int(values.min()),
        "mean": round(float(values.mean()), 3),
        "median": float(values.median()),
        "max": int(values.max()),
    }


def summarize(ds: Dataset, min_grade: int = 1) -> dict[str, Any]:
    """Items, queries per split, qrels per grade, relevant items per query, unused items, groups."""
    queries, qrels = ds.queries, ds.qrels
    relevant = qrels[qrels["grade"] >= min_grade]
    per_query = relevant.groupby("query_id").size()
    # Queries without a relevant item count as 0, so the minimum shows them.
    per_query = per_query.reindex(queries["query_id"], fill_value=0)
    split_of = dict(zip(queries["query_id"], queries["split"]))
    per_split: dict[str, dict[str, Any]] = {}
    present = set(split_of.values())
    splits = (*SPLITS, *(s for s in DERIVED_SPLITS if s in present))  # a derived split only where it was made
    for split in splits:
        ids = [q for q, s in split_of.items() if s == split]
        per_split[split] = {"queries": len(ids), "relevant_per_query": _stats(per_query.loc[ids])}
    summary: dict[str, Any] = {
        "name": ds.name,
        "items": len(ds.items),
        "queries": len(queries),
        "qrels": len(qrels),
        "relevant_qrels": len(relevant),
        "grades": {str(int(g)): int(n) for g, n in qrels["grade"].value_counts().sort_index().items()},
        "splits": per_split,
        "relevant_per_query": _stats(per_query),
        "queries_without_relevant": int((per_query == 0).sum()),
        "items_never_relevant": int((~ds.items["item_id"].isin(set(relevant["item_id"]))).sum()),
    }
    if "group" in queries.columns:
        groups = queries.groupby(["group", "split"]).size().unstack(fill_value=0)
        summary["groups"] = {
            str(group): {split: int(groups.loc[group].get(split, 0)) for split in splits} for group in groups.index
        }
    return summary


def render_summary(summary: dict[str, Any]) -> list[Any]:
    """rich Tables for a summary: overview, per split, per group (when there are groups)."""
    from rich.table import Table

    overview = Table(title=f"dataset {summary['name']}", show_header=False)
    overview.add_column("what")
    overview.add_column("value", justify="right")
    rel = summary["relevant_per_query"]
    for label, value in (
        ("items", summary["items"]),
        ("queries", summary["queries"]),
        ("qrels", summary["qrels"]),
        ("qrels with grade > 0", summary["relevant_qrels"]),
        ("grades (grade: count)", ", ".join(f"{g}: {n}" for g, n in summary["grades"].items())),
        ("relevant per query (min/mean/median/max)", f"{rel['min']} / {rel['mean']} / {rel['median']} / {rel['max']}"),
        ("queries without a relevant item", summary["queries_without_relevant"]),
        ("items never relevant", summary["items_never_relevant"]),
    ):
        overview.add_row(label, str(value))

    splits = Table(title="splits")
    for column in ("split", "queries", "rel/query min", "mean", "median", "max"):
        splits.add_column(column, justify="left" if column == "split" else "right")
    for split, info in summary["splits"].items():
        s = info["relevant_per_query"]
        splits.add_row(split, str(info["queries"]), str(s["min"]), str(s["mean"]), str(s["median"]), str(s["max"]))
    tables = [overview, splits]

    if summary.get("groups"):
        groups = Table(title="groups (queries per split)")
        groups.add_column("group")
        for split in ("train", "val", "test"):
            groups.add_column(split, justify="right")
        for group, counts in summary["groups"].items():
            groups.add_row(group, *(str(counts[s]) for s in ("train", "val", "test")))
        tables.append(groups)
    return tables


def print_summary(summary: dict[str, Any], console: Any = None) -> None:
    from rich.console import Console

    console = console or Console()
    for table in render_summary(summary):
        console.print(table)
