"""CoHyDE as a Prefect flow: prepare -> validate -> train [raw encoder, S1a encoder, S1b
rewriter warm-up, vanilla HyDE, then rounds of S2-S4 + DPO with early stopping] -> evaluate
[the round chosen on val on the test split, per-group reports, one MLflow run]."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root, as for prefect.yaml entrypoints

from prefect import flow  # noqa: E402

from flows.common import ALL, main, run_pipeline  # noqa: E402


@flow(name="cohyde")
def cohyde_flow(params_path: str | list[str] = "params.yaml", overrides: list[str] | None = None,
              stage: str = ALL) -> dict[str, Any]:
    """CoHyDE end to end (or one DVC stage)."""
    return run_pipeline("cohyde", params_path, overrides, stage)


if __name__ == "__main__":
    main(cohyde_flow)
