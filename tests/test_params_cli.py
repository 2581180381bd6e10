"""`coevo params explain|show`: the documented tree, one knob, TRL fields, errors in one line."""

from __future__ import annotations

import yaml
from typer.testing import CliRunner

from coevo.cli import app
from coevo.config import load_params, walk
from tests.conftest import REPO_ROOT

runner = CliRunner()
WIDE = {"COLUMNS": "250"}


def _explain(*args: str):
    return runner.invoke(app, ["params", "explain", "-p", str(REPO_ROOT / "params.yaml"), *args], env=WIDE)


def test_explain_prints_every_knob_with_type_value_and_description():
    result = _explain()
    assert result.exit_code == 0, result.output
    for key, _ in walk():
        assert key in result.output, key
    line = next(row for row in result.output.splitlines() if "cogr.grpo.beta " in row)
    assert "float >= 0.0" in line and "0.0" in line and "KL penalty" in line
    assert "one of: val | test" in result.output
    assert "[q_proj, v_proj]" in result.output  # values shown as YAML, not eaten as markup


def test_explain_a_subtree_and_a_leaf():
    result = _explain("cogr.lora")
    assert result.exit_code == 0, result.output
    assert "cogr.lora.r " in result.output and "int in [1, 256]" in result.output
    assert "cogr.grpo.beta" not in result.output and "grape.lora" not in result.output

    leaf = _explain("cohyde.early_stopping.metric")
    assert leaf.exit_code == 0, leaf.output
    assert "one of: ndcg@5 | recall@5" in leaf.output and "ndcg@5" in leaf.output


def test_explain_shows_the_merged_value_of_overlays_and_overrides():
    result = _explain("cogr.rounds", "-p", str(REPO_ROOT / "params" / "demo.yaml"), "--set", "cogr.rounds=4")
    assert result.exit_code == 0, result.output
    value_line = next(row for row in result.output.splitlines() if row.startswith("value"))
    assert value_line.split()[-1] == "4"
    demo = _explain("cogr.max_train_queries", "-p", str(REPO_ROOT / "params" / "demo.yaml"))
    assert next(r for r in demo.output.splitlines() if r.startswith("value")).split()[-1] == "48"


def test_explain_unknown_key_is_one_line_with_close_matches():
    result = _explain("cogr.grpo.bta")
    assert result.exit_code == 2
    assert "unknown key 'cogr.grpo.bta' (did you mean: cogr.grpo.beta" in result.output
    assert "Traceback" not in result.output


def test_explain_a_trl_field_prints_trls_help():
    result = _explain("cogr.grpo.trl.loss_type")
    assert result.exit_code == 0, result.output
    assert "not set (TRL's default:" in result.output and "dr_grpo" in result.output
    owned = _explain("cohyde.dpo.trl.beta")
    assert "set by coevo: use cohyde.dpo_beta" in owned.output
    wrong = _explain("cogr.grpo.trl.loss_typ")
    assert wrong.exit_code == 2 and "did you mean: loss_type" in wrong.output


def test_explain_bad_params_fail_in_one_line():
    result = _explain("--set", "cogr.rounds=true")
    assert result.exit_code == 2
    assert "cogr.rounds: Input should be a valid integer" in result.output and "Traceback" not in result.output


def test_show_prints_the_merged_params_as_yaml(tmp_path):
    result = runner.invoke(app, ["params", "show", "-p", str(REPO_ROOT / "params.yaml"),
                                 "-p", str(REPO_ROOT / "params" / "demo.yaml"), "--set", "cogr.grpo.trl.epsilon=0.3"])
    assert result.exit_code == 0, result.output
    saved = tmp_path / "merged.yaml"
    saved.write_text(result.output)
    reloaded = load_params(saved)  # what show prints is a complete params file
    # demo.yaml's trl fields, then the --set one merged in
    assert reloaded.cogr.rounds == 1 and reloaded.cogr.grpo.trl == {"gradient_checkpointing": True,
                                                                    "gradient_accumulation_steps": 4, "epsilon": 0.3}

    part = runner.invoke(app, ["params", "show", "cogr.lora", "-p", str(REPO_ROOT / "params.yaml")])
    assert yaml.safe_load(part.output)["r"] == load_params(REPO_ROOT / "params.yaml").cogr.lora.r


def test_help_describes_the_commands():
    result = runner.invoke(app, ["params", "--help"], env=WIDE)
    assert result.exit_code == 0 and "explain" in result.output and "show" in result.output
    explain_help = runner.invoke(app, ["params", "explain", "--help"], env=WIDE)
    assert "--params" in explain_help.output and "--set" in explain_help.output
