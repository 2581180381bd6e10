"""CoGR tasks: one per library phase of `coevo.methods.cogr.CoGRRun`.

Each task rebuilds the run object from plain inputs, calls one idempotent phase (which
returns its checkpointed result when the phase already finished, so a killed run resumes at
the last finished phase), and returns small JSON-able results.

Cache key = (inputs minus the full params dump) + task source + library source. The params
enter the key through `part_key`: the hash of exactly the params the phase depends on (see
flows/cogr.py `run_parts`), so a changed GRPO knob re-executes the GRPO phases but not the
Algorithm 1 seeds or the SFT phase.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks.common import fingerprint, pipeline_task

COGR_CODE = (
    "coevo.methods.cogr",
    "coevo.models",
    "coevo.train",
    "coevo.rewards",
    "coevo.retrieval",
    "coevo.data",
    "coevo.config",
    "coevo.io",
)


def _cogr_task(name: str, **kwargs: Any):
    decorator = pipeline_task(name=name, packages=COGR_CODE, **kwargs)

    def wrap(fn):
        task_obj = decorator(fn)
        # The full params dump is only there to rebuild the run; `part_key` stands for it.
        return task_obj.with_options(cache_policy=task_obj.cache_policy - "params")

    return wrap


def _run(run_dir: str, params: dict[str, Any], dataset_dir: str):
    from coevo.config import Params
    from coevo.methods.cogr import CoGRRun

    return CoGRRun(run_dir, Params.model_validate(params), dataset_dir)


def _stopping(run: Any, index: int) -> dict[str, Any]:
    from coevo.io import read_json

    return read_json(run.phase_dir(index) / "history.json")["early_stopping"]


@_cogr_task("cogr-seed-keywords")
def seed_keywords(*, run_dir: str, dataset_dir: str, dataset_fingerprint: str, params: dict, part_key: str) -> dict:
    """Algorithm 1: sample S_i from G_0, pool S_q (the SFT targets)."""
    return _run(run_dir, params, dataset_dir).seed_keywords()


@_cogr_task("cogr-sft")
def sft(*, run_dir: str, dataset_dir: str, dataset_fingerprint: str, params: dict, part_key: str) -> dict:
    """Phase 0: SFT both generators, build both indexes, evaluate."""
    run = _run(run_dir, params, dataset_dir)
    record = run.sft()
    return {"record": record, "early_stopping": _stopping(run, 0)}


@_cogr_task("cogr-grpo-phase")
def grpo_phase(
    *, run_dir: str, dataset_dir: str, dataset_fingerprint: str, params: dict, part_key: str, index: int
) -> dict:
    """One GRPO phase (query or item side) against the other side's frozen index, then the
    rebuild of the changed side's index and an evaluation."""
    run = _run(run_dir, params, dataset_dir)
    record = run.phase(index)
    return {"record": record, "early_stopping": _stopping(run, index)}


@_cogr_task("cogr-final-evaluation")
def final_evaluation(
    *, run_dir: str, dataset_dir: str, dataset_fingerprint: str, params: dict, part_key: str, index: int, split: str
) -> dict:
    """Evaluate the chosen phase's keyword sets on `split` (generating that split's query keywords)."""
    run = _run(run_dir, params, dataset_dir)
    metrics = run.evaluate(index, split)
    keywords_path = run.phase_dir(index) / "keywords.json"
    return {
        "phase": index,
        "split": split,
        "metrics": {k: float(v) for k, v in metrics.items()},
        "keywords_path": str(keywords_path),
        "keywords_fingerprint": fingerprint(keywords_path),
        "phase_dir": str(run.phase_dir(index)),
    }


def phase_folder(run_dir: str | Path, name: str) -> Path:
    return Path(run_dir) / "phases" / name


