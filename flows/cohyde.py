"""CoHyDE as a Prefect flow: prepare -> validate -> train [raw encoder, S1a encoder, S1b
rewriter warm-up, vanilla HyDE, then rounds of S2, S3, S4, DPO and val with early stopping] -> evaluate
[the round chosen on val on the test split, per-group reports, one MLflow run]."""

from __future__ import annotations

from coevo.orchestration.flow import main, method_flow

cohyde_flow = method_flow("cohyde")

if __name__ == "__main__":
    main(cohyde_flow)
