"""CoGR as a Prefect flow: prepare -> validate -> train [Algorithm 1 seeds, SFT, alternating
query/item GRPO phases with early stopping] -> evaluate [BM25, the phase chosen on val on the
test split, Lucene export, reports, one MLflow run]. `coevo run cogr`, `dvc repro` and the
deployments in prefect.yaml all start it."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root, as for prefect.yaml entrypoints

from flows.common import main, method_flow  # noqa: E402

cogr_flow = method_flow("cogr")

if __name__ == "__main__":
    main(cogr_flow)
