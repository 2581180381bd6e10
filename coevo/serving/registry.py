"""Model registry and the champion gate, as functions over an ``MlflowClient``.

Each training run registers a new version of ``coevo-<method>-<dataset>`` and points alias
``challenger`` at it (:func:`register_version`). :func:`promote` then decides whether alias
``champion`` moves to the challenger:

- no champion yet: promote (nothing to compare with);
- the challenger already is the champion: nothing to do;
- ``force``: promote without comparing (``coevo promote NAME --force``);
- otherwise compare both on the held-out test split, query by query, on the method's headline
  metric (its spec's ``headline``: CoGR ``f1``, GRAPE ``recall@10``, CoHyDE ``ndcg@5``;
  configurable): promote only when the 95% paired-bootstrap CI of the mean difference
  (challenger - champion, :func:`coevo.stats.paired_difference`) lies above 0, i.e. its
  lower bound is > 0. A tie, a smaller gain than the noise, or a loss keeps the champion.

The decision and its figures are tagged on both versions (``coevo.gate.*``) and returned as a
:class:`Decision` for the flow's final table and the CLI. ``evaluate(version)`` (per-query
values of the metric for a model version) is passed in: the caller loads the model and
scores it (``coevo.orchestration.publish`` and ``coevo promote`` use :mod:`coevo.serving.pyfunc`), so
this module never imports MLflow and every rule is testable with a stub client.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, TYPE_CHECKING

if TYPE_CHECKING:  # types only: importing them here would pull in heavy libraries or cycles
    from coevo.config import Params

CHALLENGER, CHAMPION = "challenger", "champion"
PROMOTED, KEPT, UNCHANGED = "promoted", "kept", "unchanged"
GATE_SPLIT = "test"
TAG = "coevo.gate"

Evaluator = Callable[[str], Mapping[str, float]]


def model_name(method: str, dataset: str) -> str:
    """``coevo-<method>-<dataset>``: one registered model per method and data set."""
    return f"coevo-{method}-{dataset}"


def headline_metric(method: str, params: Params | None = None) -> str:
    """The gate's metric: ``registry.promote_metric[<method>]`` in params when set, else the default."""
    configured = getattr(getattr(params, "registry", None), "promote_metric", None) or {}
    if isinstance(configured, Mapping) and configured.get(method):
        return str(configured[method])
    from coevo.methods import spec_of

    return spec_of(method).headline


def method_of(name: str) -> str:
    """The method of a registered model name ``coevo-<method>-<dataset>``."""
    from coevo.methods import SPECS

    parts = name.split("-", 2)
    if len(parts) < 3 or parts[0] != "coevo" or parts[1] not in SPECS:
        raise ValueError(f"{name!r} is not a coevo model name (coevo-<{'|'.join(SPECS)}>-<dataset>)")
    return parts[1]


def aliases(client: Any, name: str) -> dict[str, str]:
    """{alias: version} of a registered model ({} when it does not exist)."""
    found = client.search_registered_models(filter_string=f"name = '{name}'")
    return {str(k): str(v) for k, v in found[0].aliases.items()} if found else {}


def register_version(client: Any, name: str, *, source: str, run_id: str | None = None, model_id: str | None = None,
                     tags: Mapping[str, Any] | None = None, description: str | None = None) -> str:
    """A new version of ``name`` (created on first use) from ``source``; alias ``challenger`` set on it.

    ``source`` is the logged model's URI (``models:/<model_id>``): MLflow's registry resolves
    it through the *global* tracking URI, which must name the client's store (callers wrap
    this in :func:`coevo.serving.pyfunc.tracking_uri`)."""
    if not client.search_registered_models(filter_string=f"name = '{name}'"):
        client.create_registered_model(
            name, tags={"coevo.method": method_of(name)},
            description=f"coevo retriever ({name}). Alias `{CHAMPION}`: the version in use; `{CHALLENGER}`: "
                        "the latest trained, promoted only when it beats the champion on the test split.")
    version = client.create_model_version(name, source=source, run_id=run_id, model_id=model_id,
                                          tags={k: str(v) for k, v in (tags or {}).items()}, description=description)
    client.set_registered_model_alias(name, CHALLENGER, str(version.version))
    return str(version.version)


@dataclass
class Decision:
    """What the gate decided and why, with the figures behind it."""

    name: str
    challenger: str
    champion: str | None  # the champion before the decision
    decision: str  # promoted | kept | unchanged
    reason: str
    metric: str
    split: str = GATE_SPLIT
    forced: bool = False
    difference: dict[str, Any] | None = field(default=None)  # challenger - champion (coevo.stats.Difference)

    @property
    def promoted(self) -> bool:
        return self.decision == PROMOTED

    @property
    def champion_now(self) -> str:
        return self.challenger if self.promoted else (self.champion or "")

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(promoted=self.promoted, champion_now=self.champion_now,
                   champion_uri=f"models:/{self.name}@{CHAMPION}")
        return out

    def summary(self) -> str:
        """One line: ``coevo-cogr-x v3: promoted to champion (was v2): <reason>``."""
        before = f"v{self.champion}" if self.champion else "none"
        verb = {PROMOTED: "promoted to champion", KEPT: f"kept champion v{self.champion}",
                UNCHANGED: "already champion"}[self.decision]
        return f"{self.name} v{self.challenger}: {verb} (champion before: {before}): {self.reason}"

    def tags(self) -> dict[str, str]:
        """``coevo.gate.*`` tags for the challenger's version."""
        out = {f"{TAG}.decision": self.decision, f"{TAG}.reason": self.reason, f"{TAG}.metric": self.metric,
               f"{TAG}.split": self.split, f"{TAG}.champion_before": self.champion or "none",
               f"{TAG}.forced": str(self.forced).lower()}
        d = self.difference
        if d:
            out.update({f"{TAG}.difference": _fmt(d["mean"]), f"{TAG}.ci95": f"[{_fmt(d['ci_low'])}, {_fmt(d['ci_high'])}]",
                        f"{TAG}.p_value": f"{d['p_value']:.4g}", f"{TAG}.n_queries": str(d["n"]),
                        f"{TAG}.challenger_mean": _fmt(d["mean_a"]), f"{TAG}.champion_mean": _fmt(d["mean_b"])})
        return out


