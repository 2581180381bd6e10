"""Great Expectations validation: each contract rule fails on a broken table and names the culprits."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from coevo.data.loaders import load_source
from coevo.data.schema import Dataset
from coevo.data.validation import DataValidationError, ensure_valid, validate
from tests.conftest import SAMPLE_DIR


@pytest.fixture(scope="module")
def sample() -> Dataset:
    return load_source("metatool", SAMPLE_DIR / "metatool")


def broken(ds: Dataset, **tables: pd.DataFrame) -> Dataset:
    return Dataset(
        items=tables.get("items", ds.items), queries=tables.get("queries", ds.queries),
        qrels=tables.get("qrels", ds.qrels), name="broken", grades=ds.grades,
    )


def failure(report, table: str, column: str, expectation: str):
    found = [f for f in report.failures if (f.table, f.column, f.expectation) == (table, column, expectation)]
    assert found, f"no failure {table}.{column} {expectation} in {report.failures}"
    return found[0]


def test_sample_is_valid(sample, tmp_path):
    report = validate(sample, tmp_path / "report.json")
    assert report.ok, report.message()
    assert len(report.checks) == 22
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["ok"] is True and data["n_failures"] == 0
    assert "PASSED" in (tmp_path / "report.md").read_text()


def test_every_rule_catches_its_break(sample):
    items = sample.items.copy()
    items.loc[1, "item_id"] = items.loc[0, "item_id"]  # duplicate id
    items.loc[2, "title"] = "   "  # empty title
    queries = sample.queries.copy()
    queries.loc[3, "text"] = ""  # empty query text
    queries.loc[4, "split"] = "dev"  # unknown split
    queries.loc[5, "query_id"] = None  # null id
    eval_query = queries.loc[queries["split"] == "val", "query_id"].iloc[0]
    qrels = sample.qrels.copy()
    qrels = qrels[qrels["query_id"] != eval_query]  # a val query with nothing relevant
    extra = pd.DataFrame({"query_id": ["ghost-q", qrels["query_id"].iloc[0]], "item_id": [qrels["item_id"].iloc[0], "ghost-tool"], "grade": [1, 1]})
    qrels = pd.concat([qrels, extra, qrels.iloc[[7]]], ignore_index=True)  # dangling both ways + duplicate pair
    qrels.loc[0, "grade"] = 5  # grade outside the source's levels
    report = validate(broken(sample, items=items, queries=queries, qrels=qrels))
    assert not report.ok

    dup = failure(report, "items", "item_id", "expect_column_values_to_be_unique")
    assert dup.count == 2 and dup.values == [items.loc[0, "item_id"]]
    title = failure(report, "items", "title", "expect_column_values_to_match_regex")
    assert title.count == 1 and items.loc[2, "item_id"] in title.values[0]
    text = failure(report, "queries", "text", "expect_column_values_to_match_regex")
    assert queries.loc[3, "query_id"] in text.values[0]
    split = failure(report, "queries", "split", "expect_column_values_to_be_in_set")
    assert "'dev'" in split.values[0]
    assert failure(report, "queries", "query_id", "expect_column_values_to_not_be_null").count == 1
    no_rel = [f for f in report.failures if f.rule.startswith("every val/test query")]
    assert no_rel and eval_query in no_rel[0].values
    known_q = [f for f in report.failures if f.rule == "every qrel names a known query"][0]
    assert "ghost-q" in known_q.values
    known_i = [f for f in report.failures if f.rule == "every qrel names a known item"][0]
    # ghost-tool, and the tool whose id was overwritten by the duplicate above
    assert set(known_i.values) == {"ghost-tool", sample.items.loc[1, "item_id"]}
    grade = failure(report, "qrels", "grade", "expect_column_values_to_be_in_set")
    assert grade.values == [5]
    pair = failure(report, "qrels", "query_id,item_id", "expect_compound_columns_to_be_unique")
    assert pair.count == 2


def test_at_most_five_values(sample):
    queries = sample.queries.copy()
    queries.loc[:9, "split"] = [f"bad{i}" for i in range(10)]
    report = validate(broken(sample, queries=queries))
    split = failure(report, "queries", "split", "expect_column_values_to_be_in_set")
    assert split.count == 10 and len(split.values) == 5


def test_ensure_valid_raises_with_report(sample, tmp_path):
    qrels = sample.qrels.copy()
    qrels.loc[0, "item_id"] = "ghost-tool"
    with pytest.raises(DataValidationError) as info:
        ensure_valid(broken(sample, qrels=qrels), tmp_path / "out" / "validation.json")
    message = str(info.value)
    assert "qrels.item_id: expect_column_values_to_be_in_set failed on 1 row" in message
    assert "'ghost-tool'" in message and str(tmp_path / "out" / "validation.json") in message
    data = json.loads((tmp_path / "out" / "validation.json").read_text())
    assert data["ok"] is False and data["failures"][0]["values"] == ["ghost-tool"]
    assert "ghost-tool" in (tmp_path / "out" / "validation.md").read_text()
    assert info.value.report.failures[0].table == "qrels"


def test_validate_a_folder_writes_report_beside_it(sample, tmp_path):
    sample.save(tmp_path / "ds")
    report = ensure_valid(tmp_path / "ds")
    assert report.ok and (tmp_path / "ds" / "validation.json").exists()


def test_empty_tables(sample):
    empty_items = sample.items.iloc[0:0]
    report = validate(broken(sample, items=empty_items))
    assert any(f.table == "items" and f.expectation == "expect_table_row_count_to_be_between" for f in report.failures)
    assert any(f.rule == "every qrel names a known item" for f in report.failures)
