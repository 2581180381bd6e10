"""GRAPE as a Prefect flow: prepare -> validate -> train [frozen-retriever index, raw and
untrained evaluations, GRPO with the corpus-rank reward, trained evaluation] -> evaluate
[raw / untrained / trained on the test split, monitor curves, reports, one MLflow run]."""

from __future__ import annotations

from coevo.orchestration.flow import main, method_flow

grape_flow = method_flow("grape")

if __name__ == "__main__":
    main(grape_flow)
