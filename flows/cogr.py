"""CoGR as a Prefect flow: prepare -> validate -> train [Algorithm 1 seeds, SFT, alternating
query/item GRPO phases with early stopping] -> evaluate [BM25, the phase chosen on val on the
test split, Lucene export, reports, one MLflow run]. `coevo run cogr`, `dvc repro` and the
deployments in prefect.yaml all start it."""

from __future__ import annotations

from coevo.orchestration.flow import main, method_flow

cogr_flow = method_flow("cogr")

if __name__ == "__main__":
    main(cogr_flow)
