"""The final tables: every difference they claim carries a paired CI and p-value that equal
coevo.stats on the same per-query values; every table says its split and number of queries.

Constructed cases only (no model, no retrieval): the pipeline's evaluation steps are
replaced by stubs that return what the real steps return.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from coevo import report
from coevo.stats import paired_difference

BOOT = {"resamples": 1000, "permutations": 1000, "confidence": 0.95, "seed": 7}
QIDS = [f"q{i:02d}" for i in range(12)]
VAL_QIDS = [f"v{i:02d}" for i in range(8)]


def values(pattern: list[float], ids: list[str] = QIDS) -> dict[str, float]:
    return {q: float(pattern[i % len(pattern)]) for i, q in enumerate(ids)}


def mean(d: dict[str, float]) -> float:
    return sum(d.values()) / len(d)


def baseline(name: str, f1_test: dict[str, float], val_f1: float, k: int = 3) -> dict:
    """What the pipeline's baseline step returns (coevo.orchestration.pipeline.baseline_result)."""
    ndcg = {q: min(1.0, v + 0.1) for q, v in f1_test.items()}
    test_metrics = {f"f1@{k}": mean(f1_test), "f1@1": 0.0, "ndcg@5": mean(ndcg), "ndcg@10": mean(ndcg),
                    "recall@10": 0.9, "precision@1": 0.5}
    val_metrics = {f"f1@{k}": val_f1, "f1@1": 0.0, "ndcg@5": val_f1, "ndcg@10": val_f1, "recall@10": 0.8,
                   "precision@1": 0.4}
    return {"baseline": name, "label": name, "chosen_k": k, "chosen_on": "val",
            "splits": {"val": {"split": "val", "n_queries": len(VAL_QIDS), "metrics": val_metrics},
                       "test": {"split": "test", "n_queries": len(QIDS), "metrics": test_metrics}},
            "per_query": {"f1": f1_test, "ndcg@5": ndcg, "ndcg@10": ndcg}, "per_query_split": "test"}


@pytest.fixture
def case():
    start = values([0.0, 0.5, 0.0, 1.0])
    final_f1 = values([0.5, 0.5, 1.0, 1.0])
    bm25_f1 = values([1.0, 0.0, 0.5])
    dense_f1 = values([1.0, 1.0, 1.0, 0.0])  # better on test, worse on val: must not be picked
    final = {
        "split": "test", "best_phase": "02_item", "start_phase": "00_sft",
        "rows": [
            {"label": "SFT start", "phase": "00_sft", "split": "test", "f1": mean(start), "n_queries": 12,
             "per_query": {"f1": start}},
            {"label": "best phase 02_item", "phase": "02_item", "split": "test", "f1": mean(final_f1),
             "ndcg@10": 0.5, "n_queries": 12, "per_query": {"f1": final_f1, "ndcg@10": final_f1}},
        ],
    }
    baselines = {"bm25": baseline("bm25", bm25_f1, val_f1=0.6), "dense": baseline("dense", dense_f1, val_f1=0.4)}
    val_rows = [{"label": "SFT", "phase": "00_sft", "n_queries": 8, "metrics": {"f1": 0.1, "recall@100": 0.2}},
                {"label": "round 1 item GRPO", "phase": "02_item", "n_queries": 8, "metrics": {"f1": 0.3}}]
    table = report.evaluation_table(method="cogr", dataset="toy", columns=report.table_columns(("f1", "ndcg@10")),
                                    val_rows=val_rows, final=final, baselines=baselines, bootstrap=BOOT,
                                    cutoffs=[1, 3, 5, 10])
    return table, {"start": start, "final": final_f1, "bm25": bm25_f1, "dense": dense_f1}


