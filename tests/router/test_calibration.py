"""Grid search of (τ_AU, τ_EU): planted thresholds are recovered, ties follow the rule, the
vectorized grid agrees with a plain loop, and F1 matches hand-computed values."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from prour.config.router import CalibrationConfig
from prour.router import Uncertainty, calibrate, evaluate_thresholds, route
from prour.router.calibration import score_routes, threshold_grid


def test_grid_has_no_float_drift() -> None:
    grid = threshold_grid(0.0, 0.8, 0.01)
    assert grid.size == 81
    assert grid[29] == 0.29 and grid[57] == 0.57 and grid[-1] == 0.8  # 0.01*29 != 0.29 in floats


def _planted(seed: int, tau_au: float, tau_eu: float, n: int = 600):
    rng = np.random.default_rng(seed)
    au, eu = rng.uniform(0, 0.8, n), rng.uniform(0, 0.8, n)
    # points just below and at each planted value pin the smallest perfect pair to the plant
    au = np.concatenate([au, [tau_au - 0.005, tau_au, 0.0, 0.0]])
    eu = np.concatenate([eu, [0.0, 0.0, tau_eu - 0.005, tau_eu]])
    labels = [route(Uncertainty(a, e, a + e), tau_au, tau_eu) for a, e in zip(au, eu)]
    return au, eu, labels


@pytest.mark.parametrize(
    ("tau_au", "tau_eu", "seed"), [(0.31, 0.17, 0), (0.25, 0.2, 1), (0.6, 0.05, 2)]
)
def test_recovers_planted_thresholds(tau_au: float, tau_eu: float, seed: int) -> None:
    au, eu, labels = _planted(seed, tau_au, tau_eu)
    result = calibrate(au, eu, labels)
    assert (result.tau_au, result.tau_eu) == (tau_au, tau_eu)
    assert result.macro_f1 == 1.0
    assert result.confusion == [
        [labels.count(r) if r == c else 0 for c in ("act", "clarify", "verify")]
        for r in ("act", "clarify", "verify")
    ]


def test_noisy_labels_still_land_near_the_plant() -> None:
    au, eu, labels = _planted(3, 0.3, 0.2, n=3000)
    rng = np.random.default_rng(4)
    flip = rng.random(len(labels)) < 0.1
    noisy = [rng.choice(["act", "clarify", "verify"]) if f else lab for f, lab in zip(flip, labels)]
    result = calibrate(au, eu, noisy)
    assert abs(result.tau_au - 0.3) <= 0.03 and abs(result.tau_eu - 0.2) <= 0.03


def test_tie_rule_prefers_smallest_tau_au_then_tau_eu() -> None:
    # act (0.05, 0.05), verify (0.10, 0.50), clarify (0.50, 0.00): every τ_AU in (0.10, 0.50] and
    # τ_EU in (0.05, 0.50] is perfect -> the rule picks (0.11, 0.06) among 40 x 45 tied pairs.
    result = calibrate([0.05, 0.10, 0.50], [0.05, 0.50, 0.00], ["act", "verify", "clarify"])
    assert (result.tau_au, result.tau_eu, result.macro_f1) == (0.11, 0.06, 1.0)
    assert result.n_ties == 40 * 45


def test_hand_computed_f1() -> None:
    au, eu = [0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.5, 0.0]
    labels = ["clarify", "verify", "verify", "act"]
    scores = evaluate_thresholds(au, eu, labels, 0.25, 0.25)  # predicted: C, C, V, A
    assert scores.confusion == [[1, 0, 0], [0, 1, 0], [0, 1, 1]]
    assert scores.per_class_f1 == pytest.approx({"act": 1.0, "clarify": 2 / 3, "verify": 2 / 3})
    assert scores.macro_f1 == pytest.approx(7 / 9)


def test_vectorized_grid_matches_a_plain_loop() -> None:
    rng = np.random.default_rng(7)
    au, eu = rng.uniform(0, 0.6, 80), rng.uniform(0, 0.6, 80)
    labels = list(rng.choice(["act", "clarify", "verify"], size=80))
    result = calibrate(au, eu, labels, CalibrationConfig(lo=0.0, hi=0.6, step=0.05))
    best, best_pair = -1.0, None
    for ta, te in itertools.product(threshold_grid(0.0, 0.6, 0.05), repeat=2):
        predicted = [route(Uncertainty(a, e, a + e), ta, te) for a, e in zip(au, eu)]
        f1 = score_routes(predicted, labels).macro_f1
        if f1 > best + 1e-12:  # strict improvement keeps the first (smallest) pair
            best, best_pair = f1, (ta, te)
    assert (result.tau_au, result.tau_eu) == best_pair
    assert result.macro_f1 == pytest.approx(best, abs=1e-12)
    loop = evaluate_thresholds(au, eu, labels, result.tau_au, result.tau_eu)
    assert loop.confusion == result.confusion


def test_macro_f1_averages_present_classes_only() -> None:
    scores = score_routes(["clarify", "verify"], ["clarify", "verify"])
    assert scores.macro_f1 == 1.0 and scores.per_class_f1["act"] == 0.0


def test_bad_labels_and_shapes_raise() -> None:
    with pytest.raises(ValueError, match=r"labels\[1\] is 'ask'"):
        calibrate([0.1, 0.2], [0.1, 0.2], ["act", "ask"])
    with pytest.raises(ValueError, match="equal length"):
        calibrate([0.1, 0.2], [0.1], ["act", "act"])
    with pytest.raises(ValueError, match="no labelled states"):
        calibrate([], [], [])
