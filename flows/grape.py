"""The GRAPE pipeline as a Prefect flow.

prepare -> validate -> train [corpus index with the frozen retriever, raw and untrained
evaluations, GRPO with the rank reward (monitor evaluations every `eval_every` steps),
trained evaluation] -> evaluate [metrics, monitor curves (Recall@1 and mean relevant
similarity per step), one MLflow run].
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from coevo.config import Params
from flows.common import (
    ALL, DataRef, Layout, Part, finish_summary, log_common, open_tracker, read_part_keys,
    reconcile_run_dir, run_stages, run_step,
)

METHOD = "grape"
STAGES_EVALUATED = ("raw", "untrained", "trained")


def run_parts(params: Params) -> list[Part]:
    g = params.grape.model_dump()
    retriever = {k: g[k] for k in ("retriever", "text_encoder", "clip_model", "clip_pretrained")}
    rewriter = {k: g[k] for k in ("generator", "lora", "sampling", "reasoning", "max_reasoning_tokens")}
    return [
        Part("index", {"seed": params.seed, **retriever}, ("index",)),
        Part("raw", {}, ("eval/raw.json",), after=("index",)),
        Part("untrained", {"seed": params.seed, **rewriter}, ("base_generator", "eval/untrained.json"), after=("index",)),
        Part("trained", {"seed": params.seed, **g}, ("train", "generator", "eval/step_*.json", "eval/trained.json",
                                                       "metrics.json"), after=("untrained",)),
    ]


def train_stage(params: Params, layout: Layout, data: DataRef) -> None:
    from tasks import grape as t

    _, keys = reconcile_run_dir(layout.run_dir, run_parts(params), data.fingerprint)
    common = {"run_dir": str(layout.run_dir), "dataset_dir": data.dataset_dir,
              "dataset_fingerprint": data.fingerprint, "params": params.model_dump(mode="json")}
    run_step(t.build_index, label="corpus index (frozen retriever)", outputs=[layout.run_dir / "index"],
             part_key=keys["index"], **common)
    run_step(t.evaluate, label="evaluate raw queries", outputs=[layout.run_dir / "eval" / "raw.json"],
             part_key=keys["raw"], stage="raw", **common)
    run_step(t.evaluate, label="evaluate untrained rewriter", outputs=[layout.run_dir / "eval" / "untrained.json"],
             part_key=keys["untrained"], stage="untrained", **common)
    run_step(t.train, label=f"GRPO ({params.grape.grpo.steps} steps, {params.grape.reward} reward)",
             outputs=[layout.run_dir / "generator"], part_key=keys["trained"], **common)
    run_step(t.evaluate, label="evaluate trained rewriter", outputs=[layout.run_dir / "eval" / "trained.json"],
             part_key=keys["trained"], stage="trained", **common)


def evaluate_stage(params: Params, layout: Layout, data: DataRef) -> dict[str, Any]:
    from tasks import grape as t

    keys = read_part_keys(layout.run_dir)
    if "trained" not in keys or not (layout.run_dir / "eval" / "trained.json").exists():
        raise FileNotFoundError(f"{layout.run_dir}: no trained GRAPE rewriter; run the train stage first")
    common = {"run_dir": str(layout.run_dir), "dataset_dir": data.dataset_dir,
              "dataset_fingerprint": data.fingerprint, "params": params.model_dump(mode="json")}
    result = run_step(
        t.write_reports, label="reports", outputs=[layout.metrics_file, layout.plots_csv, layout.report_dir],
        part_key=keys["trained"], metrics_file=str(layout.metrics_file), plots_csv=str(layout.plots_csv),
        report_dir=str(layout.report_dir), **common,
    )
    table, history = result["table"], result["history"]
    split = next(iter(table["raw"]))  # the monitored split (val, or test when val is empty)
    rows = [{"label": f"{stage} ({split})", **table[stage][split]} for stage in STAGES_EVALUATED if stage in table]
    with open_tracker(params, layout) as tracker:
        log_common(tracker, params, layout, data)
        for row in history:  # both monitor curves, step = GRPO step
            tracker.log_metrics({"monitor/recall@1": row["recall@1"], "monitor/recall@10": row["recall@10"],
                                 "monitor/mean_relevant_similarity": row["mean_relevant_similarity"],
                                 "monitor/mean_rank_reward": row["mean_rank_reward"]}, step=row["step"])
        for stage in STAGES_EVALUATED:
            for split_name, metrics in table.get(stage, {}).items():
                tracker.log_metrics({f"{split_name}/{stage}/{k}": v for k, v in metrics.items()}, step=0)
        tracker.log_artifact(layout.metrics_file)
        tracker.log_artifact(layout.plots_csv, "plots")
        tracker.log_artifact(layout.report_dir, "report")
        summary = finish_summary(rows, tracker, layout, {"table_metrics": ("recall@1", "recall@10", "mrr")})
    return summary


@flow(name="grape")
def grape_flow(params_path: str = "params.yaml", overrides: list[str] | None = None, stage: str = ALL) -> dict[str, Any]:
    """GRAPE end to end (or one DVC stage)."""
    return run_stages(METHOD, "GRAPE", params_path, overrides, stage, train_steps=5,
                      train_stage=train_stage, evaluate_stage=evaluate_stage)


if __name__ == "__main__":
    from flows.common import main

    main(grape_flow)
