"""Bootstrap intervals, paired differences, p-values and Holm against exact hand computations."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from prour.eval.stats import (
    BootstrapResult,
    bootstrap_mean_ci,
    bootstrap_p_value,
    bootstrap_statistic,
    holm_adjust,
    holm_table,
    paired_bootstrap,
    resampled_means,
    stratified_mean,
    task_means,
)


def exact_quantile(values: list[float], q: float) -> float:
    """Inverse CDF of the exact bootstrap distribution of the mean (all n^n resamples)."""
    n = len(values)
    means = sorted(np.mean([values[i] for i in idx])
                   for idx in itertools.product(range(n), repeat=n))
    cdf = np.arange(1, len(means) + 1) / len(means)
    # q must sit away from a jump of the CDF, or a finite sample could land on either side.
    assert np.min(np.abs(cdf - q)) > 0.01
    return float(means[int(np.searchsorted(cdf, q))])


def test_interval_matches_exhaustive_enumeration_for_three_tasks():
    values = [0.0, 1.0, 2.0]
    result = bootstrap_mean_ci(values, n_boot=200_000, seed=1, ci=0.80)
    assert result.estimate == pytest.approx(1.0)
    # Exact distribution of resampled means: atoms k/3 with weights 1,3,6,7,6,3,1 over 27.
    assert exact_quantile(values, 0.10) == pytest.approx(1 / 3)
    assert result.low == pytest.approx(1 / 3)
    assert result.high == pytest.approx(exact_quantile(values, 0.90)) == pytest.approx(5 / 3)


def test_resampled_means_have_the_closed_form_bootstrap_variance():
    values = np.array([0.0, 1.0, 1.0, 4.0])
    draws = resampled_means(values, 200_000, np.random.default_rng(0))
    # Var*(mean*) = (1/n) * population variance = (1/4) * mean((x - 1.5)^2) = 2.25 / 4.
    assert draws.mean() == pytest.approx(1.5, abs=0.01)
    assert draws.var() == pytest.approx(2.25 / 4, rel=0.02)


def test_paired_bootstrap_averages_seeds_within_task_then_differences():
    a = [[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]]  # task means 0.5, 1, 0
    b = [[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]]  # task means 0, 0.5, 0.5
    result = paired_bootstrap(a, b, n_boot=200_000, seed=3, ci=0.80)
    diffs = [0.5, 0.5, -0.5]
    assert result.estimate == pytest.approx(np.mean(diffs))
    assert result.low == pytest.approx(exact_quantile(diffs, 0.10))
    assert result.high == pytest.approx(exact_quantile(diffs, 0.90))
    assert result.n_units == 3


def test_paired_bootstrap_of_identical_runs_is_zero_with_p_one():
    runs = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
    result = paired_bootstrap(runs, runs, n_boot=500)
    assert (result.estimate, result.low, result.high, result.p_value) == (0.0, 0.0, 0.0, 1.0)
    assert not result.excludes(0.0)


def test_p_value_definition_on_one_sided_draws():
    assert bootstrap_p_value(np.array([0.1, 0.2, 0.3])) == pytest.approx(2 * 1 / 4)
    assert bootstrap_p_value(np.array([-1.0, 1.0, 2.0, 3.0])) == pytest.approx(2 * 2 / 5)
    result = bootstrap_mean_ci([1.0, 2.0, 3.0], n_boot=999)
    assert result.p_value == pytest.approx(2 / 1000)
    assert result.excludes(0.0)


def test_strata_weight_domains_equally_and_resample_within_them():
    values = np.array([1.0, 0.0, 1.0, 1.0, 1.0, 0.0])
    strata = ["a", "a", "b", "b", "b", "b"]
    assert stratified_mean(values, strata) == pytest.approx((0.5 + 0.75) / 2)
    result = bootstrap_mean_ci(values, n_boot=2000, strata=strata)
    assert result.estimate == pytest.approx(0.625)
    # Within-stratum resampling: with stratum b all ones, a draw is (mean of a* + 1) / 2 and
    # a* has mean 0, 0.5 or 1 with probabilities 1/4, 1/2, 1/4; pooled resampling would differ.
    draws = resampled_means(np.array([1.0, 0.0, 1.0, 1.0, 1.0]), 100_000,
                            np.random.default_rng(0), ["a", "a", "b", "b", "b"])
    atoms, counts = np.unique(draws, return_counts=True)
    np.testing.assert_allclose(atoms, [0.5, 0.75, 1.0])
    np.testing.assert_allclose(counts / counts.sum(), [0.25, 0.5, 0.25], atol=0.01)


def test_holm_on_a_textbook_example():
    # Sorted 0.005, 0.01, 0.03, 0.04 → ×4, ×3, ×2, ×1 = 0.02, 0.03, 0.06, 0.04 → running max.
    adjusted = holm_adjust([0.01, 0.04, 0.03, 0.005])
    np.testing.assert_allclose(adjusted, [0.03, 0.06, 0.06, 0.02])
    np.testing.assert_allclose(holm_adjust([0.5, 0.4]), [0.8, 0.8])
    np.testing.assert_allclose(holm_adjust([0.9, 0.6, 0.01]), [1.0, 1.0, 0.03])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        holm_adjust([0.2, 1.5])


def test_bootstrap_statistic_matches_enumeration_for_a_ratio():
    hits, totals = np.array([2.0, 0.0, 1.0]), np.array([2.0, 1.0, 1.0])
    result = bootstrap_statistic(lambda i: hits[i].sum() / totals[i].sum(), 3, n_boot=100_000,
                                 seed=0, ci=0.80, null=0.5)
    ratios = sorted(hits[list(i)].sum() / totals[list(i)].sum()
                    for i in itertools.product(range(3), repeat=3))
    cdf = np.arange(1, 28) / 27
    assert result.estimate == pytest.approx(0.75)
    assert result.low == pytest.approx(ratios[int(np.searchsorted(cdf, 0.10))])
    assert result.high == pytest.approx(ratios[int(np.searchsorted(cdf, 0.90))])


def test_shapes_and_settings_are_checked():
    assert task_means([[1.0, 0.0], [1.0, 1.0]]).tolist() == [0.5, 1.0]
    with pytest.raises(ValueError, match="same tasks"):
        paired_bootstrap([1.0, 0.0], [1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="non-finite"):
        bootstrap_mean_ci([1.0, float("nan")])
    with pytest.raises(ValueError, match="ci must be"):
        bootstrap_mean_ci([1.0], ci=1.5)


def test_holm_table_keeps_names():
    results = {name: BootstrapResult(0.0, 0.0, 0.0, p, 1, 1, 0.95)
               for name, p in [("gpt/retail", 0.01), ("gpt/airline", 0.04), ("x/retail", 0.03)]}
    # sorted 0.01, 0.03, 0.04 → 0.03, 0.06, 0.04 → running max 0.03, 0.06, 0.06
    assert holm_table(results) == pytest.approx(
        {"gpt/retail": 0.03, "gpt/airline": 0.06, "x/retail": 0.06})
    assert holm_table({}) == {}
