"""CoGR's reports: metrics.json, the per-phase CSV for `dvc plots`, the F1 plot, keyword dynamics."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coevo import report
from coevo.io import read_json, write_json, write_text
from coevo.methods.base import MONITOR_SPLIT

if TYPE_CHECKING:
    from coevo.methods.cogr import CoGR

PHASE_COLUMNS = (
    "phase", "name", "kind", "round", "f1", "precision", "recall", "recall@100", "ndcg@10", "mrr@100",
    "train_set_f1", "reward_mean", "kl", "item_keywords_mean", "query_keywords_mean", "seconds",
)
# The numbers metrics.json keeps per entry (all others stay in MLflow and the phase folders).
CORE_METRICS = ("f1", "precision", "recall", "recall@100", "ndcg@10", "mrr@100", "n_queries")


def _core(metrics: Mapping[str, Any]) -> dict[str, float]:
    return {k: float(metrics[k]) for k in CORE_METRICS if k in metrics}


def phase_row(record: Mapping[str, Any]) -> dict[str, Any]:
    row = {k: record.get(k) for k in ("phase", "name", "kind", "round", "seconds")}
    row.update(record["eval"])
    row["train_set_f1"] = record["train_set"]["f1"]
    row["reward_mean"] = record["train"].get("reward_mean")
    row["kl"] = record["train"].get("kl")
    row["item_keywords_mean"] = record["keywords"]["item_mean"]
    row["query_keywords_mean"] = record["keywords"]["query_mean"]
    return row


def write_cogr_reports(run: CoGR, metrics_file: Path, plots_csv: Path, report_dir: Path, final: Mapping[str, Any],
                       baselines: Mapping[str, Any]) -> list[str]:
    history = run.rows()
    report.write_csv([phase_row(r) for r in history], plots_csv, columns=PHASE_COLUMNS)
    start = history[0]
    best = next(r for r in history if r["name"] == final["best_phase"])
    metrics = {
        "dataset": run.dataset_dir.name,
        "monitor_split": MONITOR_SPLIT,
        "phases": len(history),
        "best_phase": final["best_phase"],
        "start": _core(start["eval"]),
        MONITOR_SPLIT: _core(best["eval"]),
        final["split"]: {row["label"]: _core(row) for row in final["rows"]},
        "baselines": {name: {split: _core(m) for split, m in per_split.items()} for name, per_split in baselines.items()},
    }
    write_json(metrics_file, metrics)

    bm25_val = baselines.get("bm25", {}).get(MONITOR_SPLIT, {})
    report.plot_metric_per_phase(
        [r["phase"] for r in history], [r["eval"]["f1"] for r in history], report_dir / "eval_f1.png",
        metric=f"{MONITOR_SPLIT} F1", start=start["eval"]["f1"],
        start_label="SFT start" if start["kind"] == "sft" else "untrained start",
        baseline=bm25_val.get("f1"), labels=[r["name"] for r in history], title="CoGR: val F1 per phase",
    )
    dynamics_rows, examples = [], []
    for r in history:
        dyn = read_json(run.phase_dir(r["phase"]) / "dynamics.json")
        for side in ("items", "queries"):
            for ngram, count in dyn[side]["distinct_by_ngram"].items():
                dynamics_rows.append({"phase": r["phase"], "name": r["name"], "side": side, "ngram": ngram,
                                      "distinct": count})
        examples.append({"phase": r["phase"], "name": r["name"], **dyn["examples"]})
    report.write_csv(dynamics_rows, report_dir / "keyword_dynamics.csv")
    report.plot_grouped_counts(dynamics_rows, report_dir / "keyword_dynamics.png", x="phase", group="ngram",
                               value="distinct", facet="side", title="distinct keywords by n-gram length")
    write_json(report_dir / "examples.json", examples)
    write_text(report_dir / "examples.md", _examples_markdown(examples))
    return sorted(str(p) for p in report_dir.iterdir() if p.is_file()) + [str(metrics_file), str(plots_csv)]


def _examples_markdown(examples: list[dict]) -> str:
    lines = ["# Example keywords per phase", ""]
    for ex in examples:
        lines += [f"## {ex['name']}", "", "| side | text | keywords |", "|---|---|---|"]
        for item in ex.get("items", []):
            lines.append(f"| item | {_cell(item['title'])} | {_cell(', '.join(item['keywords']))} |")
        for query in ex.get("queries", []):
            lines.append(f"| query | {_cell(query['text'])} | {_cell(', '.join(query['keywords']))} |")
        lines.append("")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")