def test_every_claimed_difference_has_the_ci_and_p_value_of_coevo_stats(case):
    table, v = case
    by = {(c["name"], c["metric"]): c for c in table["comparisons"]}
    assert set(by) == {("vs start", "f1"), ("vs best baseline", "f1"), ("vs best baseline", "ndcg@10")}
    for (name, metric), other in ((("vs start", "f1"), v["start"]), (("vs best baseline", "f1"), v["bm25"])):
        expected = paired_difference(v["final"], other, resamples=1000, permutations=1000, seed=7, confidence=0.95)
        got = by[(name, metric)]
        assert (got["mean"], got["ci_low"], got["ci_high"], got["p_value"], got["n"]) == pytest.approx(
            (expected.mean, expected.ci_low, expected.ci_high, expected.p_value, 12))
        assert got["resamples"] == 1000 and got["permutations"] == 1000 and got["seed"] == 7
        assert got["split"] == "test" and got["a"] == "best phase 02_item (test)"
    assert by[("vs start", "f1")]["b"] == "SFT start (test)"
    # The best baseline is chosen on val (BM25 0.6 > dense 0.4), although dense is better on test.
    assert table["best_baseline"] == {"baseline": "bm25", "metric": "f1", "chosen_on": "val", "chosen_k": 3}
    assert by[("vs best baseline", "f1")]["b"] == "BM25 @k*=3 (test)"


def test_a_paper_baseline_named_by_a_retrieval_baseline_is_compared_at_its_val_chosen_k(case):
    """CoGR's paper baseline is BM25: the table compares with the named baseline even where another one is
    best on val (here dense is named, BM25 is best on val), on its F1@k* and every shared column."""
    table, v = case
    final = {"split": "test", "best_phase": "02_item", "start_phase": "00_sft",
             "rows": [{"label": "SFT start", "phase": "00_sft", "split": "test", "f1": mean(v["start"]),
                       "n_queries": 12, "per_query": {"f1": v["start"]}},
                      {"label": "best phase 02_item", "phase": "02_item", "split": "test", "f1": mean(v["final"]),
                       "n_queries": 12, "per_query": {"f1": v["final"], "ndcg@10": v["final"]}}]}
    baselines = {"bm25": baseline("bm25", v["bm25"], val_f1=0.6), "dense": baseline("dense", v["dense"], val_f1=0.4)}
    named = report.evaluation_table(method="cogr", dataset="toy", columns=report.table_columns(("f1", "ndcg@10")),
                                    val_rows=[], final=final, baselines=baselines, bootstrap=BOOT, cutoffs=[1, 3],
                                    paper_baseline="dense")
    assert named["best_baseline"]["baseline"] == "bm25"  # still chosen on val
    assert named["paper_baseline"] == {"name": "vs paper baseline", "row": "dense"}
    paper = {c["metric"]: c for c in named["comparisons"] if c["name"] == "vs paper baseline"}
    assert set(paper) == {"f1", "ndcg@10"} and paper["f1"]["b"] == "dense @k*=3 (test)"
    expected = paired_difference(v["final"], v["dense"], resamples=1000, permutations=1000, seed=7, confidence=0.95)
    assert (paper["f1"]["mean"], paper["f1"]["ci_low"], paper["f1"]["ci_high"], paper["f1"]["p_value"]) == \
        pytest.approx((expected.mean, expected.ci_low, expected.ci_high, expected.p_value))
    with pytest.raises(ValueError, match="the paper's baseline 'splade' is neither a baseline \\(bm25, dense\\) "
                                         "nor a row of the final evaluation \\(rows: 00_sft, 02_item\\)"):
        report.evaluation_table(method="cogr", dataset="toy", columns=["f1"], val_rows=[], final=final,
                                baselines=baselines, bootstrap=BOOT, cutoffs=[1, 3], paper_baseline="splade")


def test_every_row_and_the_table_say_their_split_and_query_count(case):
    table, _ = case
    assert table["split"] == "test" and table["n_queries"] == 12 and table["cutoffs"] == [1, 3, 5, 10]
    for row in table["rows"]:
        assert row["split"] in ("val", "test") and row["n_queries"] == (8 if row["split"] == "val" else 12), row
    labels = [r["label"] for r in table["rows"]]
    assert labels == ["BM25 @k*=3 (val)", "dense @k*=3 (val)", "SFT (val)", "round 1 item GRPO (val)",
                      "BM25 @k*=3 (test)", "dense @k*=3 (test)", "SFT start (test)", "best phase 02_item (test)"]
    bm25_test = table["rows"][4]
    assert bm25_test["f1"] == bm25_test["f1@3"]  # a baseline's f1 column is its F1 at the val-chosen k
    final = table["rows"][-1]
    assert final["kind"] == "final" and final["differences"] == table["comparisons"]


