"""Plot and table helpers: real PNGs, CSVs that round-trip, tables that show every row."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from rich.console import Console

from coevo import report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_metric_per_phase_plot_writes_a_png(tmp_path: Path):
    out = report.plot_metric_per_phase(
        [0, 1, 2], [0.2, 0.25, 0.3], tmp_path / "f1.png", start=0.2, baseline=0.28, labels=["sft", "q", "i"]
    )
    assert out.read_bytes()[:8] == PNG_MAGIC
    with pytest.raises(ValueError, match="2 steps but 3 values"):
        report.plot_metric_per_phase([0, 1], [0.1, 0.2, 0.3], tmp_path / "bad.png")
    assert not (tmp_path / "bad.png").exists()


def test_series_and_grouped_plots(tmp_path: Path):
    report.plot_series([0, 10, 20], {"recall@1": [0.1, 0.2, 0.15], "mean_sim": [0.3, 0.5, 0.7]},
                       tmp_path / "monitor.png", secondary=["mean_sim"])
    rows = [{"phase": p, "side": s, "ngram": n, "distinct": p * 10 + n}
            for p in range(3) for s in ("items", "queries") for n in (1, 2, 3)]
    report.plot_grouped_counts(rows, tmp_path / "dyn.png", x="phase", group="ngram", value="distinct", facet="side")
    for name in ("monitor.png", "dyn.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG_MAGIC
    with pytest.raises(ValueError, match="series 'x'"):
        report.plot_series([0, 1], {"x": [1.0]}, tmp_path / "bad.png")


def test_csv_round_trip(tmp_path: Path):
    rows = [{"phase": 0, "f1": 0.5, "name": "a|b"}, {"phase": 1, "f1": 0.6, "extra": "x"}]
    path = report.write_csv(rows, tmp_path / "plots" / "p.csv")
    back = list(csv.DictReader(path.open()))
    assert [r["phase"] for r in back] == ["0", "1"]
    assert back[0]["extra"] == "" and back[1]["extra"] == "x"
    assert report.rows_to_csv(rows, ["f1"]).splitlines() == ["f1", "0.5", "0.6"]


def _cells(table, column: str) -> list[tuple[str, bool]]:
    """(plain text, marked best) per row of one column: marked = bold in the rendered cell."""
    from rich.text import Text

    (col,) = [c for c in table.columns if c.header == column]
    out = []
    for cell in col.cells:
        text = Text.from_markup(cell) if isinstance(cell, str) else cell
        styles = [str(span.style) for span in text.spans if span.start == 0 and span.end == len(text.plain)]
        out.append((text.plain, any("bold" in style for style in styles)))
    return out


def test_metrics_table_shows_every_row_and_marks_the_best():
    rows = [{"label": "BM25", "f1": 0.31, "recall@100": 0.9, "ndcg@10": 0.5},
            {"label": "SFT", "f1": 0.40, "recall@100": None, "ndcg@10": 0.6}]
    table = report.metrics_table(rows, title="results")
    console = Console(record=True, width=100)
    console.print(table)
    text = console.export_text()
    assert "BM25" in text and "SFT" in text and "0.4000" in text and "0.3100" in text
    assert "-" in text  # a missing value is shown, not dropped
    # The best value of the first metric (f1, higher is better) is marked, and only it:
    assert _cells(table, "f1") == [("0.3100", False), ("0.4000", True)]
    assert _cells(table, "recall@100") == [("0.9000", False), ("-", False)]  # other metrics: never marked
    assert _cells(table, "ndcg@10") == [("0.5000", False), ("0.6000", False)]
    # ... and the mark survives rendering: the best cell is bold on a terminal, the other is not.
    styled = Console(record=True, width=100, force_terminal=True, color_system="standard")
    styled.print(table)
    ansi = styled.export_text(styles=True)
    assert "\x1b[1;32m0.4000" in ansi and "\x1b[1;32m0.3100" not in ansi


def test_metrics_table_best_of_ties_and_missing_values():
    rows = [{"label": "a", "f1": 0.2, "ndcg@10": float("nan")},
            {"label": "b", "f1": 0.5, "ndcg@10": 0.7},
            {"label": "c", "f1": 0.5, "ndcg@10": None},
            {"label": "d", "f1": True, "ndcg@10": 0.1}]  # a bool is not a number
    table = report.metrics_table(rows, ("f1", "ndcg@10"), best_of="ndcg@10")
    assert _cells(table, "ndcg@10") == [("-", False), ("0.7000", True), ("-", False), ("0.1000", False)]
    assert [marked for _, marked in _cells(table, "f1")] == [False] * 4  # best_of moved the mark
    ties = report.metrics_table(rows, ("f1",))
    assert _cells(ties, "f1") == [("0.2000", False), ("0.5000", True), ("0.5000", True), ("-", False)]
    empty = report.metrics_table([{"label": "x", "f1": None}], ("f1",))
    assert _cells(empty, "f1") == [("-", False)]  # nothing to mark


def test_metrics_table_says_split_and_n_and_marks_the_best_within_each_split():
    rows = [{"label": "BM25 (val)", "split": "val", "n_queries": 51, "f1": 0.6},
            {"label": "SFT (val)", "split": "val", "n_queries": 51, "f1": 0.3},
            {"label": "BM25 (test)", "split": "test", "n_queries": 49, "f1": 0.4},
            {"label": "best (test)", "split": "test", "n_queries": 49, "f1": 0.5}]
    table = report.metrics_table(rows, ("f1",))
    assert [c.header for c in table.columns] == ["label", "split", "n", "f1"]
    assert _cells(table, "n") == [("51", False), ("51", False), ("49", False), ("49", False)]
    # val and test figures are never compared with each other: one mark per split.
    assert _cells(table, "f1") == [("0.6000", True), ("0.3000", False), ("0.4000", False), ("0.5000", True)]
    assert table.caption is None  # no baseline rows, no comparisons: nothing to explain