@_cogr_task("cogr-reports", retries=0)
def write_reports(
    *,
    run_dir: str,
    dataset_dir: str,
    dataset_fingerprint: str,
    params: dict,
    part_key: str,
    history: list[dict],
    bm25: dict[str, dict[str, float]],
    final: dict,
    metrics_file: str,
    plots_csv: str,
    report_dir: str,
) -> dict:
    """metrics.json, the per-phase CSV for `dvc plots`, the F1 plot, keyword dynamics, examples."""
    from coevo import report
    from coevo.io import read_json, write_json, write_text

    eval_split = params["cogr"]["eval_split"]
    out = Path(report_dir)
    rows = [_phase_row(r) for r in history]
    report.write_csv(rows, plots_csv, columns=PHASE_COLUMNS)

    start = history[0]
    best_index = final["phase"]
    best = next(r for r in history if r["phase"] == best_index)
    metrics = {
        "dataset": Path(dataset_dir).name,
        "eval_split": eval_split,
        "phases": len(history),
        "best_phase": best_index,
        "start": _core(_eval(start)),
        eval_split: _core(_eval(best)),
        final["split"]: _core(final["metrics"]),
        "bm25": {split: _core(m) for split, m in bm25.items()},
    }
    write_json(metrics_file, metrics)

    report.plot_metric_per_phase(
        [r["phase"] for r in history],
        [r["eval/f1"] for r in history],
        out / "eval_f1.png",
        metric=f"{eval_split} F1",
        start=start["eval/f1"],
        start_label="SFT start" if start["kind"] == "sft" else "untrained start",
        baseline=bm25.get(eval_split, {}).get("f1"),
        labels=[r["name"] for r in history],
        title="CoGR: eval F1 per phase",
    )

    dynamics_rows, examples = [], []
    for r in history:
        dyn = read_json(phase_folder(run_dir, r["name"]) / "dynamics.json")
        for side in ("items", "queries"):
            for ngram, count in dyn[side]["distinct_by_ngram"].items():
                dynamics_rows.append({"phase": r["phase"], "name": r["name"], "side": side, "ngram": ngram, "distinct": count})
        examples.append({"phase": r["phase"], "name": r["name"], **dyn["examples"]})
    report.write_csv(dynamics_rows, out / "keyword_dynamics.csv")
    report.plot_grouped_counts(
        dynamics_rows, out / "keyword_dynamics.png", x="phase", group="ngram", value="distinct", facet="side",
        title="distinct keywords by n-gram length",
    )
    write_json(out / "examples.json", examples)
    write_text(out / "examples.md", _examples_markdown(examples))
    return {"metrics": metrics, "files": sorted(str(p) for p in out.iterdir()) + [metrics_file, plots_csv]}


PHASE_COLUMNS = (
    "phase", "name", "kind", "round", "f1", "precision", "recall", "recall@100", "ndcg@10", "mrr@100",
    "train_set_f1", "reward_mean", "kl", "item_keywords_mean", "query_keywords_mean", "seconds",
)


# The numbers metrics.json keeps per entry (all others stay in MLflow and the phase folders).
CORE_METRICS = ("f1", "precision", "recall", "recall@100", "ndcg@10", "mrr@100")


def _core(metrics: dict) -> dict[str, float]:
    return {k: float(metrics[k]) for k in CORE_METRICS if k in metrics}


def _eval(record: dict) -> dict[str, float]:
    return {k.split("/", 1)[1]: float(v) for k, v in record.items() if k.startswith("eval/")}


def _phase_row(record: dict) -> dict:
    row = {k: record.get(k) for k in ("phase", "name", "kind", "round", "seconds")}
    row.update(_eval(record))
    row["train_set_f1"] = record.get("train_set/f1")
    row["reward_mean"] = record.get("train/reward_mean")
    row["kl"] = record.get("train/kl")
    row["item_keywords_mean"] = record.get("keywords/item_mean")
    row["query_keywords_mean"] = record.get("keywords/query_mean")
    return row


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
