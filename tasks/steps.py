"""One Prefect task per pipeline step: :mod:`coevo.orchestration.prefect_tasks`, re-exported."""

from coevo.orchestration.prefect_tasks import RESULTS_DIR, StepKey, execute, fan_out, is_transient, rebuild_step

__all__ = ["RESULTS_DIR", "StepKey", "execute", "fan_out", "is_transient", "rebuild_step"]
