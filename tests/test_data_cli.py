"""`coevo data prepare / validate / summary / build-sample` end to end through typer."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from coevo.cli import app
from tests.conftest import REPO_ROOT, SAMPLE_DIR, shared_data

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, ["data", *args], catch_exceptions=False)


def test_help_lists_commands():
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("prepare", "validate", "summary", "build-sample"):
        assert command in result.output


def test_prepare_validate_summary_on_sample(tmp_path):
    out = tmp_path / "mt"
    result = invoke("prepare", "metatool_sample", "--loader", "metatool", "--source", str(SAMPLE_DIR / "metatool"), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "items never relevant" in result.output
    assert json.loads((out / "dataset.json").read_text())["name"] == "metatool_sample"
    result = invoke("validate", str(out))
    assert result.exit_code == 0, result.output
    assert "valid" in result.output and (out / "validation.json").exists()
    result = invoke("summary", str(out), "--json")
    assert result.exit_code == 0
    summary = json.loads(result.output)
    assert summary["items"] == 40 and summary["splits"]["val"]["queries"] > 0


def test_prepare_with_options(tmp_path):
    out = tmp_path / "w"
    result = invoke("prepare", "wands", "--source", str(REPO_ROOT / "tests" / "fixtures" / "wands"), "--out", str(out), "--seed", "3", "--val-fraction", "0.25", "--test-fraction", "0.25")
    assert result.exit_code == 0, result.output
    assert json.loads((out / "dataset.json").read_text())["seed"] == 3
    result = invoke("prepare", "metatool", "--source", str(SAMPLE_DIR / "metatool"), "--out", str(tmp_path / "m"), "--option", "include_multi_tool=false")
    assert result.exit_code == 0, result.output
    assert set(pd.read_parquet(tmp_path / "m" / "queries.parquet")["group"]) == {"all_clean_data"}


def test_validate_fails_with_exit_1_and_lists_failures(tmp_path):
    out = tmp_path / "mt"
    assert invoke("prepare", "metatool", "--source", str(SAMPLE_DIR / "metatool"), "--out", str(out)).exit_code == 0
    qrels = pd.read_parquet(out / "qrels.parquet")
    qrels.loc[0, "item_id"] = "ghost-tool"
    qrels.to_parquet(out / "qrels.parquet", index=False)
    result = invoke("validate", str(out), "--report", str(tmp_path / "r.json"))
    assert result.exit_code == 1
    assert "every qrel names a known item" in result.output and "ghost-tool" in result.output
    assert json.loads((tmp_path / "r.json").read_text())["ok"] is False


@pytest.mark.parametrize(
    "args, message",
    [
        (("prepare", "metatool", "--source", "/no/such/folder", "--out", "/tmp/x"), "/no/such/folder: source folder does not exist"),
        (("prepare", "nope", "--source", ".", "--out", "/tmp/x"), "unknown loader 'nope'"),
        (("prepare", "metatool", "--source", ".", "--out", "/tmp/x", "--option", "oops"), "expected KEY=VALUE"),
        (("validate", "/no/such/dataset"), "dataset folder does not exist"),
        (("summary", "/no/such/dataset"), "dataset folder does not exist"),
        (("build-sample", "nope", "--source", ".", "--out", "/tmp/x"), "unknown sample 'nope'"),
    ],
)
def test_bad_input_is_one_clear_line_exit_2(args, message):
    result = invoke(*args)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output


def test_interrupted_prepare_leaves_no_parquet(tmp_path, monkeypatch):
    real = pd.DataFrame.to_parquet
    calls = []

    def crash_on_second(self, path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, path, *args, **kwargs)

    monkeypatch.setattr(pd.DataFrame, "to_parquet", crash_on_second)
    out = tmp_path / "mt"
    result = runner.invoke(app, ["data", "prepare", "metatool", "--source", str(SAMPLE_DIR / "metatool"), "--out", str(out)])
    assert result.exit_code == 130
    assert sorted(p.name for p in out.iterdir()) == ["items.parquet"]  # finished file only; no temp, no dataset.json


@pytest.mark.shared_data
def test_build_sample_reproduces_committed_samples(tmp_path):
    for name in ("metatool", "stabletoolbench"):
        source = shared_data(name)
        out = tmp_path / name
        result = invoke("build-sample", name, "--source", str(source), "--out", str(out))
        assert result.exit_code == 0, result.output
        committed = sorted(p.relative_to(SAMPLE_DIR / name) for p in (SAMPLE_DIR / name).rglob("*") if p.is_file())
        built = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file() and p.name != ".sizes.json")
        assert built == committed
        for rel in committed:
            if rel.name == "ATTRIBUTION.md":
                continue  # names the --source/--out paths of the run
            assert (out / rel).read_bytes() == (SAMPLE_DIR / name / rel).read_bytes(), rel