def test_the_cli_table_shows_split_n_and_every_difference_with_its_ci(case):
    table, v = case
    rendered = report.metrics_table(table["rows"], table["columns"], title="cogr: results")
    main, differences = rendered.renderables
    assert [c.header for c in main.columns][:3] == ["label", "split", "n"]
    assert [c.header for c in differences.columns] == ["minus", "metric", "Δ", "95% CI", "p"]
    console = Console(record=True, width=80)  # fits a plain terminal
    console.print(rendered)
    text = console.export_text()
    assert "…" not in text  # nothing truncated at 80 columns
    for other, name in ((v["start"], "start: SFT start"), (v["bm25"], "best baseline: BM25 @k*=3")):
        diff = paired_difference(v["final"], other, resamples=1000, permutations=1000, seed=7)
        line = next(line for line in text.splitlines() if name in line and " f1 " in line)
        assert f"{diff.mean:+.4f}" in line and f"[{diff.ci_low:+.4f}, {diff.ci_high:+.4f}]" in line
        assert f"{diff.p_value:.3g}" in line
    assert "paired differences on test (12 queries): best phase 02_item (test) minus" in " ".join(text.split())
    assert "1000 resamples" in text and "seed 7" in text and "F1@k*" in text


def test_constant_shift_and_identity_give_the_degenerate_intervals():
    a, b = values([0.5, 0.25]), values([0.25, 0.0])
    c = report.compare_rows("vs start", {"label": "x"}, {"label": "y"}, "f1", a, b, "test", BOOT)
    assert (c["mean"], c["ci_low"], c["ci_high"]) == pytest.approx((0.25, 0.25, 0.25)) and c["significant"]
    same = report.compare_rows("vs start", {"label": "x"}, {"label": "x"}, "f1", a, a, "test", BOOT)
    assert (same["mean"], same["ci_low"], same["ci_high"], same["p_value"]) == (0.0, 0.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="same queries"):
        report.compare_rows("vs start", {"label": "x"}, {"label": "y"}, "f1", a, {"q00": 1.0}, "test", BOOT)


def test_mlflow_metrics_and_tags_carry_every_difference_and_the_query_count(case):
    table, _ = case
    metrics = report.tracking_metrics(table)
    for name in ("vs_start", "vs_best_baseline"):
        for part in ("delta", "ci_low", "ci_high", "p_value", "n"):
            assert f"compare/{name}/f1/{part}" in metrics
    assert metrics["test/n_queries"] == 12.0 and metrics["bm25/val/f1"] == 0.6 and "test/02_item/f1" in metrics
    assert "dense/test/f1@3" in metrics and "bm25/test/n_queries" in metrics
    tags = report.table_tags(table)
    assert tags["eval.split"] == "test" and tags["eval.n_queries"] == "12"


# ----------------------------------------------------------------------- pipeline wiring
class _Stub:
    """A finished method run: its val rows, its data set, and write_reports writing metrics.json."""

    name, code = "cogr", ("coevo.io",)

    def __init__(self):
        class _Data:
            def relevant(self, split):
                return {q: {"i": 1} for q in (VAL_QIDS if split == "val" else QIDS)}

        self.dataset = _Data()

    def rows(self):
        return [{"name": "00_sft", "label": "SFT", "eval": {"f1": 0.1}},
                {"name": "02_item", "label": "round 1 item GRPO", "eval": {"f1": 0.3}}]

    def numerics_of(self, phase):
        return {"precision": "fp32", "phase": phase}

    def write_reports(self, metrics_file, plots_csv, report_dir, final, baselines):
        assert all("per_query" not in r for r in final["rows"])  # never dumped into metrics.json
        Path(metrics_file).write_text(json.dumps({"best_phase": final["best_phase"], "baselines": baselines}))
        Path(plots_csv).parent.mkdir(parents=True, exist_ok=True)
        Path(plots_csv).write_text("phase\n")
        return [str(metrics_file)]


