"""AU / EU / total against hand-computed cases, the identity AU + EU = H(mean), input checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prour.router import decompose, softmax_over_candidates


def test_identical_rows_have_no_aleatoric_part() -> None:
    row = [0.5, 0.3, 0.2]
    h = -(0.5 * math.log(0.5) + 0.3 * math.log(0.3) + 0.2 * math.log(0.2))
    u = decompose([row, row, row])
    assert u.au == pytest.approx(0.0, abs=1e-12)
    assert u.eu == pytest.approx(h, abs=1e-12)
    assert u.total == pytest.approx(h, abs=1e-12)


def test_disjoint_one_hot_rows_are_all_aleatoric() -> None:
    u = decompose(np.eye(3))  # K=3 goals, each sure of a different candidate
    assert u.eu == pytest.approx(0.0, abs=1e-12)
    assert u.au == pytest.approx(math.log(3), abs=1e-12)
    assert u.total == pytest.approx(math.log(3), abs=1e-12)
    # K=2 one-hot rows over C=4 candidates: the mean puts 1/2 on two of them.
    u2 = decompose([[1, 0, 0, 0], [0, 1, 0, 0]])
    assert (u2.au, u2.eu) == pytest.approx((math.log(2), 0.0), abs=1e-12)


def test_uniform_rows_are_all_epistemic() -> None:
    u = decompose(np.full((4, 5), 0.2))
    assert u.au == pytest.approx(0.0, abs=1e-12)
    assert u.eu == pytest.approx(math.log(5), abs=1e-12)


def test_single_candidate_has_no_uncertainty() -> None:
    u = decompose(np.ones((5, 1)))
    assert (u.au, u.eu, u.total) == (0.0, 0.0, 0.0)


def test_mixed_case_by_hand() -> None:
    # rows (1, 0) and (1/2, 1/2): EU = (0 + ln 2)/2; mean (3/4, 1/4).
    eu = math.log(2) / 2
    total = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    u = decompose([[1.0, 0.0], [0.5, 0.5]])
    assert u.eu == pytest.approx(eu, abs=1e-12)
    assert u.total == pytest.approx(total, abs=1e-12)
    assert u.au == pytest.approx(total - eu, abs=1e-12)
    assert u.au == pytest.approx(0.21576155433883566, abs=1e-12)


def test_zero_probabilities_give_no_nan() -> None:
    u = decompose([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    assert all(math.isfinite(x) for x in (u.au, u.eu, u.total))
    assert u.au == pytest.approx(math.log(2))


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 6).flatmap(
        lambda k: st.integers(1, 8).flatmap(
            lambda c: st.lists(
                st.lists(st.floats(0.0, 1.0), min_size=c, max_size=c).filter(
                    lambda r: sum(r) > 1e-3
                ),
                min_size=k,
                max_size=k,
            )
        )
    )
)
def test_au_plus_eu_is_entropy_of_mean(rows: list[list[float]]) -> None:
    probs = np.asarray(rows) / np.asarray(rows).sum(axis=1, keepdims=True)
    u = decompose(probs)
    mean = probs.mean(axis=0)
    h_mean = -sum(p * math.log(p) for p in mean if p > 0)
    assert u.au + u.eu == pytest.approx(h_mean, abs=1e-9)
    assert u.total == pytest.approx(h_mean, abs=1e-9)
    assert 0.0 <= u.au <= math.log(len(rows)) + 1e-9  # mutual information is at most ln K
    assert u.eu >= 0.0


@pytest.mark.parametrize(
    ("probs", "match"),
    [
        ([0.5, 0.5], "shape"),
        (np.zeros((0, 3)), "shape"),
        ([[0.5, 0.4]], "sum to 1"),
        ([[1.5, -0.5]], "negative"),
        ([[float("nan"), 1.0]], "NaN"),
    ],
)
def test_bad_inputs_raise_clear_errors(probs, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        decompose(probs)


def test_softmax_over_candidates() -> None:
    probs = softmax_over_candidates([[0.0, math.log(3)], [-1000.0, -1000.0]])
    np.testing.assert_allclose(probs, [[0.25, 0.75], [0.5, 0.5]], rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="NaN or infinite"):
        softmax_over_candidates([[0.0, float("-inf")]])
