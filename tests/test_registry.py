"""Registry and champion gate: the rule (first run, promote, keep, forced, unchanged) on an
in-memory client; then the flow's last task end to end on a real MLflow store (log, register,
gate with real evaluations, run name and description, experiment type), and `coevo promote`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from typer.testing import CliRunner

from coevo.serving import registry
from tests.test_search import DATASET, cli, trained

NAME = registry.model_name("cogr", DATASET)


# ----------------------------------------------------------------------------- an in-memory client
@dataclass
class _Model:
    name: str
    aliases: dict[str, str] = field(default_factory=dict)


@dataclass
class _Version:
    version: str


class FakeClient:
    """The MlflowClient calls registry.py makes, in memory."""

    def __init__(self) -> None:
        self.models: dict[str, _Model] = {}
        self.versions: dict[str, list[dict]] = {}
        self.tags: dict[tuple[str, str], dict[str, str]] = {}

    def search_registered_models(self, filter_string: str):
        name = filter_string.split("'")[1]
        return [self.models[name]] if name in self.models else []

    def create_registered_model(self, name, tags=None, description=None):
        self.models[name] = _Model(name)
        self.versions[name] = []

    def create_model_version(self, name, source, run_id=None, model_id=None, tags=None, description=None):
        self.versions[name].append({"source": source, "run_id": run_id, "model_id": model_id})
        version = str(len(self.versions[name]))
        self.tags[(name, version)] = dict(tags or {})
        return _Version(version)

    def set_registered_model_alias(self, name, alias, version):
        self.models[name].aliases[alias] = str(version)

    def set_model_version_tag(self, name, version, key, value):
        self.tags[(name, str(version))][key] = value


def values(mean: float, n: int = 40, spread: float = 0.2, seed: int = 0) -> dict[str, float]:
    """Per-query values around ``mean`` (deterministic)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return {f"q{i:03d}": float(v) for i, v in enumerate(np.clip(mean + spread * rng.standard_normal(n), 0, 1))}


def _register(client, n: int = 1) -> list[str]:
    return [registry.register_version(client, NAME, source=f"models:/m-{i}", run_id=f"r{i}") for i in range(n)]


def test_the_first_version_becomes_champion_without_any_evaluation():
    client = FakeClient()
    assert _register(client) == ["1"]
    assert registry.aliases(client, NAME) == {"challenger": "1"}

    def never(version):
        raise AssertionError("nothing to compare with: no evaluation")

    decision = registry.promote(client, NAME, metric="f1", evaluate=never)
    assert decision.promoted and decision.reason == "no champion yet" and decision.champion is None
    assert registry.aliases(client, NAME) == {"challenger": "1", "champion": "1"}
    assert client.tags[(NAME, "1")]["coevo.gate.decision"] == "promoted"
    again = registry.promote(client, NAME, metric="f1", evaluate=never)
    assert again.decision == registry.UNCHANGED and "already is the champion" in again.reason


def test_a_better_challenger_moves_the_champion_and_both_versions_say_why():
    client = FakeClient()
    _register(client)
    registry.promote(client, NAME, metric="f1")
    _register(client)
    scores = {"1": values(0.30, seed=1), "2": {q: min(1.0, v + 0.1) for q, v in values(0.30, seed=1).items()}}
    asked = []

    def evaluate(version):
        asked.append(version)
        return scores[version]

    decision = registry.promote(client, NAME, metric="f1", evaluate=evaluate)
    assert asked == ["2", "1"]
    assert decision.promoted and decision.champion == "1" and decision.champion_now == "2"
    assert decision.difference["ci_low"] > 0 and decision.difference["n"] == 40
    assert "beats the champion" in decision.reason and "f1 on test (40 queries)" in decision.reason
    assert registry.aliases(client, NAME)["champion"] == "2"
    tags2, tags1 = client.tags[(NAME, "2")], client.tags[(NAME, "1")]
    assert tags2["coevo.gate.decision"] == "promoted" and tags2["coevo.gate.champion_before"] == "1"
    assert tags2["coevo.gate.metric"] == "f1" and tags2["coevo.gate.difference"] == "+0.1000"
    assert tags2["coevo.gate.ci95"].startswith("[+") and float(tags2["coevo.gate.p_value"]) < 0.05
    assert tags1["coevo.gate.outcome"] == "replaced by v2" and tags1["coevo.gate.last_challenger"] == "2"
    assert "promoted to champion (champion before: v1)" in decision.summary()


