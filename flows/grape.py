"""GRAPE as a Prefect flow: prepare -> validate -> train [frozen-retriever index, raw and
untrained evaluations, GRPO with the corpus-rank reward, trained evaluation] -> evaluate
[raw / untrained / trained on the test split, monitor curves, reports, one MLflow run]."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root, as for prefect.yaml entrypoints

from prefect import flow  # noqa: E402

from flows.common import ALL, main, run_pipeline  # noqa: E402


@flow(name="grape")
def grape_flow(params_path: str | list[str] = "params.yaml", overrides: list[str] | None = None,
              stage: str = ALL) -> dict[str, Any]:
    """GRAPE end to end (or one DVC stage)."""
    return run_pipeline("grape", params_path, overrides, stage)


if __name__ == "__main__":
    main(grape_flow)
