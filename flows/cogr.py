"""CoGR as a Prefect flow: prepare -> validate -> train [Algorithm 1 seeds, SFT, alternating
query/item GRPO phases with early stopping] -> evaluate [BM25, the phase chosen on val on the
test split, Lucene export, reports, one MLflow run]. `coevo run cogr`, `dvc repro` and the
deployments in prefect.yaml all start it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root, as for prefect.yaml entrypoints

from prefect import flow  # noqa: E402

from flows.common import ALL, main, run_pipeline  # noqa: E402


@flow(name="cogr")
def cogr_flow(params_path: str | list[str] = "params.yaml", overrides: list[str] | None = None, stage: str = ALL,
              train_deployment: str | None = None) -> dict[str, Any]:
    """CoGR end to end (or one DVC stage). `train_deployment` ("cogr/train-gpu") hands the
    train stage to a deployment on the GPU work pool and waits for it."""
    train = None
    if train_deployment:
        def train() -> None:
            _train_elsewhere(train_deployment, params_path, overrides)
    return run_pipeline("cogr", params_path, overrides, stage, train=train)


def _train_elsewhere(deployment: str, params_path: str | list[str], overrides: list[str] | None) -> None:
    """Run the train stage as a flow run of `deployment` (e.g. on the GPU pool) and wait."""
    from prefect.deployments import run_deployment

    run = run_deployment(deployment, parameters={"params_path": params_path, "overrides": overrides or [],
                                                 "stage": "train"})
    if not run.state or not run.state.is_completed():
        raise RuntimeError(f"train stage on deployment {deployment!r} ended "
                           f"{run.state.name if run.state else 'without a state'}")


if __name__ == "__main__":
    main(cogr_flow)
