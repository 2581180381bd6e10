"""The project's Prefect tasks: thin re-exports of the installed package (``coevo.orchestration``).

The tasks, the MLflow tracker and the publish gate live in ``coevo.orchestration``; these modules
keep the old import paths of a project's own flows working (``from tasks.tracking import Tracker``).
"""
