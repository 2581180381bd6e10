"""The expected-score matrix: the fast entries reproduce, and check/record say what they did.

`test_fast_check_passes` is what CI runs (both baselines on both committed samples and the
tiny-model CoGR pipeline); the others use a small matrix written by the test.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from coevo.orchestration import repro_matrix as repro

UNCOMMITTED_CHANGES = repro.uncommitted_changes  # the autouse fixture below replaces it


@pytest.mark.slow  # trains the tiny CoGR pipeline (still run in CI)
def test_fast_check_passes():
    matrix = repro.load()
    fast = matrix.select()
    assert {e.id for e in fast} >= {"metatool_sample/bm25", "metatool_sample/dense", "stabletoolbench_sample/bm25",
                                    "stabletoolbench_sample/dense", "metatool_sample/cogr_tiny"}
    assert all(spec["expected"] is not None for e in fast for spec in e.metrics.values()), "run `coevo repro record`"
    outcomes = repro.check()
    failed = [o for o in outcomes if o.status != "matched"]
    assert not failed, "\n".join(f"{o.entry} {o.metric}: expected {o.expected}, got {o.got} ({o.status})"
                                 for o in failed)
    assert repro.passed(outcomes)


def test_every_entry_declares_its_command_and_tolerances():
    matrix = repro.load()
    assert {e.tier for e in matrix.entries} == {"fast", "slow"}
    for entry in matrix.entries:
        assert entry.command.removeprefix("ONEDNN_MAX_CPU_ISA=AVX2 ").startswith("coevo "), entry.id
        assert entry.command.startswith("ONEDNN_MAX_CPU_ISA=AVX2 ") == (entry.numerics == "fp32"), entry.id
        assert all(spec["tolerance"] >= 0 for spec in entry.metrics.values())
        # the command a person runs sets what the entry's run sets (a pinned knob included)
        command = " ".join(entry.command.split())
        assert [s for s in matrix.system(entry.system).get("set") or [] if f"--set {s}" not in command] == [], entry.id
    slow_sources = {matrix.dataset(e.dataset)["source"] for e in matrix.entries if e.tier == "slow" and not e.numerics}
    assert all(s.startswith("../shared/data/") for s in slow_sources)
    # Entries that train real models are keyed by numerics, recorded for both kinds of CPU.
    real = [e for e in matrix.entries if e.numerics]
    assert {(e.dataset, e.system) for e in real if e.numerics == "bf16"} == \
        {(e.dataset, e.system) for e in real if e.numerics == "fp32"}
    assert {matrix.system(e.system)["method"] for e in real} == {"cogr", "grape", "cohyde"}


def _write_matrix(path: Path, source: str, expected: float | None, tolerance: float = 1e-9) -> Path:
    doc = {"version": 1,
           "datasets": {"toy": {"tier": "fast", "loader": "metatool", "source": source},
                        "gone": {"tier": "slow", "loader": "metatool", "source": "/nonexistent/metatool"}},
           "systems": {"bm25": {"kind": "baseline"}},
           "entries": [{"dataset": "toy", "system": "bm25", "command": "coevo baseline bm25 DIR",
                        "metrics": {"n_queries": {"expected": expected, "tolerance": tolerance}}},
                       {"dataset": "gone", "system": "bm25", "command": "coevo baseline bm25 DIR",
                        "metrics": {"n_queries": {"expected": 1.0, "tolerance": 0.0}}}]}
    path.write_text("# header kept by record\n" + yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture(autouse=True)
def committed_tree(monkeypatch):
    """record refuses a tree with uncommitted changes; these tests run in whatever tree they are in."""
    monkeypatch.setattr(repro, "uncommitted_changes", lambda matrix_path: [])


@pytest.fixture
def fake_figures(monkeypatch):
    """Baseline figures without retrieval: n_queries is the number of prepared test queries."""
    def figures(data_dir: Path, system: str) -> dict[str, float]:
        from coevo.data.schema import Dataset

        return {"n_queries": float(len(Dataset.load(data_dir).relevant("test")))}

    monkeypatch.setattr(repro, "baseline_figures", figures)


def test_record_writes_real_figures_and_check_reports_each_verdict(tmp_path, fake_figures):
    from conftest import make_toy_metatool

    source = make_toy_metatool(tmp_path / "toy")
    path = _write_matrix(tmp_path / "expected.yaml", str(source), expected=None)
    assert repro.check(path)[0].status == "unrecorded"
    recorded = repro.record(path, runs=2)
    n = recorded["toy/bm25"]["n_queries"]
    assert n > 0
    text = path.read_text()
    assert text.startswith("# header kept by record\n")
    again = repro.load(path)
    assert again.entries[0].metrics["n_queries"]["expected"] == n and "toy/bm25" in again.doc["recorded"]
    (ok,) = repro.check(path)
    assert (ok.status, ok.difference) == ("matched", 0.0)
    # --slow adds the slow entries; an absent source is skipped and said so, not passed silently.
    outcomes = repro.check(path, slow=True)
    assert [o.status for o in outcomes] == ["matched", "skipped"] and "absent" in outcomes[1].note
    # A wrong expectation fails with its difference.
    _write_matrix(path, str(source), expected=n + 1)
    (bad,) = repro.check(path)
    assert bad.status == "failed" and bad.difference == -1.0 and not repro.passed([bad])


def test_record_refuses_figures_that_move_between_runs(tmp_path, monkeypatch):
    from conftest import make_toy_metatool

    calls = iter(range(10))
    monkeypatch.setattr(repro, "baseline_figures", lambda data_dir, system: {"n_queries": float(next(calls))})
    path = _write_matrix(tmp_path / "expected.yaml", str(make_toy_metatool(tmp_path / "toy")), expected=None)
    with pytest.raises(ValueError, match="differ between runs"):
        repro.record(path, runs=2)
    assert repro.load(path).entries[0].metrics["n_queries"]["expected"] is None  # nothing written


def test_record_writes_the_entries_that_reproduced_and_names_those_that_did_not(tmp_path, monkeypatch):
    from conftest import make_toy_metatool

    calls = iter(range(10))
    monkeypatch.setattr(repro, "baseline_figures", lambda data_dir, system: {
        "n_queries": float(next(calls)) if system == "bm25" else 7.0})
    path = _write_matrix(tmp_path / "expected.yaml", str(make_toy_metatool(tmp_path / "toy")), expected=None)
    doc = yaml.safe_load(path.read_text())
    doc["systems"]["dense"] = {"kind": "baseline"}
    doc["entries"].append({"dataset": "toy", "system": "dense", "command": "coevo baseline dense DIR",
                           "metrics": {"n_queries": {"expected": None, "tolerance": 0.0}}})
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    said: list[str] = []
    with pytest.raises(ValueError, match=r"toy/bm25 n_queries: 0.0 then 1.0") as err:
        repro.record(path, runs=2, vary_threads=True, say=said.append)
    assert "1 other entries were" in str(err.value)
    again = repro.load(path)
    assert [e.metrics["n_queries"]["expected"] for e in again.entries if e.dataset == "toy"] == [None, 7.0]
    assert list(again.doc["recorded"]) == ["toy/dense"]
    assert again.doc["recorded"]["toy/dense"]["runs"] == 2
    assert again.doc["recorded"]["toy/dense"]["numerics"]["torch_threads"] == "1,2"
    assert "toy/dense: all 1 figures identical between runs" in said
    assert "toy/bm25: 1 of 1 figures moved; largest: n_queries 1 (tolerance 1e-09)" in said


def test_cli_check_prints_matched_and_failed_and_sets_the_exit_code(tmp_path, fake_figures, monkeypatch):
    from typer.testing import CliRunner

    from conftest import make_toy_metatool
    from coevo.cli.repro import app

    monkeypatch.chdir(tmp_path)  # library output goes to ./logs, as for `coevo run`
    source = make_toy_metatool(tmp_path / "toy")
    path = _write_matrix(tmp_path / "expected.yaml", str(source), expected=None)
    runner = CliRunner()
    assert runner.invoke(app, ["record", "--file", str(path)]).exit_code == 0
    result = runner.invoke(app, ["check", "--file", str(path)], terminal_width=200)
    assert result.exit_code == 0 and "matched" in result.output and "passed" in result.output
    n = repro.load(path).entries[0].metrics["n_queries"]["expected"]
    _write_matrix(path, str(source), expected=n + 0.5)
    result = runner.invoke(app, ["check", "--file", str(path)], terminal_width=200)
    assert result.exit_code == 1 and "failed" in result.output and "-0.5" in result.output
    logs = sorted(re.match(r"coevo-repro-(check|record)-\d{8}-\d{6}", p.name).group(1)
                  for p in (tmp_path / "logs").iterdir())
    assert logs == ["check", "check", "record"]


def test_record_refuses_a_tree_with_uncommitted_changes_and_stamps_commit_and_numerics(tmp_path, fake_figures,
                                                                                    monkeypatch):
    from conftest import make_toy_metatool
    from coevo.runtime import numerics

    path = _write_matrix(tmp_path / "expected.yaml", str(make_toy_metatool(tmp_path / "toy")), expected=None)
    monkeypatch.setattr(repro, "uncommitted_changes", lambda matrix_path: ["coevo/rewards/cogr.py"])
    with pytest.raises(ValueError, match=r"commit first \(uncommitted: coevo/rewards/cogr.py\)"):
        repro.record(path)
    assert repro.load(path).entries[0].metrics["n_queries"]["expected"] is None
    monkeypatch.setattr(repro, "uncommitted_changes", lambda matrix_path: [])
    repro.record(path, runs=1)
    stamp = repro.load(path).doc["recorded"]["toy/bm25"]
    assert stamp["git_commit"] == repro._git_commit() and len(stamp["git_commit"]) >= 7
    assert stamp["numerics"] == numerics(repro._project_params())


def test_uncommitted_changes_lists_tracked_edits_but_not_the_matrix_itself(monkeypatch):
    monkeypatch.setattr(repro, "_git", lambda *args: " M coevo/rewards/cogr.py\n M repro/expected.yaml\n"
                                                      "R  old.py -> coevo/new.py")
    assert UNCOMMITTED_CHANGES(repro.EXPECTED) == ["coevo/rewards/cogr.py", "coevo/new.py"]


def test_an_entry_keyed_by_other_numerics_is_skipped_by_check_and_refused_by_record(tmp_path, fake_figures,
                                                                                  monkeypatch):
    from conftest import make_toy_metatool

    source = str(make_toy_metatool(tmp_path / "toy"))
    path = _write_matrix(tmp_path / "expected.yaml", source, expected=None)
    doc = yaml.safe_load(path.read_text())
    mine, other = (dict(copy.deepcopy(doc["entries"][0]), numerics=n) for n in ("bf16", "fp32"))
    doc["entries"] = [mine, other]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    monkeypatch.setattr(repro, "local_numerics", lambda: "bf16")
    assert [e.id for e in repro.load(path).entries] == ["toy/bm25@bf16", "toy/bm25@fp32"]
    recorded = repro.record(path, runs=1)  # the fp32 entry is left as it is
    assert list(recorded) == ["toy/bm25@bf16"]
    assert [m["n_queries"]["expected"] is None for m in (e.metrics for e in repro.load(path).entries)] == [False, True]
    outcomes = repro.check(path)
    assert [(o.entry, o.status) for o in outcomes] == [("toy/bm25@bf16", "matched"), ("toy/bm25@fp32", "skipped")]
    assert "fp32's; this machine trains in bf16" in outcomes[1].note and repro.passed(outcomes)
    with pytest.raises(ValueError, match="toy/bm25@fp32: its figures are fp32's .* ONEDNN_MAX_CPU_ISA=AVX2"):
        repro.record(path, only=["toy/*@fp32"])
    # a bf16 figure that fails is marked when it was recorded on other bf16 units than this CPU's
    from coevo.runtime import cpu_bf16_units

    written = yaml.safe_load(path.read_text())
    assert written["recorded"]["toy/bm25@bf16"]["numerics"]["bf16_units"] == cpu_bf16_units()
    other_units = "AMX" if cpu_bf16_units() != "AMX" else "AVX512_BF16"
    written["recorded"]["toy/bm25@bf16"]["numerics"]["bf16_units"] = other_units
    spec = written["entries"][0]["metrics"]["n_queries"]
    spec["expected"] += 1.0  # a figure that now fails
    path.write_text(yaml.safe_dump(written, sort_keys=False))
    failed = [o for o in repro.check(path) if o.status == "failed"]
    assert [o.metric for o in failed] == ["n_queries"]
    assert failed[0].note == (f"recorded on {other_units} bf16 units; this CPU has {cpu_bf16_units()} "
                              "(bf16 figures hold on the same units)")
    del written["recorded"]["toy/bm25@bf16"]["numerics"]["bf16_units"]
    path.write_text(yaml.safe_dump(written, sort_keys=False))
    assert [o.note for o in repro.check(path) if o.status == "failed"] == [
        f"recorded before bf16 units were stamped; this CPU has {cpu_bf16_units()} (bf16 figures hold on the same units)"]

    doc["entries"][1]["numerics"] = "fp16"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(ValueError, match=r"entries\[1\] \(toy/bm25\): numerics 'fp16'; expected one of bf16, fp32"):
        repro.load(path)


def test_vary_threads_runs_the_kth_run_on_k_torch_threads(tmp_path, monkeypatch):
    import os

    from conftest import make_toy_metatool

    monkeypatch.setenv("COEVO_THREADS", "7")
    seen = []
    monkeypatch.setattr(repro, "baseline_figures",
                        lambda data_dir, system: {"n_queries": float(seen.append(os.environ["COEVO_THREADS"]) or 1)})
    path = _write_matrix(tmp_path / "expected.yaml", str(make_toy_metatool(tmp_path / "toy")), expected=None)
    repro.record(path, runs=2, vary_threads=True)
    assert seen == ["1", "2"] and os.environ["COEVO_THREADS"] == "7"
    repro.record(path, runs=2)
    assert seen[2:] == ["7", "7"]


def test_a_phase_s_training_records_become_figures_named_by_file_and_path(tmp_path):
    import json

    stage = tmp_path / "round_1"
    (stage / "generator").mkdir(parents=True)
    (stage / "dpo.json").write_text(json.dumps({"pairs": 7, "rewards_accuracy": 0.75, "reference": "adapter copy"}))
    (stage / "s3.json").write_text(json.dumps({"encoder": {"train_loss": 1.5}, "index": {"items": 3}}))
    (stage / "pairs.json").write_text(json.dumps([{"chosen_score": 1.0}]))  # a list: samples, not a record
    (stage / "generator" / "generator.json").write_text(json.dumps({"layers": 30}))  # a model folder: not read
    (stage / "s4_samples.json").write_text(json.dumps({"n": 1, "pad": "x" * repro.MAX_RECORD_BYTES}))
    assert repro._written_records(tmp_path, ["round_1", "eval/round_1.json"]) == {
        "dpo/pairs": 7.0, "dpo/rewards_accuracy": 0.75, "s3/encoder/train_loss": 1.5, "s3/index/items": 3.0}
    # a JSON record named as an output itself (CoHyDE's sub-phases write round_1/s3.json); evaluations are not read
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "round_1.json").write_text(json.dumps({"ndcg@5": 0.5}))
    assert repro._written_records(tmp_path, ["round_1/s3.json", "round_1/pairs.json", "eval/round_1.json",
                                             "round_1/missing.json"]) == {
        "s3/encoder/train_loss": 1.5, "s3/index/items": 3.0}
    # an encoder's or an index's folder named as an output: its config and tokenizer files are not records
    (stage / "encoder").mkdir()
    (stage / "encoder" / "config.json").write_text(json.dumps({"hidden_size": 384}))
    (stage / "encoder" / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 1}}}))
    assert repro._written_records(tmp_path, ["round_1/encoder", "round_1/generator"]) == {}


def test_record_keeps_what_another_record_wrote_to_the_file_meanwhile(tmp_path, monkeypatch):
    from conftest import make_toy_metatool

    path = _write_matrix(tmp_path / "expected.yaml", str(make_toy_metatool(tmp_path / "toy")), expected=None)

    def figures(data_dir, system):  # another process records the `gone` entry while this one runs
        doc = yaml.safe_load(path.read_text())
        doc["entries"][1]["metrics"]["n_queries"]["expected"] = 5.0
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return {"n_queries": 3.0}

    monkeypatch.setattr(repro, "baseline_figures", figures)
    repro.record(path, runs=1, only=["toy/*"])
    assert [e.metrics["n_queries"]["expected"] for e in repro.load(path).entries] == [3.0, 5.0]


class _SeededRun:
    """What the CoGR reward probe reads of a finished run: two items, two train queries."""

    def __init__(self):
        self.train_qrels = {"q1": {"a": 1}, "q2": {"b": 1}}
        self.cfg = type("Cfg", (), {"k_max": 8, "item_reward": "marginal"})()

    def is_done(self, name):
        return name == "seed"

    def seed_targets(self):
        # q1 retrieves a alone (F1 1); q2 retrieves a and b, one relevant (F1 2/3)
        return {"a": ["x", "y"], "b": ["y"]}, {"q1": ["x"], "q2": ["y"]}


def test_cogr_reward_probe_scores_the_seed_targets_with_the_training_rewards(monkeypatch):
    """Query reward of S_q: mean F1 (1 + 2/3) / 2. An item's empty set: a loses q1 (1 -> 0) and leaves q2
    with b alone (2/3 -> 1); b leaves q2 with a alone (2/3 -> 0): the summed F1 change of the queries it
    touches, -2/3 each. A reward that scores recall instead of F1 moves the query figure to 1."""
    figures = repro.cogr_seed_rewards(_SeededRun())
    assert figures["seed/query_reward_of_targets"] == pytest.approx(5 / 6, abs=1e-12)
    assert figures["seed/item_reward_of_empty_sets"] == pytest.approx(-2 / 3, abs=1e-12)

    from coevo.rewards.cogr import QueryReward

    monkeypatch.setattr(QueryReward, "f1", lambda self, q, kws, normalized=False: 1.0 if self._n_rel_of[
        self._query_row[q]] and any(k in ("x", "y") for k in kws) else 0.0)  # recall: a hit scores 1 however much else
    assert repro.cogr_seed_rewards(_SeededRun())["seed/query_reward_of_targets"] == 1.0
