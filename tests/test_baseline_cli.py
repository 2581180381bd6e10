"""`coevo baseline bm25|dense DATA_DIR`: tables with all cut-offs and CIs, the val-chosen
F1@k, metrics.json, and one-line errors before any indexing."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from coevo.cli import app
from tests.conftest import SAMPLE_DIR

runner = CliRunner()
WIDE = {"COLUMNS": "200", "TERMINAL_WIDTH": "200"}
CUTOFFS = (1, 3, 5, 10, 100, 1000)


def _flat(text: str) -> str:
    return " ".join(text.split()).replace("│", "")


def _dataset(tmp_path: Path, qrel_item: str = "t2") -> Path:
    from coevo.data.schema import Dataset

    ds = Dataset(
        items=pd.DataFrame(
            {"item_id": ["t1", "t2", "t3"], "title": ["Weather", "Genealogy", "Stocks"],
             "text": ["rain forecast for cities", "family tree research", "market prices"]}
        ),
        queries=pd.DataFrame({"query_id": ["a", "b"], "text": ["rain tomorrow", "family tree"], "split": ["test", "val"]}),
        qrels=pd.DataFrame({"query_id": ["a", "b"], "item_id": ["t1", qrel_item], "grade": [1, 1]}),
        name="tiny",
    )
    return ds.save(tmp_path / "tiny")


@pytest.fixture(scope="module")
def metatool_sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The committed MetaTool sample, prepared by `coevo data prepare` (40 tools, 51 test queries)."""
    out = tmp_path_factory.mktemp("data") / "metatool_sample"
    result = runner.invoke(app, ["data", "prepare", "metatool", "--source", str(SAMPLE_DIR / "metatool"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def _check_metrics_json(path: Path, baseline: str) -> dict:
    metrics = json.loads(path.read_text())
    assert metrics["baseline"] == baseline and metrics["split"] == "test"
    assert metrics["dataset"] == "metatool" and metrics["n_queries"] == 51
    chosen = metrics["chosen_k"]
    assert chosen["k"] in CUTOFFS and chosen["chosen_on"] == "val" and chosen["metric"] == f"f1@{chosen['k']}"
    val_f1 = {int(k): v for k, v in chosen["val_f1_at_k"].items()}
    assert val_f1[chosen["k"]] == max(val_f1.values())  # argmax of F1@k on val
    expected = {f"{m}@{k}" for m in ("precision", "recall", "f1", "ndcg", "mrr") for k in CUTOFFS}
    assert set(metrics["metrics"]) == expected == set(metrics["ci95"])
    for name, mean in metrics["metrics"].items():
        low, high = metrics["ci95"][name]
        assert 0.0 <= low <= mean + 1e-12 and mean <= high + 1e-12 and high <= 1.0, name
    headline = [row["metric"] for row in metrics["headline"]]
    assert headline == [chosen["metric"], "precision@1", "ndcg@5", "ndcg@10", "recall@10", "recall@100"]
    assert all(row["mean"] == metrics["metrics"][row["metric"]] for row in metrics["headline"])
    assert metrics["bootstrap"]["resamples"] >= 1000 and metrics["bootstrap"]["seed"] == 0
    return metrics


# ----------------------------------------------------------------------------- help
def test_help_is_fast_and_documented() -> None:
    result = runner.invoke(app, ["baseline", "bm25", "--help"], env=WIDE)
    assert result.exit_code == 0
    text = _flat(result.output)
    for option in ("--split", "--val-split", "--k1", "--b", "--k", "--out", "--resamples"):
        assert option in text
    assert "DefaultEnglishAnalyzer" in text and "Porter" in text and "stopwords" in text
    dense = _flat(runner.invoke(app, ["baseline", "dense", "--help"], env=WIDE).output)
    assert "--encoder" in dense and "all-minilm-l6-v2" in dense and "--split" in dense


def test_help_names_the_default_out() -> None:
    result = runner.invoke(app, ["baseline", "bm25", "--help"], env=WIDE)
    assert result.exit_code == 0
    assert "baseline_bm25/metrics.json" in _flat(result.output).replace(" ", "")
    dense = runner.invoke(app, ["baseline", "dense", "--help"], env=WIDE)
    assert "baseline_dense/metrics.json" in _flat(dense.output).replace(" ", "")


# ----------------------------------------------------------------------------- errors
def test_missing_dataset_is_one_clear_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["baseline", "bm25", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "dataset folder does not exist" in result.output
    assert "Traceback" not in result.output


@pytest.fixture
def no_retrieval(monkeypatch: pytest.MonkeyPatch) -> None:
    """Errors must come before any indexing or encoding."""
    import coevo.baselines

    def fail(*args, **kwargs):
        raise AssertionError("retrieval started before the inputs were checked")

    monkeypatch.setattr(coevo.baselines, "bm25_runs", fail)
    monkeypatch.setattr(coevo.baselines, "dense_runs", fail)


@pytest.mark.parametrize("command", ["bm25", "dense"])
def test_qrels_naming_unknown_items_are_one_line(tmp_path: Path, command: str, no_retrieval: None) -> None:
    data = _dataset(tmp_path, qrel_item="t999")
    result = runner.invoke(app, ["baseline", command, str(data)], env=WIDE)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "1 qrels row(s) name items not in the items table, e.g. 't999'" in lines[0]
    assert not (data / f"baseline_{command}").exists()


@pytest.mark.parametrize("command", ["bm25", "dense"])
def test_unwritable_out_fails_before_indexing(tmp_path: Path, command: str, no_retrieval: None) -> None:
    data = _dataset(tmp_path)
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    result = runner.invoke(app, ["baseline", command, str(data), "--out", str(blocker / "metrics.json")], env=WIDE)
    assert result.exit_code == 2, result.output
    assert "--out" in result.output and "cannot write there" in result.output
    assert "Traceback" not in result.output
    folder = runner.invoke(app, ["baseline", command, str(data), "--out", str(tmp_path)], env=WIDE)
    assert folder.exit_code == 2 and "is a folder" in folder.output


def test_split_without_relevant_queries_is_named(tmp_path: Path, no_retrieval: None) -> None:
    data = _dataset(tmp_path)
    result = runner.invoke(app, ["baseline", "bm25", str(data), "--val-split", "train"], env=WIDE)
    assert result.exit_code == 2
    assert "split 'train' has no query with a relevant item: nothing to choose k for F1@k on" in _flat(result.output)


# ----------------------------------------------------------------------------- runs
@pytest.mark.java
def test_bm25_on_the_metatool_sample(metatool_sample: Path, tmp_path: Path) -> None:
    out = tmp_path / "out" / "metrics.json"
    result = runner.invoke(app, ["baseline", "bm25", str(metatool_sample), "--out", str(out), "--threads", "1"], env=WIDE)
    assert result.exit_code == 0, result.output
    metrics = _check_metrics_json(out, "bm25")
    assert metrics["params"]["k1"] == 0.9 and metrics["params"]["b"] == 0.4
    assert "DefaultEnglishAnalyzer" in metrics["params"]["analyzer"]
    # The README's BM25 (test) figure on this sample.
    assert metrics["metrics"]["recall@100"] == pytest.approx(0.7745, abs=1e-4)
    text = _flat(result.output)
    assert "split test (51 queries)" in text and f"k*={metrics['chosen_k']['k']}" in text
    assert "95% CI" in text and "NDCG@k" in text and "(k* on val)" in text
    assert sorted(p.name for p in out.parent.iterdir()) == ["metrics.json"]
    # Other BM25 parameters are named in the output and change the figures.
    other = tmp_path / "other.json"
    result = runner.invoke(
        app, ["baseline", "bm25", str(metatool_sample), "--out", str(other), "--k1", "1.2", "--b", "0.75", "--threads", "1"],
        env=WIDE,
    )
    assert result.exit_code == 0, result.output
    assert "k1=1.2, b=0.75" in _flat(result.output)
    assert json.loads(other.read_text())["metrics"] != metrics["metrics"]


@pytest.mark.java
def test_bm25_default_out_is_inside_the_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _dataset(tmp_path)
    cwd = tmp_path / "repo_root"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # as if run from the repo root, where DVC's metrics.json lives
    (cwd / "metrics.json").write_text('{"pipeline": 1}')
    result = runner.invoke(app, ["baseline", "bm25", str(data), "--k", "10", "--threads", "1"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert json.loads((cwd / "metrics.json").read_text()) == {"pipeline": 1}  # untouched
    written = json.loads((data / "baseline_bm25" / "metrics.json").read_text())
    assert written["metrics"]["recall@10"] == 1.0 and written["n_queries"] == 1
    assert written["cutoffs"] == [1, 3, 5, 10]  # cut-offs above --k are dropped


def test_dense_on_the_metatool_sample(metatool_sample: Path) -> None:
    result = runner.invoke(app, ["baseline", "dense", str(metatool_sample), "--resamples", "1000"], env=WIDE)
    assert result.exit_code == 0, result.output
    metrics = _check_metrics_json(metatool_sample / "baseline_dense" / "metrics.json", "dense")
    assert metrics["params"]["encoder"] == "all-minilm-l6-v2" and metrics["bootstrap"]["resamples"] == 1000
    assert metrics["metrics"]["recall@100"] == 1.0  # 40 items: the whole corpus is ranked
    assert metrics["metrics"]["ndcg@10"] > 0.5  # MiniLM finds most tools of this sample
    assert "dense (all-minilm-l6-v2, faiss)" in _flat(result.output)
