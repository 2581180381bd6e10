"""GRAPE tasks: one per library phase of `coevo.methods.grape.GrapeRun` (each idempotent over
the run dir: a finished phase returns its stored result, so a killed run resumes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks.common import pipeline_task

GRAPE_CODE = (
    "coevo.methods.grape", "coevo.models", "coevo.train", "coevo.rewards", "coevo.retrieval",
    "coevo.data", "coevo.config", "coevo.io",
)


def _grape_task(name: str, **kwargs: Any):
    decorator = pipeline_task(name=name, packages=GRAPE_CODE, **kwargs)

    def wrap(fn):
        task_obj = decorator(fn)
        return task_obj.with_options(cache_policy=task_obj.cache_policy - "params")  # part_key stands for it

    return wrap


def _run(run_dir: str, params: dict[str, Any], dataset_dir: str):
    from coevo.config import Params
    from coevo.methods.grape import GrapeRun

    return GrapeRun(run_dir, Params.model_validate(params), dataset_dir)


@_grape_task("grape-index")
def build_index(*, run_dir: str, dataset_dir: str, dataset_fingerprint: str, params: dict, part_key: str) -> dict:
    """Embed the corpus once with the frozen retriever (faiss index artifact)."""
    return _run(run_dir, params, dataset_dir).build_index()


@_grape_task("grape-evaluate")
def evaluate(*, run_dir: str, dataset_dir: str, dataset_fingerprint: str, params: dict, part_key: str, stage: str) -> dict:
    """Recall@1/5/10, MRR and the inflation monitor for `raw`, `untrained` or `trained`."""
    result = _run(run_dir, params, dataset_dir).evaluate(stage)
    return {"stage": stage, "step": result.get("step"),
            "splits": {s: {k: v for k, v in m.items() if k != "examples"} for s, m in result["splits"].items()}}


@_grape_task("grape-train")
def train(*, run_dir: str, dataset_dir: str, dataset_fingerprint: str, params: dict, part_key: str) -> dict:
    """GRPO on the rewriter against the frozen retriever (monitor evaluations inside)."""
    return _run(run_dir, params, dataset_dir).train()


@_grape_task("grape-reports", retries=0)
def write_reports(
    *, run_dir: str, dataset_dir: str, dataset_fingerprint: str, params: dict, part_key: str,
    metrics_file: str, plots_csv: str, report_dir: str,
) -> dict:
    """metrics.json (raw / untrained / trained per split), the monitor CSV and its plot, examples."""
    from coevo import report
    from coevo.io import read_json, write_json

    run = _run(run_dir, params, dataset_dir)
    table, history = run.table(), run.history()
    out = Path(report_dir)
    write_json(metrics_file, {"reward": params["grape"]["reward"], "stages": table})
    report.write_csv(history, plots_csv)
    if history:
        report.plot_series(
            [r["step"] for r in history],
            {"recall@1": [r["recall@1"] for r in history],
             "mean relevant similarity": [r["mean_relevant_similarity"] for r in history]},
            out / "monitor.png", xlabel="GRPO step", ylabel="recall@1",
            title=f"score-inflation monitor ({params['grape']['reward']} reward)",
            secondary=["mean relevant similarity"],
        )
    examples = {stage: read_json(run.eval_path(stage))["splits"] for stage in table}
    write_json(out / "examples.json", {s: {split: m.get("examples", []) for split, m in sp.items()}
                                       for s, sp in examples.items()})
    return {"table": table, "history": history}
