"""Paired bootstrap CIs and randomisation p-values (coevo.stats): known cases, seeds, errors."""

from __future__ import annotations

import numpy as np
import pytest

from coevo.retrieval.metrics import ranked_evaluation
from coevo.stats import compare, mean_ci, mean_cis, paired_difference


def _scores(n: int = 200, seed: int = 0) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    return {f"q{i}": float(v) for i, v in enumerate(rng.random(n))}


def test_identical_systems_differ_by_zero_with_p_one() -> None:
    a = _scores()
    d = paired_difference(a, dict(a))
    assert (d.mean, d.ci_low, d.ci_high, d.p_value, d.n) == (0.0, 0.0, 0.0, 1.0, 200)
    assert d.ci_low <= 0 <= d.ci_high and not d.significant


def test_constant_shift_gives_a_tight_ci_and_a_small_p() -> None:
    a = _scores()
    b = {q: v - 0.05 for q, v in a.items()}
    d = paired_difference(a, b, seed=1)
    assert d.mean == pytest.approx(0.05)
    assert d.ci_low == pytest.approx(0.05, abs=1e-9) and d.ci_high == pytest.approx(0.05, abs=1e-9)
    assert d.p_value <= 2 / (d.permutations + 1)  # only the observed sign pattern is as extreme
    assert d.significant and d.mean_a == pytest.approx(d.mean_b + 0.05)


def test_small_samples_use_the_exact_sign_flip_distribution() -> None:
    a = {f"q{i}": 1.0 for i in range(5)}
    b = {f"q{i}": 0.0 for i in range(5)}
    # 2^5 = 32 sign patterns, two of them (all +, all -) reach |mean| = 1: p = 2/32.
    assert paired_difference(a, b).p_value == pytest.approx(2 / 32)


def test_noisy_difference_ci_covers_the_truth_and_is_reproducible() -> None:
    rng = np.random.default_rng(7)
    a = _scores(400, seed=3)
    b = {q: v - 0.02 + float(rng.normal(0, 0.2)) for q, v in a.items()}
    d1 = paired_difference(a, b, seed=11)
    assert d1 == paired_difference(dict(reversed(list(a.items()))), b, seed=11)  # order does not matter
    assert d1.ci_low < d1.mean < d1.ci_high
    assert d1.ci_high - d1.ci_low < 0.08
    d2 = paired_difference(a, b, seed=12)
    assert (d2.ci_low, d2.ci_high) != (d1.ci_low, d1.ci_high)  # another seed, other resamples
    assert abs(d2.ci_low - d1.ci_low) < 0.01
    # The bootstrap CI of the mean difference agrees with the normal approximation.
    diffs = np.array([a[q] - b[q] for q in sorted(a)])
    half = 1.96 * diffs.std(ddof=1) / np.sqrt(len(diffs))
    assert d1.ci_high - d1.ci_low == pytest.approx(2 * half, rel=0.15)
    # A p-value near the normal-theory one (paired t on 400 queries).
    from scipy.stats import ttest_rel

    t_p = ttest_rel([a[q] for q in sorted(a)], [b[q] for q in sorted(a)]).pvalue
    assert d1.p_value == pytest.approx(t_p, abs=0.03)


def test_query_sets_must_match() -> None:
    a = {"q1": 1.0, "q2": 0.5, "q3": 0.0}
    with pytest.raises(ValueError, match=r"3 vs 2 queries, 1 only in a \('q3'\)"):
        paired_difference(a, {"q1": 1.0, "q2": 0.5})
    with pytest.raises(ValueError, match="only in b"):
        paired_difference({"q1": 1.0}, {"q1": 1.0, "zz": 0.0})
    with pytest.raises(TypeError, match="mappings"):
        paired_difference([1.0, 2.0], [1.0, 2.0])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="NaN"):
        paired_difference({"q": float("nan")}, {"q": 1.0})
    with pytest.raises(ValueError, match="no per-query values"):
        mean_ci({})
    with pytest.raises(ValueError, match="method"):
        mean_ci([1.0, 2.0], method="normal")  # type: ignore[arg-type]


def test_mean_ci_reports_n_and_is_seeded() -> None:
    values = [1.0] * 30 + [0.0] * 70
    ci = mean_ci(values, resamples=1000, seed=5)
    assert ci.n == 100 and ci.mean == pytest.approx(0.3) and ci.resamples == 1000
    assert 0.19 < ci.ci_low < 0.3 < ci.ci_high < 0.41
    assert ci == mean_ci(values, resamples=1000, seed=5)
    assert mean_ci([0.4]).ci_low == 0.4 and mean_ci([0.2, 0.2]).ci_high == 0.2
    assert "0.3000 [" in str(ci)
    bca = mean_ci(values, method="BCa")
    assert bca.ci_low < 0.3 < bca.ci_high


def test_compare_and_mean_cis_over_an_evaluation() -> None:
    qrels = {f"q{i}": {"a": 1} for i in range(30)}
    good = ranked_evaluation({q: ["a", "b"] for q in qrels}, qrels, (1, 5))
    bad = ranked_evaluation({q: (["b", "a"] if i % 3 else ["a"]) for i, q in enumerate(qrels)}, qrels, (1, 5))
    diffs = compare(good, bad, ["precision@1", "recall@5"], resamples=1000)
    assert diffs["recall@5"].mean == 0.0 and diffs["recall@5"].p_value == 1.0
    assert diffs["precision@1"].mean == pytest.approx(20 / 30) and diffs["precision@1"].significant
    cis = mean_cis(good, resamples=1000)
    assert set(cis) == set(good.per_query) and cis["ndcg@5"].n == 30
    with pytest.raises(KeyError, match="ndcg@3"):
        mean_cis(good.per_query, ["ndcg@3"])
