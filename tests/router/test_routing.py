"""AU-first routing at and around the thresholds, and the per-episode decomposer budget."""

from __future__ import annotations

import numpy as np
import pytest

from prour.router import DecomposerBudget, Uncertainty, route
from prour.router.routing import route_many

TAU_AU, TAU_EU = 0.25, 0.20
EPS = 1e-9


@pytest.mark.parametrize(
    ("au", "eu", "expected"),
    [
        (TAU_AU, 0.0, "clarify"),  # AU exactly at its threshold
        (TAU_AU + EPS, 0.9, "clarify"),  # AU first, whatever EU is
        (TAU_AU - EPS, TAU_EU, "verify"),  # EU exactly at its threshold
        (TAU_AU - EPS, TAU_EU + EPS, "verify"),
        (TAU_AU - EPS, TAU_EU - EPS, "act"),
        (0.0, 0.0, "act"),
    ],
)
def test_au_first_rule(au: float, eu: float, expected: str) -> None:
    assert route(Uncertainty(au=au, eu=eu, total=au + eu), TAU_AU, TAU_EU) == expected


def test_route_many_matches_route() -> None:
    rng = np.random.default_rng(0)
    au, eu = rng.uniform(0, 0.5, 300), rng.uniform(0, 0.5, 300)
    au[:3], eu[:3] = TAU_AU, TAU_EU  # include exact ties
    expected = [route(Uncertainty(a, e, a + e), TAU_AU, TAU_EU) for a, e in zip(au, eu)]
    assert route_many(au, eu, TAU_AU, TAU_EU).tolist() == expected


def test_budget_every_n_steps() -> None:
    budget = DecomposerBudget(max_calls=None, every_n=2)
    assert [budget.allow() for _ in range(5)] == [True, False, True, False, True]
    assert (budget.calls, budget.skipped) == (3, 2)


def test_budget_caps_calls_per_episode() -> None:
    budget = DecomposerBudget(max_calls=2, every_n=3)
    assert [budget.allow() for _ in range(9)] == [True, False, False, True] + [False] * 5
    assert budget.exhausted
    assert not any(DecomposerBudget(max_calls=0, every_n=1).allow() for _ in range(3))


def test_budget_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="every_n"):
        DecomposerBudget(max_calls=None, every_n=0)
