"""The CoGR pipeline as a Prefect flow.

prepare -> validate -> train [Algorithm 1 seeds, SFT (phase 0), then per round: query GRPO
(+ query-index rebuild + eval), item GRPO (+ item-index rebuild + eval), with early
stopping] -> evaluate [BM25 baseline, final evaluation of the best phase on the test split,
Lucene export, metrics.json / plots / PNGs, one MLflow run].

Run it with `coevo run cogr`, from DVC (`dvc repro`, one stage per call) or from a Prefect
deployment (prefect.yaml).
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from coevo.config import Params
from flows.common import (
    ALL,
    DataRef,
    Layout,
    Part,
    check_stage,
    data_stages,
    finish_summary,
    log_common,
    logger,
    open_tracker,
    plan,
    read_part_keys,
    reconcile_run_dir,
    run_step,
    wants,
)
from tasks.common import fingerprint

METHOD = "cogr"


def schedule_length(params: Params) -> int:
    """Phase count of a full run: SFT + per round a query phase (and an item phase)."""
    per_round = 1 if params.cogr.query_side_only else 2
    return 1 + params.cogr.rounds * per_round


def run_parts(params: Params) -> list[Part]:
    """What each piece of the CoGR run dir depends on (for reuse across params changes).

    `rounds` is left out of the phases' params: adding a round keeps the finished phases.
    """
    cogr = params.cogr.model_dump()
    base = {k: v for k, v in cogr.items() if k != "rounds"}
    sft_params = {k: v for k, v in base.items() if k not in ("grpo", "query_side_only", "item_reward")}
    seed_params = {
        "g0": cogr["seed_generator"] or cogr["generator"],
        **{k: cogr[k] for k in ("m_item_keywords", "n_query_keywords", "sampling", "seed_temperature", "sft_init")},
    }
    parts = [
        # config.json is the library's own guard against resuming with other params; the
        # stamp takes over that job, so it is rewritten whenever anything changed.
        Part("config", {"seed": params.seed, **cogr}, ("config.json", "scratch")),
        Part("seed", {"seed": params.seed, **seed_params}, ("seed",)),
        Part("phase0", {"seed": params.seed, **sft_params}, ("phases/00_*",), after=("seed",)),
    ]
    for i in range(1, schedule_length(params)):
        parts.append(Part(f"phase{i}", {"seed": params.seed, **base}, (f"phases/{i:02d}_*",), after=(f"phase{i - 1}",)))
    return parts


def _drop_extra_phases(params: Params, layout: Layout) -> None:
    """Phases beyond the schedule (after lowering `rounds`) must not linger in the DVC output."""
    import shutil

    folder = layout.run_dir / "phases"
    if folder.exists():
        for path in folder.iterdir():
            head = path.name.split("_", 1)[0]
            if head.isdigit() and int(head) >= schedule_length(params):
                shutil.rmtree(path)


def train_stage(params: Params, layout: Layout, data: DataRef) -> list[dict[str, Any]]:
    """Seeds, SFT, GRPO phases; stops early when the library's early-stopping state says so."""
    from tasks import cogr as t

    removed, keys = reconcile_run_dir(layout.run_dir, run_parts(params), data.fingerprint)
    _drop_extra_phases(params, layout)
    if removed:
        logger().info("params or data changed: recomputing %s", ", ".join(removed))
    common = {
        "run_dir": str(layout.run_dir),
        "dataset_dir": data.dataset_dir,
        "dataset_fingerprint": data.fingerprint,
        "params": params.model_dump(mode="json"),
    }
    if params.cogr.sft_init:
        run_step(t.seed_keywords, label="Algorithm 1 seeds", outputs=[layout.run_dir / "seed"], part_key=keys["seed"], **common)
    phase0 = "sft" if params.cogr.sft_init else "base"
    result = run_step(
        t.sft, label=f"phase 0 ({phase0})", outputs=[t.phase_folder(layout.run_dir, f"00_{phase0}")],
        part_key=keys["phase0"], **common,
    )
    records = [result["record"]]
    per_round = 1 if params.cogr.query_side_only else 2
    for index in range(1, schedule_length(params)):
        if result["early_stopping"]["stop"]:
            logger().info(
                "early stopping after phase %d: %s has not improved for %d phase(s)",
                index - 1, result["early_stopping"]["metric"], result["early_stopping"]["stale_phases"],
            )
            break
        round_, side = (index - 1) // per_round + 1, ("query", "item")[(index - 1) % per_round]
        name = f"{index:02d}_{side}"
        result = run_step(
            t.grpo_phase, label=f"round {round_}: {side} GRPO", outputs=[t.phase_folder(layout.run_dir, name)],
            part_key=keys[f"phase{index}"], index=index, **common,
        )
        records.append(result["record"])
    return records


def _history(params: Params, layout: Layout, data: DataRef) -> list[dict[str, Any]]:
    from coevo.methods.cogr import CoGRRun

    run = CoGRRun(layout.run_dir, params, data.dataset_dir, progress=False)
    history = run.history()
    if not history:
        raise FileNotFoundError(f"{layout.run_dir}: no finished CoGR phase; run the train stage first")
    return history


def _best_phase(params: Params, layout: Layout, history: list[dict[str, Any]]) -> int:
    from coevo.io import read_json

    last = history[-1]
    state = read_json(layout.run_dir / "phases" / last["name"] / "history.json")["early_stopping"]
    return int(state["best_phase"]) if state.get("best_phase") is not None else int(last["phase"])