def _fmt(value: float) -> str:
    return "nan" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:+.4f}"


def compare(challenger: Mapping[str, float], champion: Mapping[str, float], *,
            bootstrap: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Paired difference challenger - champion over the same queries (mean, CI, p, n, means)."""
    from coevo.stats import paired_difference

    settings = {k: v for k, v in (bootstrap or {}).items() if k in ("resamples", "permutations", "seed", "confidence")}
    return paired_difference(challenger, champion, **settings).as_dict()


def beats(difference: Mapping[str, Any]) -> bool:
    """The gate's rule: the CI's lower bound of challenger - champion is above 0."""
    return difference["ci_low"] > 0


def promote(client: Any, name: str, *, metric: str, evaluate: Evaluator | None = None, force: bool = False,
            challenger_values: Mapping[str, float] | None = None, bootstrap: Mapping[str, Any] | None = None,
            split: str = GATE_SPLIT) -> Decision:
    """Decide whether ``champion`` moves to the ``challenger`` of ``name``; tag both; return why.

    ``evaluate(version)`` gives ``{query_id: value}`` of ``metric`` on ``split`` for a
    version; ``challenger_values`` spares evaluating the challenger again when the caller
    already has them (the flow's final evaluation of the same phase, on the same split).
    """
    current = aliases(client, name)
    if CHALLENGER not in current:
        raise ValueError(f"{name}: no version has alias {CHALLENGER!r} (a training run sets it); nothing to promote")
    challenger, champion = current[CHALLENGER], current.get(CHAMPION)
    base = {"name": name, "challenger": challenger, "champion": champion, "metric": metric, "split": split,
            "forced": force}
    if champion == challenger:
        decision = Decision(**base, decision=UNCHANGED, reason=f"v{challenger} already is the champion")
    elif champion is None:
        decision = Decision(**base, decision=PROMOTED, reason="no champion yet")
    elif force:
        decision = Decision(**base, decision=PROMOTED, reason=f"forced (--force), without comparing with v{champion}")
    else:
        if evaluate is None:
            raise ValueError("the gate needs evaluate(version) to compare the challenger with the champion")
        ours = challenger_values if challenger_values is not None else evaluate(challenger)
        theirs = evaluate(champion)
        diff = compare(ours, theirs, bootstrap=bootstrap)
        level = f"{diff['confidence']:.0%}"
        figures = (f"{metric} on {split} ({diff['n']} queries): v{challenger} {diff['mean_a']:.4f} vs v{champion} "
                   f"{diff['mean_b']:.4f}, difference {diff['mean']:+.4f} [{diff['ci_low']:+.4f}, {diff['ci_high']:+.4f}] "
                   f"({level} paired bootstrap CI), p={diff['p_value']:.3g}")
        if beats(diff):
            decision = Decision(**base, decision=PROMOTED, difference=diff,
                                reason=f"beats the champion: {figures}; the CI lies above 0")
        else:
            decision = Decision(**base, decision=KEPT, difference=diff,
                                reason=f"does not beat the champion: {figures}; the CI's lower bound is not above 0")
    if decision.promoted:
        client.set_registered_model_alias(name, CHAMPION, challenger)
    record(client, decision)
    return decision


def record(client: Any, decision: Decision) -> None:
    """Tag the decision on the challenger, and what happened to it on the previous champion."""
    for key, value in decision.tags().items():
        client.set_model_version_tag(decision.name, decision.challenger, key, value)
    if decision.champion and decision.champion != decision.challenger:
        outcome = f"replaced by v{decision.challenger}" if decision.promoted else f"kept against v{decision.challenger}"
        champion_tags = {f"{TAG}.last_challenger": decision.challenger, f"{TAG}.outcome": outcome,
                         f"{TAG}.last_reason": decision.reason}
        for key, value in champion_tags.items():
            client.set_model_version_tag(decision.name, decision.champion, key, value)


def decision_lines(decision: Mapping[str, Any]) -> list[str]:
    """What the CLI prints after a run: the decision, and where the champion is served from."""
    lines = [f"registry: {decision['summary'] if 'summary' in decision else Decision(**_fields(decision)).summary()}"]
    lines.append(f"  serve: mlflow models serve -m {decision.get('champion_uri', 'models:/' + decision['name'] + '@champion')} "
                 "--env-manager local")
    return lines


def _fields(d: Mapping[str, Any]) -> dict[str, Any]:
    keep = {"name", "challenger", "champion", "decision", "reason", "metric", "split", "forced", "difference"}
    return {k: v for k, v in d.items() if k in keep}