@pytest.mark.parametrize("shift,why", [(-0.1, "worse"), (0.0, "equal"), (0.01, "a gain smaller than the noise")])
def test_a_challenger_that_does_not_clearly_beat_the_champion_is_kept_out(shift, why):
    client = FakeClient()
    _register(client)
    registry.promote(client, NAME, metric="ndcg@5")
    _register(client)
    champion = values(0.5, seed=2)
    challenger = {q: min(1.0, max(0.0, v + shift + (0.3 if i % 2 else -0.3) * (shift != 0)))
                  for i, (q, v) in enumerate(champion.items())} if shift else dict(champion)
    decision = registry.promote(client, NAME, metric="ndcg@5", evaluate={"1": champion, "2": challenger}.get)
    assert decision.decision == registry.KEPT, why
    assert decision.difference["ci_low"] <= 0
    assert "does not beat the champion" in decision.reason and "lower bound is not above 0" in decision.reason
    assert registry.aliases(client, NAME) == {"challenger": "2", "champion": "1"}
    assert client.tags[(NAME, "2")]["coevo.gate.decision"] == "kept"
    assert client.tags[(NAME, "1")]["coevo.gate.outcome"] == "kept against v2"
    assert "kept champion v1" in decision.summary()


def test_force_promotes_without_comparing_and_known_values_spare_an_evaluation():
    client = FakeClient()
    _register(client)
    registry.promote(client, NAME, metric="f1")
    _register(client)
    forced = registry.promote(client, NAME, metric="f1", force=True, evaluate=None)
    assert forced.promoted and forced.forced and "forced" in forced.reason and forced.difference is None
    assert client.tags[(NAME, "2")]["coevo.gate.forced"] == "true"
    _register(client)
    asked = []

    def evaluate(version):
        asked.append(version)
        return values(0.2, seed=3)

    decision = registry.promote(client, NAME, metric="f1", evaluate=evaluate, challenger_values=values(0.2, seed=3))
    assert asked == ["2"]  # only the champion was evaluated
    assert decision.decision == registry.KEPT and decision.difference["mean"] == 0.0


def test_without_a_challenger_or_an_evaluator_the_gate_says_so():
    client = FakeClient()
    client.create_registered_model(NAME)
    with pytest.raises(ValueError, match="no version has alias 'challenger'"):
        registry.promote(client, NAME, metric="f1")
    _register(client, 2)
    client.set_registered_model_alias(NAME, "champion", "1")
    with pytest.raises(ValueError, match="needs evaluate"):
        registry.promote(client, NAME, metric="f1")


def test_names_and_headline_metrics():
    assert registry.model_name("grape", "metatool_sample") == "coevo-grape-metatool_sample"
    assert registry.method_of("coevo-cohyde-stb_sample") == "cohyde"
    with pytest.raises(ValueError, match="not a coevo model name"):
        registry.method_of("other-model")
    assert [registry.headline_metric(m) for m in ("cogr", "grape", "cohyde")] == ["f1", "recall@10", "ndcg@5"]

    @dataclass
    class Registry:
        promote_metric: dict

    @dataclass
    class Params:
        registry: Registry

    assert registry.headline_metric("cogr", Params(Registry({"cogr": "ndcg@10"}))) == "ndcg@10"
    assert registry.headline_metric("grape", Params(Registry({"cogr": "ndcg@10"}))) == "recall@10"


