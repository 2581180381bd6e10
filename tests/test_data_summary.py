"""summarize(): counts and relevant-per-query statistics on a hand-checked table."""

from __future__ import annotations

from rich.console import Console

from coevo.data.summary import print_summary, summarize
from tests.test_data_schema import tiny


def test_summary_numbers():
    s = summarize(tiny())
    assert (s["items"], s["queries"], s["qrels"], s["relevant_qrels"]) == (3, 3, 4, 3)
    assert s["grades"] == {"0": 1, "1": 2, "2": 1}
    assert s["splits"]["train"] == {"queries": 1, "relevant_per_query": {"min": 1, "mean": 1.0, "median": 1.0, "max": 1}}
    assert s["relevant_per_query"] == {"min": 1, "mean": 1.0, "median": 1.0, "max": 1}
    assert s["items_never_relevant"] == 0
    assert s["groups"] == {"g": {"train": 1, "val": 1, "test": 0}, "h": {"train": 0, "val": 0, "test": 1}}
    strict = summarize(tiny(), min_grade=2)
    assert strict["queries_without_relevant"] == 2 and strict["items_never_relevant"] == 2
    assert strict["relevant_per_query"]["min"] == 0


def test_summary_renders():
    console = Console(record=True, width=120)
    print_summary(summarize(tiny()), console)
    text = console.export_text()
    assert "dataset tiny" in text and "items never relevant" in text and "groups" in text