def test_reports_step_writes_the_table_into_metrics_json(case, tmp_path, monkeypatch):
    from coevo.config import PROJECT_PARAMS, load_params
    from coevo.orchestration.pipeline import Pipeline, Step

    monkeypatch.chdir(tmp_path)
    table, v = case
    params = load_params([PROJECT_PARAMS], ["evaluation.bootstrap.resamples=1000",
                                            "evaluation.bootstrap.permutations=1000", "evaluation.bootstrap.seed=7"])
    pipe = Pipeline("cogr", params)
    pipe.__dict__["method"] = _Stub()
    final = {"split": "test", "best_phase": "02_item", "start_phase": "00_sft", "rows": [
        {"label": "SFT start", "phase": "00_sft", "split": "test", "f1": mean(v["start"]), "n_queries": 12,
         "per_query": {"f1": v["start"]}},
        {"label": "best phase 02_item", "phase": "02_item", "split": "test", "f1": mean(v["final"]), "n_queries": 12,
         "per_query": {"f1": v["final"], "ndcg@10": v["final"]}}]}
    steps = [Step(f"baseline-{n}", n, "evaluate", f"key-{n}", lambda r=r: r, lambda: True)
             for n, r in (("bm25", baseline("bm25", v["bm25"], 0.6)), ("dense", baseline("dense", v["dense"], 0.4)))]
    final_step = Step("cogr-final", "final", "evaluate", "key-final", lambda: final, lambda: True)
    result = pipe.reports(final_step, steps).run()
    written = json.loads(Path("metrics.json").read_text())
    assert written["evaluation"] == json.loads(json.dumps(result["table"]))
    assert written["numerics"] == {"precision": "fp32", "phase": written["best_phase"]}  # the chosen phase's
    ev = written["evaluation"]
    assert ev["split"] == "test" and ev["n_queries"] == 12 and ev["bootstrap"]["resamples"] == 1000
    # CoGR's paper baseline is BM25 (here also the best on val): the same difference under both names
    assert {c["name"] for c in ev["comparisons"]} == {"vs start", "vs best baseline", "vs paper baseline"}
    assert ev["paper_baseline"] == {"name": "vs paper baseline", "row": "BM25"}
    by = {(c["name"], c["metric"]): c["mean"] for c in ev["comparisons"]}
    assert by[("vs paper baseline", "f1")] == by[("vs best baseline", "f1")] == pytest.approx(mean(v["final"]) - mean(v["bm25"]))
    assert written["baselines"]["bm25"]["test"]["f1"] == pytest.approx(mean(v["bm25"]))
    assert [r["n_queries"] for r in ev["rows"]] == [8, 8, 8, 8, 12, 12, 12, 12]


def test_baseline_and_final_keys_follow_their_inputs_only(tmp_path, monkeypatch):
    from coevo.config import PROJECT_PARAMS, load_params
    from coevo.orchestration.pipeline import Pipeline

    monkeypatch.chdir(tmp_path)

    def key(*overrides: str) -> str:
        pipe = Pipeline("cogr", load_params([PROJECT_PARAMS], list(overrides)))
        monkeypatch.setattr(type(pipe), "data_fingerprint", lambda self: "data-v1")
        return pipe.baseline("bm25").key

    base = key()
    assert key("evaluation.cutoffs=[1, 5, 10, 100]") != base
    assert key("evaluation.bootstrap.seed=3") != base
    assert key("evaluation.split=val") != base
    assert key("cogr.grpo.learning_rate=1e-3") == base  # a training knob never re-runs a baseline
    assert key("seed=7") == base


@pytest.mark.parametrize(("override", "message"), [
    ("evaluation.cutoffs=[1, 3, 10]", "must include 5"),
    ("evaluation.cutoffs=[10, 5, 1]", "increasing"),
    ("evaluation.cutoffs=[0, 1, 5, 10]", "increasing positive"),
    ("evaluation.bootstrap.resamples=999", "resamples"),
])
def test_bad_evaluation_settings_fail_before_any_work(override, message):
    from coevo.config import PROJECT_PARAMS, ParamsError, load_params

    with pytest.raises(ParamsError, match=message):
        load_params([PROJECT_PARAMS], [override])