# ----------------------------------------------------------------------------- MLflow UI
def test_experiments_are_model_training_experiments_runs_have_names_and_descriptions(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from coevo.orchestration.tracking import (EXPERIMENT_KIND_TAG, MODEL_TRAINING, NOTE_TAG, Tracker, run_description,
                                              run_name)

    monkeypatch.chdir(tmp_path)
    uri = "sqlite:///mlflow.db"
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    old = client.create_experiment("grape", artifact_location=(tmp_path / "old").as_uri())  # made before the tag
    with Tracker(uri=uri, artifact_root="mlruns", experiment="cogr") as tracker:
        assert tracker.run_name.startswith("cogr-20")
        tracker.rename(run_name("cogr", DATASET, "evaluate"))
        tracker.describe(run_description(title="CoGR", dataset=DATASET, generator="tiny",
                                         rows=[{"label": "BM25 (test)", "split": "test", "n_queries": 12, "f1": 0.25}],
                                         columns=["f1"], notes=["Registry: promoted"]))
    with Tracker(uri=uri, artifact_root="mlruns", experiment="grape"):
        pass
    assert client.get_experiment_by_name("cogr").tags[EXPERIMENT_KIND_TAG] == MODEL_TRAINING
    assert client.get_experiment(old).tags[EXPERIMENT_KIND_TAG] == MODEL_TRAINING
    run = client.get_run(tracker.run_id)
    assert run.info.run_name == f"cogr-{DATASET}-evaluate"
    note = run.data.tags[NOTE_TAG]
    assert note.startswith(f"**CoGR** on data set `{DATASET}` with generator `tiny`.")
    assert "| label | split | n | f1 |" in note and "| BM25 (test) | test | 12 | 0.2500 |" in note
    assert note.endswith("Registry: promoted")
    assert run_name("grape", "x", when=0) == "grape-x-1970-01-01-000000" and run_name("grape", "x", "all", 0) == \
        "grape-x-1970-01-01-000000"


# ----------------------------------------------------------------------------- the flow's last task
@pytest.mark.slow
def test_each_run_registers_a_challenger_and_the_gate_keeps_an_equal_one_out(tmp_path_factory, tmp_path):
    from mlflow.tracking import MlflowClient

    from coevo.orchestration.pipeline import Pipeline
    from coevo.orchestration.publish import publish
    from coevo.orchestration.tracking import NOTE_TAG, Tracker

    run = trained(tmp_path_factory, "cogr")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    previous = Path.cwd()
    os.chdir(run.root)  # the pipeline's paths (data.root = data) are relative to the project
    try:
        pipe = Pipeline("cogr", run.params)
        results = []
        for _ in range(2):  # the same run published twice: the second version equals the first
            with Tracker(uri=uri, artifact_root=str(tmp_path / "mlruns"), experiment="cogr") as tracker:
                results.append(publish(pipe, tracker, table={"rows": [{"label": "x (test)", "f1": 0.5}],
                                                             "columns": ["f1"]}))
    finally:
        os.chdir(previous)
    first, second = results
    assert first["version"] == "1" and first["decision"] == "promoted" and first["reason"] == "no champion yet"
    assert second["version"] == "2" and second["decision"] == "kept" and second["champion_now"] == "1"
    assert second["difference"]["mean"] == 0.0 and second["difference"]["ci_low"] == 0.0
    assert second["metric"] == "f1" and "does not beat the champion" in second["summary"]

    client = MlflowClient(uri, registry_uri=uri)
    assert registry.aliases(client, NAME) == {"champion": "1", "challenger": "2"}
    v2 = client.get_model_version(NAME, "2")
    assert v2.tags["coevo.gate.decision"] == "kept" and v2.tags["coevo.phase"] == "00_sft"
    assert Path(v2.tags["coevo.dataset_dir"]) == run.data_dir.resolve()
    assert client.get_model_version(NAME, "1").tags["coevo.gate.outcome"] == "kept against v2"
    mlrun = client.get_run(v2.run_id)
    assert mlrun.info.run_name.startswith(f"cogr-{DATASET}-20")
    assert mlrun.data.tags["registry.decision"] == "kept" and mlrun.data.tags["registry.version"] == "2"
    assert "Registry: coevo-cogr-toy v2: kept champion v1" in mlrun.data.tags[NOTE_TAG]
    assert "gate/f1/ci_low" in mlrun.data.metrics and mlrun.data.metrics["gate/promoted"] == 0.0
    first_run = client.get_run(client.get_model_version(NAME, "1").run_id).data.metrics  # no champion to compare with
    assert first_run["gate/promoted"] == 1.0 and not [k for k in first_run if k.startswith("gate/f1/")]

    # by hand: --force moves the champion; again: nothing to do
    runner = CliRunner()
    forced = runner.invoke(cli(), ["promote", NAME, "--force", "--tracking-uri", uri])
    assert forced.exit_code == 0, forced.output
    assert "v2: promoted to champion (champion before: v1): forced" in forced.stdout
    assert f"mlflow models serve -m models:/{NAME}@champion --env-manager local" in forced.stdout
    again = runner.invoke(cli(), ["promote", NAME, "--tracking-uri", uri, "--json"])
    assert again.exit_code == 0, again.output
    assert '"decision": "unchanged"' in again.stdout
    assert registry.aliases(client, NAME)["champion"] == "2"