def evaluate_stage(params: Params, layout: Layout, data: DataRef) -> dict[str, Any]:
    from tasks import cogr as t
    from tasks.baseline import bm25_baseline, export_lucene
    from tasks.tracking import phase_metrics

    history = _history(params, layout, data)
    keys = read_part_keys(layout.run_dir)
    eval_split, test_split = params.cogr.eval_split, "test"
    common = {
        "run_dir": str(layout.run_dir),
        "dataset_dir": data.dataset_dir,
        "dataset_fingerprint": data.fingerprint,
        "params": params.model_dump(mode="json"),
    }
    bm25 = {}
    for split in dict.fromkeys((eval_split, test_split)):
        bm25[split] = run_step(
            bm25_baseline, label=f"BM25 baseline ({split})", dataset_dir=data.dataset_dir,
            dataset_fingerprint=data.fingerprint, split=split,
        )
    best = _best_phase(params, layout, history)
    last_key = keys.get(f"phase{history[-1]['phase']}", "")
    final = run_step(
        t.final_evaluation, label=f"final evaluation (phase {best}, {test_split})",
        part_key=last_key, index=best, split=test_split, **common,
    )
    lucene_dir = layout.index_dir / "lucene"
    run_step(
        export_lucene, label="Lucene export", outputs=[lucene_dir], keywords_path=final["keywords_path"],
        keywords_fingerprint=final["keywords_fingerprint"], out_dir=str(lucene_dir),
    )
    reports = run_step(
        t.write_reports, label="reports", outputs=[layout.metrics_file, layout.plots_csv, layout.report_dir],
        part_key=last_key, history=history, bm25=bm25, final=final, metrics_file=str(layout.metrics_file),
        plots_csv=str(layout.plots_csv), report_dir=str(layout.report_dir), **common,
    )

    rows = [{"label": f"BM25 ({eval_split})", **bm25[eval_split]}]
    for record in history:
        label = "SFT" if record["kind"] == "sft" else ("base" if record["kind"] == "base" else f"round {record['round']} {record['kind']}")
        rows.append({"label": label, **{k.split("/", 1)[1]: v for k, v in record.items() if k.startswith("eval/")}})
    rows.append({"label": f"BM25 ({test_split})", **bm25[test_split]})
    rows.append({"label": f"best phase {best} ({test_split})", **final["metrics"]})

    with open_tracker(params, layout) as tracker:
        log_common(tracker, params, layout, data)
        for record in history:
            tracker.log_metrics(phase_metrics(record), step=int(record["phase"]))
        tracker.log_metrics({f"bm25/{k}": v for k, v in bm25[eval_split].items()}, step=0)
        tracker.log_metrics({f"bm25_{test_split}/{k}": v for k, v in bm25[test_split].items()}, step=0)
        tracker.log_metrics({f"{test_split}/{k}": v for k, v in final["metrics"].items()}, step=best)
        tracker.set_tags({"best_phase": best, f"dvc.md5.{lucene_dir}": fingerprint(lucene_dir)})
        tracker.log_artifact(layout.metrics_file)
        tracker.log_artifact(layout.plots_csv, "plots")
        tracker.log_artifact(layout.report_dir, "report")
        summary = finish_summary(rows, tracker, layout, {"best_phase": best, "reports": reports["files"]})
    return summary


@flow(name="cogr")
def cogr_flow(
    params_path: str = "params.yaml",
    overrides: list[str] | None = None,
    stage: str = ALL,
    train_deployment: str | None = None,
) -> dict[str, Any]:
    """CoGR end to end (or one DVC stage). `train_deployment` ("cogr/train-gpu") hands the
    train stage to a deployment on the GPU work pool and waits for it."""
    from flows.common import load_checked

    params = load_checked(params_path, overrides)
    check_stage(stage)
    layout = Layout.of(params, METHOD)
    if wants(stage, "evaluate"):
        from tasks.tracking import check_reachable

        check_reachable(params.tracking.uri)  # fail now, not after an hour of training
    total = sum(wants(stage, s) for s in ("prepare", "validate")) + 5 * wants(stage, "evaluate")
    plan(total + (schedule_length(params) + 1) * wants(stage, "train"), f"CoGR on {params.data.dataset}")
    data = data_stages(params, layout, stage)
    if stage in ("prepare", "validate"):
        return finish_summary([], None, layout)
    if wants(stage, "train"):
        if train_deployment:
            _train_elsewhere(train_deployment, params_path, overrides)
        else:
            train_stage(params, layout, data)
    if stage == "train":
        return finish_summary([], None, layout)
    return evaluate_stage(params, layout, data)


def _train_elsewhere(deployment: str, params_path: str, overrides: list[str] | None) -> None:
    """Run the train stage as a flow run of `deployment` (e.g. on the GPU pool) and wait."""
    from prefect.deployments import run_deployment

    flow_run = run_deployment(
        deployment, parameters={"params_path": params_path, "overrides": overrides or [], "stage": "train"}
    )
    if not flow_run.state or not flow_run.state.is_completed():
        raise RuntimeError(f"train stage on deployment {deployment!r} ended {flow_run.state.name if flow_run.state else 'without a state'}")


if __name__ == "__main__":
    from flows.common import main

    main(cogr_flow)
