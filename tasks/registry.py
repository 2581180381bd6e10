"""The last task of every flow (log, register, champion gate): :mod:`coevo.orchestration.publish`, re-exported."""

from coevo.orchestration.publish import active_run, publish

__all__ = ["active_run", "publish"]
