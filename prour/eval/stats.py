"""Resampling statistics for evaluation: task-level bootstrap intervals, paired differences, Holm.

The unit of resampling is the *task*: a benchmark result is a table of shape (n_tasks, n_seeds)
(or (n_tasks,) with one value per task), and seeds are averaged within each task before any
resampling, so that repeated trials of one task never count as independent evidence.
``strata`` (one label per task, e.g. the domain) makes the bootstrap resample tasks within each
stratum and turns the statistic into the unweighted mean of the stratum means, which is how an
"average over domains" is reported.

Bootstrap p-value (two-sided, percentile inversion). With B bootstrap draws d*_1..d*_B of a
statistic and a null value d0 (0 for a difference),

    p = min(1, 2 * min(#{d*_b <= d0} + 1, #{d*_b >= d0} + 1) / (B + 1)).

It is the smallest two-sided level at which the percentile interval would exclude d0 (so the
95% interval excludes zero roughly when p < 0.05); the +1 terms keep a finite number of draws
from ever reporting p = 0.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

ArrayLike = Sequence[float] | Sequence[Sequence[float]] | np.ndarray
Key = TypeVar("Key", bound=Hashable)


@dataclass(frozen=True)
class BootstrapResult:
    """A point estimate with its percentile interval and two-sided bootstrap p-value."""

    estimate: float
    low: float
    high: float
    p_value: float
    n_boot: int
    n_units: int
    ci: float

    def excludes(self, value: float = 0.0) -> bool:
        """True when the interval lies strictly on one side of ``value``."""
        return bool(self.low > value or self.high < value)


def task_means(values: ArrayLike, name: str = "values") -> np.ndarray:
    """(n_tasks,) or (n_tasks, n_seeds) → (n_tasks,): average the seeds of each task."""
    arr = np.asarray(values, dtype=float)
    if arr.ndim not in (1, 2) or arr.shape[0] == 0:
        raise ValueError(f"{name} must have shape (n_tasks,) or (n_tasks, n_seeds) with "
                         f"n_tasks >= 1, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        bad = np.argwhere(~np.isfinite(arr))[0].tolist()
        raise ValueError(f"{name} holds a non-finite value at index {bad}")
    return arr if arr.ndim == 1 else arr.mean(axis=1)


def _strata_groups(strata: Sequence[object] | None, n: int) -> list[np.ndarray]:
    """Indices of each stratum in first-seen order; one group of all units without strata."""
    if strata is None:
        return [np.arange(n)]
    if len(strata) != n:
        raise ValueError(f"strata has {len(strata)} labels for {n} tasks")
    order: dict[object, list[int]] = {}
    for i, label in enumerate(strata):
        order.setdefault(label, []).append(i)
    return [np.asarray(members) for members in order.values()]


def stratified_mean(values: np.ndarray, strata: Sequence[object] | None = None) -> float:
    """(n,) → scalar: the unweighted mean of the stratum means (plain mean without strata)."""
    groups = _strata_groups(strata, len(values))
    return float(np.mean([values[g].mean() for g in groups]))


def resampled_means(
    values: np.ndarray, n_boot: int, rng: np.random.Generator,
    strata: Sequence[object] | None = None,
) -> np.ndarray:
    """(n,) → (n_boot,): stratified means of ``n_boot`` resamples drawn with replacement."""
    groups = _strata_groups(strata, len(values))
    per_group = []
    for members in groups:
        draws = rng.integers(0, len(members), size=(n_boot, len(members)))
        per_group.append(values[members][draws].mean(axis=1))
    return np.mean(per_group, axis=0)


def resampled_indices(
    n: int, n_boot: int, rng: np.random.Generator, strata: Sequence[object] | None = None,
) -> np.ndarray:
    """(n_boot, n) unit indices; with strata each row resamples every stratum within itself."""
    groups = _strata_groups(strata, n)
    rows = np.empty((n_boot, n), dtype=np.int64)
    start = 0
    for members in groups:
        draws = rng.integers(0, len(members), size=(n_boot, len(members)))
        rows[:, start:start + len(members)] = members[draws]
        start += len(members)
    return rows


def bootstrap_p_value(draws: np.ndarray, null: float = 0.0) -> float:
    """(B,) draws → two-sided percentile-inversion p-value for ``null`` (module docstring)."""
    draws = np.asarray(draws, dtype=float)
    below = int(np.sum(draws <= null)) + 1
    above = int(np.sum(draws >= null)) + 1
    return float(min(1.0, 2.0 * min(below, above) / (len(draws) + 1)))


def _check_settings(n_boot: int, ci: float) -> None:
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    if not 0.0 < ci < 1.0:
        raise ValueError(f"ci must be in (0, 1), got {ci}")


def summarize_draws(estimate: float, draws: np.ndarray, ci: float, n_units: int,
                    null: float = 0.0) -> BootstrapResult:
    """Turn (B,) bootstrap draws into a :class:`BootstrapResult` with a percentile interval."""
    tail = (1.0 - ci) / 2.0
    low, high = np.quantile(draws, [tail, 1.0 - tail])
    return BootstrapResult(float(estimate), float(low), float(high),
                           bootstrap_p_value(draws, null), len(draws), n_units, ci)


def bootstrap_mean_ci(
    values: ArrayLike, n_boot: int = 10_000, seed: int = 0, ci: float = 0.95,
    strata: Sequence[object] | None = None,
) -> BootstrapResult:
    """Mean over tasks of (n_tasks,) or (n_tasks, n_seeds) values, with a task-bootstrap interval.

    The p-value tests a zero mean (useful when ``values`` are already paired differences).
    """
    _check_settings(n_boot, ci)
    per_task = task_means(values)
    draws = resampled_means(per_task, n_boot, np.random.default_rng(seed), strata)
    return summarize_draws(stratified_mean(per_task, strata), draws, ci, len(per_task))


def paired_bootstrap(
    a: ArrayLike, b: ArrayLike, n_boot: int = 10_000, seed: int = 0, ci: float = 0.95,
    strata: Sequence[object] | None = None,
) -> BootstrapResult:
    """Mean difference a − b over the same tasks, resampling task indices jointly for both.

    ``a`` and ``b`` have equal shapes (n_tasks,) or (n_tasks, n_seeds), rows aligned by task;
    seeds are averaged within each task first, then d_t = ā_t − b̄_t is bootstrapped.
    """
    mean_a, mean_b = task_means(a, "a"), task_means(b, "b")
    if mean_a.shape != mean_b.shape:
        raise ValueError(f"paired runs must cover the same tasks: a has {mean_a.shape[0]} "
                         f"tasks, b has {mean_b.shape[0]}")
    return bootstrap_mean_ci(mean_a - mean_b, n_boot, seed, ci, strata)


def bootstrap_statistic(
    statistic: Callable[[np.ndarray], float], n_units: int, n_boot: int = 10_000,
    seed: int = 0, ci: float = 0.95, strata: Sequence[object] | None = None, null: float = 0.0,
) -> BootstrapResult:
    """Interval for any statistic of resampled units: ``statistic(indices (n_units,)) -> float``.

    Draws where the statistic is not finite (e.g. a ratio with a zero denominator) are dropped;
    the number kept is ``n_boot`` of the result.
    """
    _check_settings(n_boot, ci)
    if n_units < 1:
        raise ValueError("bootstrap_statistic needs at least one unit")
    rng = np.random.default_rng(seed)
    rows = resampled_indices(n_units, n_boot, rng, strata)
    draws = np.array([statistic(row) for row in rows], dtype=float)
    draws = draws[np.isfinite(draws)]
    if draws.size == 0:
        raise ValueError("the statistic was not finite on any bootstrap draw")
    estimate = statistic(np.arange(n_units))
    return summarize_draws(estimate, draws, ci, n_units, null)


def holm_adjust(pvalues: Sequence[float]) -> np.ndarray:
    """(m,) raw p-values → (m,) Holm step-down adjusted p-values, in the input order.

    Sorted ascending p_(1) ≤ … ≤ p_(m): adj_(i) = max_{j ≤ i} min(1, (m − j + 1) · p_(j)).
    """
    p = np.asarray(pvalues, dtype=float)
    if p.ndim != 1:
        raise ValueError(f"pvalues must be one-dimensional, got shape {p.shape}")
    if np.any(~np.isfinite(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError(f"pvalues must lie in [0, 1], got {p.tolist()}")
    m = len(p)
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(scaled)
    return adjusted


def holm_table(results: Mapping[Key, BootstrapResult]) -> dict[Key, float]:
    """Holm-adjusted p-values of one family of comparisons, keyed like the input (empty → {})."""
    keys = list(results)
    adjusted = holm_adjust([results[k].p_value for k in keys]) if keys else []
    return {key: float(p) for key, p in zip(keys, adjusted)}
