"""MLflow tracking for the flows: :mod:`coevo.orchestration.tracking`, re-exported."""

from coevo.orchestration.tracking import (
    EXPERIMENT_KIND_TAG,
    MLFLOW_UI_PORT,
    MODEL_TRAINING,
    MODEL_TRAINING_VIEW,
    NOTE_TAG,
    NUMERICS_TAG_PREFIX,
    PRECISION_PARAM,
    Tracker,
    TrackingError,
    absolute_uri,
    check_reachable,
    git_commit,
    init_tracking_store,
    markdown_table,
    metric_name,
    numerics_tags,
    phase_metrics,
    run_description,
    run_name,
)

__all__ = ["EXPERIMENT_KIND_TAG", "MLFLOW_UI_PORT", "MODEL_TRAINING", "MODEL_TRAINING_VIEW", "NOTE_TAG",
           "NUMERICS_TAG_PREFIX", "PRECISION_PARAM", "Tracker", "TrackingError", "absolute_uri", "check_reachable",
           "git_commit", "init_tracking_store", "markdown_table", "metric_name", "numerics_tags", "phase_metrics",
           "run_description", "run_name"]
