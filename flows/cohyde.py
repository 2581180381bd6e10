"""The CoHyDE pipeline as a Prefect flow.

prepare -> validate -> train [raw encoder eval, S1a encoder + eval, S1b rewriter warm-up +
vanilla HyDE eval, then rounds (S2, S3, S4, DPO + eval) with the library's early stopping]
-> evaluate [metrics per split/group/stage, per-round CSV and plot, one MLflow run with
per-round metrics per group].
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from coevo.config import Params
from flows.common import (
    ALL, DataRef, Layout, Part, finish_summary, log_common, logger, open_tracker, read_part_keys,
    reconcile_run_dir, run_stages, run_step,
)

METHOD = "cohyde"


def run_parts(params: Params) -> list[Part]:
    c = params.cohyde.model_dump()
    seed = params.seed
    encoder = {k: c[k] for k in ("encoder", "index_format")}
    s1a = {**encoder, **{k: c[k] for k in ("encoder_training", "max_train_queries")}}
    rewriter = {k: c[k] for k in ("generator", "lora", "warmup", "warmup_formats_per_item", "warmup_max_examples",
                                  "max_new_tokens", "max_train_queries")}
    rounds_params = {k: v for k, v in c.items() if k != "rounds"}
    parts = [
        Part("state", {"seed": seed, **c}, ("state.json",)),
        Part("raw", {"seed": seed, **encoder}, ("raw", "eval/raw.json")),
        Part("s1a", {"seed": seed, **s1a}, ("s1a", "eval/s1a.json")),
        Part("rewriter", {"seed": seed, **rewriter}, ("base_generator", "s1b", "eval/hyde.json"), after=("s1a",)),
    ]
    previous = "rewriter"
    for r in range(1, params.cohyde.rounds + 1):
        parts.append(Part(f"round{r}", {"seed": seed, **rounds_params}, (f"round_{r}", f"eval/round_{r}.json"),
                          after=(previous, "s1a")))
        previous = f"round{r}"
    return parts


def train_stage(params: Params, layout: Layout, data: DataRef) -> None:
    from tasks import cohyde as t

    _, keys = reconcile_run_dir(layout.run_dir, run_parts(params), data.fingerprint)
    common = {"run_dir": str(layout.run_dir), "dataset_dir": data.dataset_dir,
              "dataset_fingerprint": data.fingerprint, "params": params.model_dump(mode="json")}
    ev = layout.run_dir / "eval"
    run_step(t.evaluate, label="evaluate raw encoder", outputs=[ev / "raw.json"], part_key=keys["raw"], stage="raw", **common)
    run_step(t.s1a, label="S1a encoder fine-tuning", outputs=[layout.run_dir / "s1a"], part_key=keys["s1a"], **common)
    run_step(t.evaluate, label="evaluate S1a encoder", outputs=[ev / "s1a.json"], part_key=keys["s1a"], stage="s1a", **common)
    run_step(t.s1b, label="S1b rewriter warm-up", outputs=[layout.run_dir / "s1b"], part_key=keys["rewriter"], **common)
    run_step(t.evaluate, label="evaluate vanilla HyDE", outputs=[ev / "hyde.json"], part_key=keys["rewriter"],
             stage="hyde", **common)
    patience = params.cohyde.early_stopping.patience
    for r in range(1, params.cohyde.rounds + 1):
        result = run_step(t.round_, label=f"round {r}: S2-S4 + DPO", outputs=[layout.run_dir / f"round_{r}"],
                          part_key=keys[f"round{r}"], r=r, **common)
        if result["state"]["stale"] >= patience and r < params.cohyde.rounds:
            logger().info("early stopping after round %d: %s has not improved for %d round(s)",
                          r, result["state"]["monitor"], result["state"]["stale"])
            break


def evaluate_stage(params: Params, layout: Layout, data: DataRef) -> dict[str, Any]:
    from tasks import cohyde as t

    keys = read_part_keys(layout.run_dir)
    last = max((k for k in keys if k.startswith("round")), default="rewriter", key=lambda k: int(k[5:] or 0))
    common = {"run_dir": str(layout.run_dir), "dataset_dir": data.dataset_dir,
              "dataset_fingerprint": data.fingerprint, "params": params.model_dump(mode="json")}
    result = run_step(
        t.write_reports, label="reports", outputs=[layout.metrics_file, layout.plots_csv, layout.report_dir],
        part_key=keys.get(last, ""), metrics_file=str(layout.metrics_file), plots_csv=str(layout.plots_csv),
        report_dir=str(layout.report_dir), **common,
    )
    history, stages, split = result["history"], result["stages"], result["monitor_split"]
    rows = [{"label": f"{r['stage']} ({split})", **r} for r in history if r["split"] == split and r["group"] == "overall"]
    with open_tracker(params, layout) as tracker:
        log_common(tracker, params, layout, data)
        for r in history:  # per stage (step), per split and group
            step = stages.index(r["stage"])
            tracker.log_metrics({f"{r['split']}/{r['group']}/ndcg@5": r["ndcg@5"],
                                 f"{r['split']}/{r['group']}/recall@5": r["recall@5"]}, step=step)
            if r["split"] == split and r["group"] == "overall":
                tracker.log_metrics({"eval/ndcg@5": r["ndcg@5"], "eval/recall@5": r["recall@5"]}, step=step)
                if "pairs" in r:
                    tracker.log_metrics({"train/dpo_pairs": r["pairs"], "train/ties_dropped": r["ties_dropped"],
                                         "train/mean_score_gap": r["mean_score_gap"]}, step=step)
        tracker.set_tags({"stages": ",".join(f"{i}={s}" for i, s in enumerate(stages))})
        tracker.log_artifact(layout.metrics_file)
        tracker.log_artifact(layout.plots_csv, "plots")
        tracker.log_artifact(layout.report_dir, "report")
        summary = finish_summary(rows, tracker, layout, {"table_metrics": ("ndcg@5", "recall@5")})
    return summary


@flow(name="cohyde")
def cohyde_flow(params_path: str = "params.yaml", overrides: list[str] | None = None, stage: str = ALL) -> dict[str, Any]:
    """CoHyDE end to end (or one DVC stage)."""
    return run_stages(METHOD, "CoHyDE", params_path, overrides, stage,
                      train_steps=lambda params: 5 + params.cohyde.rounds,
                      train_stage=train_stage, evaluate_stage=evaluate_stage)


if __name__ == "__main__":
    from flows.common import main

    main(cohyde_flow)
