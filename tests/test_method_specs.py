"""coevo.methods.SPECS: the commands made from it, and `--vllm` offered only where a method declares it."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from coevo.cli import app
from coevo.cli import train as train_cli
from coevo.methods import SPECS, MethodSpec, register, spec_of
from coevo.methods.base import method_class

runner = CliRunner()


def test_every_spec_loads_its_method_and_has_both_commands():
    for name, spec in SPECS.items():
        assert method_class(name) is spec.load() and spec.load().name == name
        for group in ("run", "train"):
            result = runner.invoke(app, [group, name, "--help"], env={"COLUMNS": "200"})
            assert result.exit_code == 0, result.output
            assert (spec.run_help if group == "run" else spec.train_help) in result.output


@pytest.mark.parametrize("name", sorted(SPECS))
def test_vllm_is_offered_exactly_where_the_spec_declares_it(name):
    result = runner.invoke(app, ["train", name, "--help"], env={"COLUMNS": "200"})
    assert ("--vllm" in result.output) is SPECS[name].supports_vllm


def test_vllm_on_a_method_without_it_is_a_usage_error_before_any_work(monkeypatch):
    calls = []
    monkeypatch.setattr(train_cli, "_train", lambda *a, **k: calls.append(k))
    for name in (n for n, s in SPECS.items() if not s.supports_vllm):
        result = runner.invoke(app, ["train", name, "--vllm"])
        assert result.exit_code == 2 and "No such option: --vllm" in result.output
    assert calls == []


def test_vllm_reaches_the_method_that_declares_it(monkeypatch):
    calls = []
    monkeypatch.setattr(train_cli, "_train", lambda *a, **k: calls.append(k))
    assert SPECS["cogr"].supports_vllm
    assert runner.invoke(app, ["train", "cogr", "--vllm"]).exit_code == 0
    assert runner.invoke(app, ["train", "cogr"]).exit_code == 0
    assert calls == [{"use_vllm": True}, {}]


def test_a_spec_names_its_classes_without_importing_them():
    spec = MethodSpec("toy", "coevo.methods.grape:Grape", run_help="r", train_help="t",
                      params="coevo.config:GrapeParams", retriever="coevo.serving.search:GrapeRetriever",
                      headline="recall@10")
    assert spec.load().__name__ == "Grape" and not spec.supports_vllm
    assert spec.params_model().__name__ == "GrapeParams" and spec.retriever_class().__name__ == "GrapeRetriever"


def test_a_bad_method_name_or_an_unknown_method_is_one_line():
    with pytest.raises(ValueError, match="lower-case letters and digits only"):
        register(MethodSpec("Bad-Name", "x:Y", run_help="r", train_help="t", params="x:P", retriever="x:R",
                            headline="f1"))
    assert "Bad-Name" not in SPECS
    with pytest.raises(ValueError, match=r"unknown method 'nope'; expected one of cogr, grape, cohyde"):
        spec_of("nope")


def test_each_built_in_method_has_a_prefect_deployment_and_a_flow_named_after_it():
    import yaml
    from prefect.flows import load_flow_from_entrypoint

    deployments = yaml.safe_load(open("prefect.yaml"))["deployments"]
    entrypoints = {d["entrypoint"] for d in deployments}
    for name in ("cogr", "grape", "cohyde"):
        entry = f"flows/{name}.py:{name}_flow"
        assert entry in entrypoints
        flow = load_flow_from_entrypoint(entry)
        assert flow.name == name and flow.description == SPECS[name].run_help
