"""CoHyDE pair mining: best vs worst, ties dropped, statistics."""

from __future__ import annotations

import numpy as np
import pytest

from coevo.rewards.cohyde import mine_dpo_pairs


def test_best_vs_worst_and_ties_dropped():
    prompts = ["p0", "p1", "p2"]
    samples = [["a", "b", "c", "d"], ["e", "f", "g", "h"], ["i", "j", "k", "l"]]
    scores = [[0.2, 0.9, 0.0, 0.5], [0.3, 0.3, 0.3, 0.3], [0.0, 0.0, 1.0, 0.0]]
    pairs, stats = mine_dpo_pairs(prompts, samples, scores)
    assert [(p["prompt"], p["chosen"], p["rejected"]) for p in pairs] == [("p0", "b", "c"), ("p2", "k", "i")]
    assert stats["pairs"] == 2 and stats["ties_dropped"] == 1 and stats["queries"] == 3
    assert stats["mean_score_gap"] == pytest.approx((0.9 + 1.0) / 2)
    assert stats["mean_best"] == pytest.approx((0.9 + 0.3 + 1.0) / 3)


def test_all_ties_give_no_pairs_and_zero_gap():
    pairs, stats = mine_dpo_pairs(["p"], [["a", "b"]], np.zeros((1, 2)))
    assert pairs == [] and stats["ties_dropped"] == 1 and stats["mean_score_gap"] == 0.0


def test_bad_shapes_and_values_are_refused():
    with pytest.raises(ValueError, match="one entry per query"):
        mine_dpo_pairs(["p"], [], [])
    with pytest.raises(ValueError, match="query 0: 2 samples and 3 scores"):
        mine_dpo_pairs(["p"], [["a", "b"]], [[0.1, 0.2, 0.3]])
    with pytest.raises(ValueError, match="NaN"):
        mine_dpo_pairs(["p"], [["a", "b"]], [[0.1, float("nan")]])


def test_empty_samples_take_no_part_in_a_pair():
    """An empty description scoring best (the query encoded alone) is not chosen; the best written one is.
    A query with one written sample gives no pair. Without empty samples the pairs are as before."""
    samples = [["", "b", "c", "  "], ["", "f", " ", "h"], ["x", "", "", ""]]
    scores = [[0.9, 0.5, 0.1, 0.0], [0.0, 0.4, 0.9, 0.2], [0.1, 0.5, 0.2, 0.3]]
    pairs, stats = mine_dpo_pairs(["p0", "p1", "p2"], samples, scores)
    assert [(p["prompt"], p["chosen"], p["rejected"], p["chosen_score"]) for p in pairs] == [
        ("p0", "b", "c", 0.5), ("p1", "f", "h", 0.4)]
    assert (stats["empty_samples"], stats["empty_dropped"], stats["ties_dropped"]) == (7, 1, 0)
    assert stats["mean_best"] == pytest.approx((0.9 + 0.9 + 0.5) / 3)  # over all samples, as before
