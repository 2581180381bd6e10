"""`coevo baseline bm25 DATA_DIR`: metrics table, metrics.json written atomically, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from coevo.cli import app

runner = CliRunner()


def _dataset(tmp_path: Path) -> Path:
    from coevo.data.schema import Dataset

    ds = Dataset(
        items=pd.DataFrame(
            {"item_id": ["t1", "t2", "t3"], "title": ["Weather", "Genealogy", "Stocks"],
             "text": ["rain forecast for cities", "family tree research", "market prices"]}
        ),
        queries=pd.DataFrame({"query_id": ["a", "b"], "text": ["rain tomorrow", "family tree"], "split": ["test", "val"]}),
        qrels=pd.DataFrame({"query_id": ["a", "b"], "item_id": ["t1", "t2"], "grade": [1, 1]}),
        name="tiny",
    )
    return ds.save(tmp_path / "tiny")


def test_help_is_fast_and_documented() -> None:
    result = runner.invoke(app, ["baseline", "bm25", "--help"])
    assert result.exit_code == 0
    assert "--split" in result.output and "--k" in result.output and "--out" in result.output


@pytest.mark.java
def test_bm25_command_writes_metrics_json(tmp_path: Path) -> None:
    data = _dataset(tmp_path)
    out = tmp_path / "out" / "metrics.json"
    result = runner.invoke(app, ["baseline", "bm25", str(data), "--split", "test", "--k", "10", "--out", str(out), "--threads", "1"])
    assert result.exit_code == 0, result.output
    metrics = json.loads(out.read_text())
    assert metrics["recall@10"] == 1.0 and metrics["mrr@10"] == 1.0
    assert "f1 (set)" in result.output and "ndcg@10" in result.output
    assert sorted(p.name for p in out.parent.iterdir()) == ["metrics.json"]


def test_help_names_the_default_out() -> None:
    result = runner.invoke(app, ["baseline", "bm25", "--help"], env={"COLUMNS": "200", "TERMINAL_WIDTH": "200"})
    assert result.exit_code == 0
    assert "baseline_bm25/metrics.json" in " ".join(result.output.split()).replace("│", "").replace(" ", "")


@pytest.mark.java
def test_bm25_default_out_is_inside_the_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _dataset(tmp_path)
    cwd = tmp_path / "repo_root"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # as if run from the repo root, where DVC's metrics.json lives
    (cwd / "metrics.json").write_text('{"pipeline": 1}')
    result = runner.invoke(app, ["baseline", "bm25", str(data), "--k", "10", "--threads", "1"])
    assert result.exit_code == 0, result.output
    assert json.loads((cwd / "metrics.json").read_text()) == {"pipeline": 1}  # untouched
    written = json.loads((data / "baseline_bm25" / "metrics.json").read_text())
    assert written["recall@10"] == 1.0


def test_missing_dataset_is_one_clear_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["baseline", "bm25", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "dataset folder does not exist" in result.output
    assert "Traceback" not in result.output
