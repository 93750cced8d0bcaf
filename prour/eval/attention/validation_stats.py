"""Agreement statistics of the validation studies, as small typed functions.

Labels are integer codes (one per category, ``-1`` where a rater gave none). Each statistic
takes optional *weights*: a (B, n) array of how many times each item is drawn in B bootstrap
resamples (one row per resample), so one vectorised call gives the statistic of every resample;
without weights every item counts once.

- agreement: share of items, among those both raters labelled, given the same label;
- Cohen's κ = (p_o − p_e) / (1 − p_e), with p_o the agreement and p_e = Σ_k p1_k · p2_k the
  agreement expected from each rater's label shares; undefined (NaN) when p_e = 1;
- Spearman's rank correlation: Pearson's correlation of the average ranks (ties share the mean
  of the ranks they span); NaN when either side is constant.

Bootstrap intervals (:func:`weighted_bootstrap`) resample *units* with replacement: items, or
clusters of items (all pairs of one task), and take percentile intervals of the statistics.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence

import numpy as np

from prour.eval.stats import BootstrapResult, summarize_draws

CHUNK = 500  # resamples weighed at once (bounds the (B, n) weight array in memory)


def label_codes(labels: Sequence[str | None], categories: Sequence[str]) -> np.ndarray:
    """(n,) integer codes of labels in ``categories`` order; None (no label) is -1."""
    index = {c: i for i, c in enumerate(categories)}
    unknown = {x for x in labels if x is not None and x not in index}
    if unknown:
        raise ValueError(f"labels {sorted(unknown)} are not among {list(categories)}")
    return np.array([-1 if x is None else index[x] for x in labels], dtype=np.int64)


def _weights(weights: np.ndarray | None, n: int) -> np.ndarray:
    return np.ones((1, n)) if weights is None else np.atleast_2d(np.asarray(weights, float))


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    out = np.full(num.shape, np.nan)
    np.divide(num, den, out=out, where=den > 0)
    return out


def agreement(x: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """(B,) share of the (weighted) items both labelled on which ``x`` and ``y`` agree."""
    valid = (x >= 0) & (y >= 0)
    w = _weights(weights, len(x))
    return _ratio(w @ (valid & (x == y)).astype(float), w @ valid.astype(float))


def cohen_kappa(x: np.ndarray, y: np.ndarray, n_categories: int,
                weights: np.ndarray | None = None) -> np.ndarray:
    """(B,) Cohen's κ of two raters' codes (module docstring); NaN where p_e = 1."""
    valid = (x >= 0) & (y >= 0)
    w = _weights(weights, len(x))
    total = w @ valid.astype(float)
    observed = _ratio(w @ (valid & (x == y)).astype(float), total)
    expected = np.zeros_like(observed)
    for k in range(n_categories):
        share_x = _ratio(w @ (valid & (x == k)).astype(float), total)
        share_y = _ratio(w @ (valid & (y == k)).astype(float), total)
        expected += share_x * share_y
    out = np.full(observed.shape, np.nan)
    np.divide(observed - expected, 1.0 - expected, out=out, where=(1.0 - expected) > 1e-12)
    return out


def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, tied values sharing the mean of the ranks they span."""
    values = np.asarray(values, dtype=float)
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return sums[inverse] / counts[inverse]


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation of paired values (NaN when either side is constant)."""
    rx, ry = average_ranks(np.asarray(x)), average_ranks(np.asarray(y))
    if len(rx) < 2 or np.all(rx == rx[0]) or np.all(ry == ry[0]):
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def unit_index(units: Sequence[Hashable]) -> tuple[np.ndarray, int]:
    """(n,) index of each item's unit (first-seen order) and the number of units."""
    order: dict[Hashable, int] = {}
    index = np.array([order.setdefault(u, len(order)) for u in units], dtype=np.int64)
    return index, len(order)


def _draw_counts(rng: np.random.Generator, rows: int, n_units: int) -> np.ndarray:
    """(rows, n_units) times each unit is drawn in ``rows`` resamples of ``n_units`` units."""
    draws = rng.integers(0, n_units, size=(rows, n_units))
    offsets = (draws + n_units * np.arange(rows)[:, None]).ravel()
    return np.bincount(offsets, minlength=rows * n_units).reshape(rows, n_units).astype(float)


def weighted_bootstrap(
    statistics: Callable[[np.ndarray], Mapping[str, np.ndarray]], units: Sequence[Hashable],
    n_boot: int, seed: int, ci: float = 0.95,
) -> dict[str, BootstrapResult | None]:
    """Percentile intervals of several statistics of the same resamples.

    ``units`` names each item's resampling unit (the item itself, or its task); a resample
    draws as many units as there are, with replacement, and keeps all items of each drawn unit.
    ``statistics`` maps item weights (B, n) to ``{name: (B,) values}``. A statistic undefined on
    the full sample, or on every resample, gets None; undefined resamples are dropped.
    """
    if n_boot < 1 or not 0.0 < ci < 1.0:
        raise ValueError(f"need n_boot >= 1 and 0 < ci < 1, got {n_boot} and {ci}")
    index, n_units = unit_index(units)
    if n_units == 0:
        raise ValueError("no items to resample")
    estimates = {k: float(v[0]) for k, v in statistics(np.ones((1, len(index)))).items()}
    rng = np.random.default_rng(seed)
    parts: dict[str, list[np.ndarray]] = {k: [] for k in estimates}
    for start in range(0, n_boot, CHUNK):
        counts = _draw_counts(rng, min(CHUNK, n_boot - start), n_units)
        for name, values in statistics(counts[:, index]).items():
            parts[name].append(np.asarray(values, dtype=float))
    out: dict[str, BootstrapResult | None] = {}
    for name, estimate in estimates.items():
        draws = np.concatenate(parts[name])
        draws = draws[np.isfinite(draws)]
        out[name] = None if not np.isfinite(estimate) or draws.size == 0 else \
            summarize_draws(estimate, draws, ci, n_units)
    return out


def interval_json(result: BootstrapResult | None) -> dict[str, float | int] | None:
    """An interval as JSON (its p-value left out: these statistics test no null value)."""
    if result is None:
        return None
    return {"estimate": result.estimate, "low": result.low, "high": result.high,
            "n_boot": result.n_boot, "units": result.n_units, "ci": result.ci}


def percent_cell(result: BootstrapResult | None, missing: str, digits: int = 1) -> str:
    """``estimate [low, high]`` in percent, or ``– (why)`` when not measured."""
    if result is None:
        return f"– ({missing})"
    return (f"{100 * result.estimate:.{digits}f} [{100 * result.low:.{digits}f}, "
            f"{100 * result.high:.{digits}f}]")


def plain_cell(result: BootstrapResult | None, missing: str, digits: int = 2) -> str:
    """``estimate [low, high]`` as is (κ, score points), or ``– (why)``."""
    if result is None:
        return f"– ({missing})"
    return f"{result.estimate:.{digits}f} [{result.low:.{digits}f}, {result.high:.{digits}f}]"
