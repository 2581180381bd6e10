"""GRAPE as a Prefect flow: prepare -> validate -> train [frozen-retriever index, raw and
untrained evaluations, GRPO with the corpus-rank reward, trained evaluation] -> evaluate
[raw / untrained / trained on the test split, monitor curves, reports, one MLflow run]."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root, as for prefect.yaml entrypoints

from flows.common import main, method_flow  # noqa: E402

grape_flow = method_flow("grape")

if __name__ == "__main__":
    main(grape_flow)
