"""CoHyDE tasks: one per library phase of `coevo.methods.cohyde.CoHyDERun` (idempotent over
the run dir, so a killed run resumes at the last finished phase)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks.common import pipeline_task

COHYDE_CODE = (
    "coevo.methods.cohyde", "coevo.models", "coevo.train", "coevo.rewards", "coevo.retrieval",
    "coevo.data", "coevo.config", "coevo.io",
)


def _cohyde_task(name: str, **kwargs: Any):
    decorator = pipeline_task(name=name, packages=COHYDE_CODE, **kwargs)

    def wrap(fn):
        task_obj = decorator(fn)
        return task_obj.with_options(cache_policy=task_obj.cache_policy - "params")  # part_key stands for it

    return wrap


def _run(run_dir: str, params: dict[str, Any], dataset_dir: str, rounds: int | None = None):
    from coevo.config import Params
    from coevo.methods.cohyde import CoHyDERun

    full = Params.model_validate(params)
    section = full.cohyde if rounds is None else full.cohyde.model_copy(update={"rounds": rounds})
    return CoHyDERun(run_dir, section, dataset_dir, seed=full.seed)


def _metrics_only(result: dict) -> dict:
    return {"stage": result["stage"], "splits": result["splits"]}


@_cohyde_task("cohyde-evaluate")
def evaluate(*, run_dir: str, dataset_dir: str, dataset_fingerprint: str, params: dict, part_key: str, stage: str) -> dict:
    """NDCG@5 / Recall@5 per group for `raw`, `s1a` or `hyde` (training what it needs first)."""
    return _metrics_only(_run(run_dir, params, dataset_dir).evaluate(stage))


@_cohyde_task("cohyde-s1a")
def s1a(*, run_dir: str, dataset_dir: str, dataset_fingerprint: str, params: dict, part_key: str) -> dict:
    """S1a: fine-tune the encoder on (query, tool) pairs; rebuild the corpus index."""
    return _run(run_dir, params, dataset_dir).s1a()


@_cohyde_task("cohyde-s1b")
def s1b(*, run_dir: str, dataset_dir: str, dataset_fingerprint: str, params: dict, part_key: str) -> dict:
    """S1b: next-token warm-up of the rewriter on the tool corpus in several formats."""
    return _run(run_dir, params, dataset_dir).s1b()


@_cohyde_task("cohyde-round")
def round_(*, run_dir: str, dataset_dir: str, dataset_fingerprint: str, params: dict, part_key: str, r: int) -> dict:
    """Round r (S2 descriptions, S3 encoder, S4 sample + score + mine, DPO) and its evaluation,
    through the library's own loop capped at r rounds, so early-stopping state is its own."""
    from coevo.io import read_json
    from coevo.methods.cohyde import round_stage

    run = _run(run_dir, params, dataset_dir, rounds=r)
    run.run()
    state = read_json(Path(run_dir) / "state.json")
    done = read_json(Path(run_dir) / round_stage(r) / "done.json")
    return {"round": r, "mining": done["mining"], "eval": _metrics_only(run.evaluate(round_stage(r))), "state": state}


@_cohyde_task("cohyde-reports", retries=0)
def write_reports(
    *, run_dir: str, dataset_dir: str, dataset_fingerprint: str, params: dict, part_key: str,
    metrics_file: str, plots_csv: str, report_dir: str,
) -> dict:
    """metrics.json (per stage, split and group), per-round CSV, NDCG@5 plot per group, examples."""
    from coevo import report
    from coevo.io import read_json, write_json

    run = _run(run_dir, params, dataset_dir)
    history = run.history()
    out = Path(report_dir)
    stages = list(dict.fromkeys(r["stage"] for r in history))
    metrics: dict[str, Any] = {}
    for r in history:
        metrics.setdefault(r["split"], {}).setdefault(r["group"], {})[r["stage"]] = {
            "ndcg@5": r["ndcg@5"], "recall@5": r["recall@5"]}
    write_json(metrics_file, metrics)
    rows = [{"step": stages.index(r["stage"]), **r} for r in history]
    report.write_csv(rows, plots_csv)
    split = run.monitor_split()
    groups = sorted({r["group"] for r in history if r["split"] == split})
    series = {g: [next((r["ndcg@5"] for r in history if r["split"] == split and r["group"] == g and r["stage"] == s),
                       float("nan")) for s in stages] for g in groups}
    report.plot_series(list(range(len(stages))), series, out / "ndcg5_per_group.png", xlabel="stage (" + ", ".join(stages) + ")",
                       ylabel=f"{split} NDCG@5", title="CoHyDE: NDCG@5 per group and stage")
    examples = {s: read_json(run.run_dir / "eval" / f"{s}.json").get("examples", {}) for s in stages}
    write_json(out / "examples.json", examples)
    return {"history": history, "stages": stages, "monitor_split": split}
