"""Dataset: save/load round trip, clear load errors, accessors, no half-written parquet."""

from __future__ import annotations

import pandas as pd
import pytest

from coevo.data.schema import Dataset


def tiny() -> Dataset:
    return Dataset(
        items=pd.DataFrame({"item_id": ["a", "b", "c"], "title": ["A", "B", "C"], "text": ["alpha", "", "gamma"], "category": ["x", "y", "x"]}),
        queries=pd.DataFrame({"query_id": ["q1", "q2", "q3"], "text": ["one", "two", "three"], "split": ["train", "val", "test"], "group": ["g", "g", "h"]}),
        qrels=pd.DataFrame({"query_id": ["q1", "q1", "q2", "q3"], "item_id": ["a", "b", "b", "c"], "grade": [2, 0, 1, 1]}),
        name="tiny",
        source="memory",
        seed=7,
        grades=(0, 1, 2),
    )


def test_round_trip(tmp_path):
    ds = tiny()
    ds.save(tmp_path / "tiny")
    assert sorted(p.name for p in (tmp_path / "tiny").iterdir()) == ["dataset.json", "items.parquet", "qrels.parquet", "queries.parquet"]
    back = Dataset.load(tmp_path / "tiny")
    assert back.name == "tiny" and back.seed == 7 and back.grades == (0, 1, 2) and back.source == "memory"
    pd.testing.assert_frame_equal(back.items, ds.items)
    pd.testing.assert_frame_equal(back.queries, ds.queries)
    pd.testing.assert_frame_equal(back.qrels, ds.qrels)
    assert back.qrels["grade"].dtype == "int64"


def test_accessors():
    ds = tiny()
    assert ds.queries_in("val")["query_id"].tolist() == ["q2"]
    assert ds.relevant() == {"q1": {"a": 2}, "q2": {"b": 1}, "q3": {"c": 1}}
    assert ds.relevant("train", min_grade=0) == {"q1": {"a": 2, "b": 0}}
    assert ds.relevant("train", min_grade=2) == {"q1": {"a": 2}}
    assert ds.item_text("a") == "A: alpha" and ds.item_text("b") == "B"
    with pytest.raises(KeyError, match="unknown item_id 'zz'"):
        ds.item_text("zz")
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        ds.queries_in("dev")


def test_numeric_ids_become_strings():
    ds = Dataset(
        items=pd.DataFrame({"item_id": [1, 2], "title": ["a", "b"], "text": ["", ""]}),
        queries=pd.DataFrame({"query_id": [10], "text": ["q"], "split": ["train"]}),
        qrels=pd.DataFrame({"query_id": [10], "item_id": [2], "grade": ["1"]}),
    )
    assert ds.items["item_id"].tolist() == ["1", "2"] and ds.relevant() == {"10": {"2": 1}}


def test_missing_column_in_memory():
    with pytest.raises(ValueError, match=r"queries table: missing column\(s\) 'split'"):
        Dataset(items=tiny().items, queries=tiny().queries.drop(columns="split"), qrels=tiny().qrels)
    with pytest.raises(ValueError, match="column 'grade' must hold integers"):
        Dataset(items=tiny().items, queries=tiny().queries, qrels=tiny().qrels.assign(grade=["1", "x", "2", "0"]))


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="dataset folder does not exist"):
        Dataset.load(tmp_path / "nope")
    ds = tiny()
    ds.save(tmp_path / "d")
    (tmp_path / "d" / "qrels.parquet").unlink()
    with pytest.raises(FileNotFoundError, match=r"qrels\.parquet: file does not exist"):
        Dataset.load(tmp_path / "d")
    ds.save(tmp_path / "d")
    ds.items.drop(columns="title").to_parquet(tmp_path / "d" / "items.parquet")
    with pytest.raises(ValueError, match=r"items\.parquet: missing column\(s\) 'title'"):
        Dataset.load(tmp_path / "d")
    ds.save(tmp_path / "d")
    (tmp_path / "d" / "queries.parquet").write_bytes(b"not parquet")
    with pytest.raises(ValueError, match=r"queries\.parquet: cannot read parquet"):
        Dataset.load(tmp_path / "d")


def test_interrupted_save_leaves_no_half_written_parquet(tmp_path, monkeypatch):
    ds = tiny()
    ds.save(tmp_path / "d")
    before = (tmp_path / "d" / "items.parquet").read_bytes()
    real = pd.DataFrame.to_parquet

    def crash(self, path, *args, **kwargs):
        real(self, path, *args, **kwargs)
        with open(path, "r+b") as f:  # a partly written file, then the crash
            f.truncate(10)
        raise KeyboardInterrupt

    monkeypatch.setattr(pd.DataFrame, "to_parquet", crash)
    changed = Dataset(items=ds.items.assign(title="new"), queries=ds.queries, qrels=ds.qrels, name="tiny")
    with pytest.raises(KeyboardInterrupt):
        changed.save(tmp_path / "d")
    monkeypatch.undo()
    names = sorted(p.name for p in (tmp_path / "d").iterdir())
    assert names == ["items.parquet", "qrels.parquet", "queries.parquet"]  # no temp files left behind
    assert (tmp_path / "d" / "items.parquet").read_bytes() == before  # the old table is intact
    # dataset.json was removed first, so the interrupted folder is not mistaken for a finished one
    with pytest.raises(FileNotFoundError, match="the save was interrupted"):
        Dataset.load(tmp_path / "d")
