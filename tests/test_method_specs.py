"""coevo.methods.SPECS: the commands made from it, and `--vllm` offered only where a method declares it."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from coevo.cli import app
from coevo.cli import train as train_cli
from coevo.methods import SPECS, MethodSpec
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


def test_a_spec_names_its_class_without_importing_it():
    spec = MethodSpec("toy", "coevo.methods.grape:Grape", run_help="r", train_help="t")
    assert spec.load().__name__ == "Grape" and not spec.supports_vllm
