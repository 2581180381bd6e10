"""bench/efficacy.py's own logic: the seeded data subset and the budget rule (no model runs here;
the bench itself runs the real pipeline, see "Does it learn?" in docs/experiments/efficacy_setup.md)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def efficacy():
    spec = importlib.util.spec_from_file_location("efficacy_bench", REPO_ROOT / "bench" / "efficacy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _metatool(folder: Path) -> Path:
    folder.mkdir()
    rows = [{"Query": f"query {i}", "Tool": f"tool{i % 3}"} for i in range(40)]
    rows.append({"Query": "query 5", "Tool": "tool0"})  # a query with a second relevant tool
    pd.DataFrame(rows).to_csv(folder / "all_clean_data.csv", index=False)
    (folder / "plugin_des.json").write_text(json.dumps({f"tool{i}": f"does thing {i}" for i in range(3)}))
    return folder


def test_subset_is_seeded_and_keeps_every_row_of_a_kept_query(efficacy, tmp_path):
    source = _metatool(tmp_path / "mt")
    a = pd.read_csv(efficacy.metatool_subset(source, tmp_path / "a", 10, seed=1) / "all_clean_data.csv")
    b = pd.read_csv(efficacy.metatool_subset(source, tmp_path / "b", 10, seed=1) / "all_clean_data.csv")
    c = pd.read_csv(efficacy.metatool_subset(source, tmp_path / "c", 10, seed=2) / "all_clean_data.csv")
    assert a["Query"].nunique() == 10 and a.equals(b) and set(a["Query"]) != set(c["Query"])
    full = pd.read_csv(source / "all_clean_data.csv")
    for query in a["Query"].unique():
        assert len(a[a["Query"] == query]) == len(full[full["Query"] == query])
    assert (tmp_path / "a" / "plugin_des.json").read_text() == (source / "plugin_des.json").read_text()
    whole = pd.read_csv(efficacy.metatool_subset(source, tmp_path / "all", 0, seed=1) / "all_clean_data.csv")
    assert len(whole) == len(full)


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _step(name, clock, seconds, ran):
    def run():
        ran.append(name)
        clock.now += seconds
        return {"eval": {"f1": 0.1}}

    return SimpleNamespace(name=f"cogr-{name}", run=run, done=lambda: False)


def _pipe(durations, clock, ran):
    phases = [SimpleNamespace(name=n) for n in durations]
    return SimpleNamespace(train_steps=lambda: (_step(n, clock, s, ran) for n, s in durations.items()),
                           method=SimpleNamespace(phases=lambda: phases))


def test_a_round_of_sub_phases_is_budgeted_as_one_phase(efficacy, monkeypatch):
    """CoHyDE's round is five phases: the budget decides before its S2 from the last whole round, never inside it."""
    clock, ran = _Clock(), []
    monkeypatch.setattr(efficacy.time, "perf_counter", clock)
    rounds = {f"round_{r}{part}": s for r in (1, 2) for part, s in
              (("_s2", 100), ("_s3", 100), ("_s4", 100), ("_dpo", 100), ("", 50))}
    pipe = _pipe({"hyde": 10, **rounds}, clock, ran)
    term = SimpleNamespace(say=lambda message: None)
    # round 1 ends at 460 s; round 2 would end at 910 s > 700: stop before its S2, not after its S2 (560 < 700)
    done, why = efficacy.train_within(pipe, 700, 0.0, term, "ndcg@5")
    assert done == ran == ["hyde", *list(rounds)[:5]]
    assert why == "budget: round_2 would end near 15 min (the last round phase took 7.5 min)"
    assert efficacy.unit_of("round_12_s3", ["round_1", "round_12_s3", "round_12"]) == "round_12"
    assert efficacy.unit_of("01_query", ["00_sft", "01_query"]) == "01_query"


def test_a_phase_starts_only_when_the_last_one_of_its_kind_says_it_fits(efficacy, monkeypatch):
    clock, ran = _Clock(), []
    monkeypatch.setattr(efficacy.time, "perf_counter", clock)
    durations = {"seed": 1, "00_sft": 100, "01_query": 300, "02_item": 200, "03_query": 300, "04_item": 200}
    pipe = _pipe(durations, clock, ran)
    term = SimpleNamespace(say=lambda message: None)
    # 1000 s: after 04_item (at 901 s)... 03_query would end at 601 + 300 = 901 <= 1000, 04_item at 1101 > 1000.
    done, why = efficacy.train_within(pipe, 1000, 0.0, term, "f1")
    assert done == ["seed", "00_sft", "01_query", "02_item", "03_query"] == ran
    assert why.startswith("budget: 04_item would end near 18 min (the last item phase took 3.3 min)")
    clock.now, ran[:] = 0.0, []
    done, why = efficacy.train_within(pipe, 50, 0.0, term, "f1")  # the first phase always runs
    assert done == ["seed", "00_sft"] and why == "budget spent before 01_query"


def test_a_grpo_phase_line_says_where_its_signal_went(efficacy):
    record = {"name": "01_query", "eval": {"f1": 0.5123},
              "train": {"reward_first": 0.1, "reward_last": 0.3, "frac_reward_zero_std": 0.625, "steps": 16,
                        "step_seconds": 12.0, "groups_solved_in_none_share": 0.25, "groups_solved_in_all_share": 0.375,
                        "rollouts_per_min": 41.6, "generation_share": 0.71}}
    assert efficacy.phase_line(record, "f1", 300.0) == (
        "01_query: 5.0 min, val f1=0.5123, reward +0.100 -> +0.300, zero-std groups 0.62, "
        "groups solved in none 0.25, in all 0.38, 16 steps of 12.0s, 42 rollouts/min, 71% of it sampling")
    del record["train"]["groups_solved_in_all_share"], record["train"]["generation_share"]
    assert efficacy.phase_line(record, "f1", 300.0).endswith(
        "groups solved in none 0.25, 16 steps of 12.0s, 42 rollouts/min")
