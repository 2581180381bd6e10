"""The last task of every flow: log the trained retriever as an MLflow model, register it, gate it.

:func:`publish` runs inside the flow's MLflow run (after the final table is logged):

1. the retriever of the phase chosen on val (:func:`coevo.serving.search.from_run`) is logged
   as a pyfunc model of the run (``runs:/<run_id>/model``; :mod:`coevo.serving.pyfunc`);
2. it becomes a new version of ``coevo-<method>-<dataset>`` with alias ``challenger``;
3. the champion gate (:func:`coevo.serving.registry.promote`) compares it with the current
   ``champion`` on the test split, query by query, on the method's headline metric; alias
   ``champion`` moves only when the 95% paired-bootstrap CI of the difference lies above 0
   (or when there is no champion yet);
4. the run gets its name (``<method>-<dataset>-<stage or date>``), its description (data set,
   generator, the final table, the decision) and ``registry.*`` tags and ``gate/*`` metrics.

It returns the decision as a dict for the flow's summary (``summary["registry"]``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TYPE_CHECKING

from coevo.orchestration.tracking import Tracker, git_commit, run_description, run_name
from coevo.serving import registry
from coevo.serving.search import from_run

if TYPE_CHECKING:  # types only: importing them here would pull in heavy libraries or cycles
    from coevo.config import Params
    from coevo.orchestration.pipeline import Pipeline


@contextlib.contextmanager
def active_run(run_id: str) -> Iterator[None]:
    """The tracker's run as MLflow's active (fluent) run, which ``log_model`` logs into."""
    import mlflow

    active = mlflow.active_run()
    if active is not None and active.info.run_id == run_id:
        yield
        return
    with mlflow.start_run(run_id=run_id, nested=active is not None):
        yield


def _bootstrap(params: Params) -> dict[str, Any]:
    found = getattr(params.evaluation, "bootstrap", None)
    return found.model_dump(mode="json") if hasattr(found, "model_dump") else {}


def _final_values(final: Mapping[str, Any] | None, phase: str, metric: str) -> dict[str, float] | None:
    """The flow's own per-query values of the served phase on the test split, when it has them."""
    if not final or final.get("split") != registry.GATE_SPLIT:
        return None
    rows = [r for r in final.get("rows", []) if r.get("phase") == phase and metric in (r.get("per_query") or {})]
    return dict(rows[-1]["per_query"][metric]) if rows else None


def publish(pipe: Pipeline, tracker: Tracker, *, table: Mapping[str, Any] | None = None,
            final: Mapping[str, Any] | None = None, stage: str | None = None, run_label: str | None = None,
            version_tags: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Log, register and gate the run's retriever (see the module notes); returns the decision."""
    from coevo.serving.pyfunc import log_retriever, tracking_uri, version_evaluator

    params, lay, method = pipe.params, pipe.layout, pipe.name
    retriever = from_run(method, lay.run_dir, params, lay.processed)
    manifest = retriever.manifest
    name = registry.model_name(method, lay.dataset)
    sha, _ = git_commit()
    version_tags = {
        "coevo.method": method, "coevo.dataset": lay.dataset, "coevo.dataset_dir": str(Path(lay.processed).resolve()),
        "coevo.data_fingerprint": manifest["data_fingerprint"], "coevo.phase": manifest["phase"],
        "coevo.phase_key": manifest["phase_key"], "coevo.generator": manifest["generator"], "git.commit": sha,
        **(version_tags or {}),  # the run's DVC record: checkpoint md5, experiment (orchestration.dvc_record)
    }
    with tracking_uri(tracker.uri):
        with active_run(tracker.run_id):
            info = log_retriever(retriever, tags={"coevo.method": method, "coevo.dataset": lay.dataset})
        # the registry resolves the models:/<model_id> source through MLflow's global tracking URI
        version = registry.register_version(
            tracker.client, name, source=info.model_uri, run_id=tracker.run_id,
            model_id=getattr(info, "model_id", None), tags=version_tags,
            description=f"{retriever.describe()}; MLflow run {tracker.run_id}")
    metric = registry.headline_metric(method, params)
    evaluate = version_evaluator(name, lay.processed, metric, split=registry.GATE_SPLIT, tracking=tracker.uri)
    decision = registry.promote(tracker.client, name, metric=metric, evaluate=evaluate,
                                challenger_values=_final_values(final, manifest["phase"], metric),
                                bootstrap=_bootstrap(params))
    result = {**decision.as_dict(), "version": version, "model_uri": f"models:/{name}/{version}",
              "summary": decision.summary(), "run_model_uri": f"runs:/{tracker.run_id}/model"}

    tracker.set_tags({"registry.model": name, "registry.version": version, "registry.decision": decision.decision,
                      "registry.champion": decision.champion_now, "registry.metric": metric})
    # Every run says whether it became the champion (a first version too, with nothing to compare);
    # the difference from the champion exists only where there was one.
    gate = {"gate/promoted": float(decision.promoted)}
    if decision.difference:
        d = decision.difference
        gate.update({f"gate/{metric}/difference": d["mean"], f"gate/{metric}/ci_low": d["ci_low"],
                     f"gate/{metric}/ci_high": d["ci_high"], f"gate/{metric}/p_value": d["p_value"]})
    tracker.log_metrics(gate)
    tracker.rename(run_label or run_name(method, lay.dataset, stage))
    rows = (table or {}).get("rows") or []
    columns = (table or {}).get("columns") or list(pipe.method_cls.table_metrics)
    tracker.describe(run_description(
        title=pipe.method_cls.title, dataset=lay.dataset, generator=manifest["generator"], rows=rows,
        columns=columns,
        notes=[f"Served phase: `{manifest['phase']}` (chosen on val). Model: `{result['model_uri']}` "
               f"(logged as `{result['run_model_uri']}`).", f"Registry: {decision.summary()}"]))
    return result
