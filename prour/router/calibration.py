"""Threshold calibration: grid search of (τ_AU, τ_EU) for the best three-class macro-F1 (A.2.2).

The grid is built from exact fractions (``lo + i·step``), so 0.29 is the double nearest 29/100
rather than 0.01 summed 29 times. The whole grid is scored at once: three matrix products give
the confusion matrix of every threshold pair. Ties go to the smallest τ_AU, then smallest τ_EU.
Macro-F1 averages the per-class F1 of the classes present in the labels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from prour.config.router import CalibrationConfig
from prour.router.routing import ROUTES, route_many

TIE_TOL = 1e-12


@dataclass(frozen=True)
class RoutingScores:
    """Three-way routing quality; ``confusion[t][p]`` counts true route t predicted as p."""

    macro_f1: float
    per_class_f1: dict[str, float]
    confusion: list[list[int]]
    labels: tuple[str, ...] = ROUTES

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Calibration:
    """The selected thresholds with their development-set scores."""

    tau_au: float
    tau_eu: float
    macro_f1: float
    per_class_f1: dict[str, float]
    confusion: list[list[int]]
    n_states: int
    grid: tuple[float, float, float]  # lo, hi, step
    n_ties: int = 1  # threshold pairs sharing the best macro-F1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def threshold_grid(lo: float, hi: float, step: float) -> np.ndarray:
    """Thresholds lo, lo+step, ..., up to hi inclusive, each rounded once from an exact fraction."""
    lo_f, hi_f, step_f = Fraction(str(lo)), Fraction(str(hi)), Fraction(str(step))
    if step_f <= 0 or hi_f < lo_f:
        raise ValueError(f"need step > 0 and hi >= lo; got lo={lo}, hi={hi}, step={step}")
    count = int((hi_f - lo_f) // step_f) + 1
    return np.array([float(lo_f + i * step_f) for i in range(count)])


def encode_labels(labels: Sequence[str]) -> np.ndarray:
    """Route names -> indices into :data:`ROUTES`; the error names the first bad position."""
    index = {name: i for i, name in enumerate(ROUTES)}
    codes = np.empty(len(labels), dtype=np.int64)
    for i, label in enumerate(labels):
        if label not in index:
            raise ValueError(f"labels[{i}] is {label!r}; expected one of {', '.join(ROUTES)}")
        codes[i] = index[label]
    return codes


def _check_inputs(au: ArrayLike, eu: ArrayLike, labels: Sequence[str]) -> tuple[np.ndarray, ...]:
    au_arr, eu_arr = np.asarray(au, dtype=np.float64), np.asarray(eu, dtype=np.float64)
    if au_arr.ndim != 1 or au_arr.shape != eu_arr.shape or len(labels) != au_arr.shape[0]:
        raise ValueError(
            f"au, eu and labels must be 1-D of equal length; got {au_arr.shape}, "
            f"{eu_arr.shape}, {len(labels)}"
        )
    if au_arr.size == 0:
        raise ValueError("no labelled states to calibrate on")
    if not (np.all(np.isfinite(au_arr)) and np.all(np.isfinite(eu_arr))):
        raise ValueError("au and eu must be finite")
    return au_arr, eu_arr, encode_labels(labels)


def f1_from_confusion(confusion: np.ndarray, present: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-class F1 [..., 3] and macro-F1 [...] over present classes from confusion [..., 3, 3]."""
    tp = np.diagonal(confusion, axis1=-2, axis2=-1)
    denom = confusion.sum(axis=-1) + confusion.sum(axis=-2)  # true_c + predicted_c
    per_class = np.divide(2.0 * tp, denom, out=np.zeros(tp.shape), where=denom > 0)
    return per_class, per_class[..., present].mean(axis=-1)


def grid_confusions(
    au: np.ndarray, eu: np.ndarray, codes: np.ndarray, tau_au: np.ndarray, tau_eu: np.ndarray
) -> np.ndarray:
    """Confusion of every pair: [G_au, G_eu, 3 true, 3 predicted], classes in ROUTES order."""
    onehot = np.eye(len(ROUTES))[codes]  # [N, 3]
    above_au = (au[None, :] >= tau_au[:, None]).astype(np.float64)  # [Ga, N] -> clarify
    above_eu = (eu[None, :] >= tau_eu[:, None]).astype(np.float64)  # [Ge, N]
    clarify = above_au @ onehot  # [Ga, 3 true]
    verify = np.stack(
        [((1.0 - above_au) * onehot[:, t]) @ above_eu.T for t in range(len(ROUTES))], axis=-1
    )  # [Ga, Ge, 3 true]
    totals = onehot.sum(axis=0)
    act = totals - clarify[:, None, :] - verify
    clarify_b = np.broadcast_to(clarify[:, None, :], verify.shape)
    confusion = np.stack([act, clarify_b, verify], axis=-1)  # predicted order = ROUTES
    return np.rint(confusion).astype(np.int64)


def calibrate(
    au: ArrayLike,
    eu: ArrayLike,
    labels: Sequence[str],
    calibration: CalibrationConfig | None = None,
) -> Calibration:
    """Pick (τ_AU, τ_EU) on the grid maximizing macro-F1 of AU-first routing vs ``labels``; the
    grid is ``router.calibration``'s ``lo``/``hi``/``step`` (None: that section's defaults)."""
    cfg = calibration if calibration is not None else CalibrationConfig()
    au_arr, eu_arr, codes = _check_inputs(au, eu, labels)
    grid = threshold_grid(cfg.lo, cfg.hi, cfg.step)
    confusion = grid_confusions(au_arr, eu_arr, codes, grid, grid)
    present = np.unique(codes)
    per_class, macro = f1_from_confusion(confusion, present)
    flat = macro.ravel()
    ties = np.flatnonzero(flat >= flat.max() - TIE_TOL)
    i, j = divmod(int(ties[0]), grid.size)  # row-major: smallest τ_AU first, then τ_EU
    return Calibration(
        tau_au=float(grid[i]),
        tau_eu=float(grid[j]),
        macro_f1=float(macro[i, j]),
        per_class_f1={name: float(per_class[i, j, c]) for c, name in enumerate(ROUTES)},
        confusion=confusion[i, j].tolist(),
        n_states=int(codes.size),
        grid=(float(cfg.lo), float(cfg.hi), float(cfg.step)),
        n_ties=int(ties.size),
    )


def evaluate_thresholds(
    au: ArrayLike, eu: ArrayLike, labels: Sequence[str], tau_au: float, tau_eu: float
) -> RoutingScores:
    """Score fixed thresholds on a (held-out) labelled set."""
    au_arr, eu_arr, _ = _check_inputs(au, eu, labels)
    return score_routes(list(route_many(au_arr, eu_arr, tau_au, tau_eu)), labels)


def score_routes(predicted: Sequence[str], labels: Sequence[str]) -> RoutingScores:
    """Macro-F1, per-class F1 and confusion of any predicted routes (e.g. the LLM router's)."""
    if len(predicted) != len(labels) or not labels:
        raise ValueError(f"need equal, non-zero lengths; got {len(predicted)} and {len(labels)}")
    true_codes, pred_codes = encode_labels(labels), encode_labels(predicted)
    confusion = np.zeros((len(ROUTES), len(ROUTES)), dtype=np.int64)
    np.add.at(confusion, (true_codes, pred_codes), 1)
    per_class, macro = f1_from_confusion(confusion, np.unique(true_codes))
    return RoutingScores(
        macro_f1=float(macro),
        per_class_f1={name: float(per_class[c]) for c, name in enumerate(ROUTES)},
        confusion=confusion.tolist(),
    )
