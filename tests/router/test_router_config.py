"""The router recipe section: defaults from the paper, checks that name the problem."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from prour.router import RouterConfig
from prour.router.routing import episode_budget


def test_defaults_follow_the_paper() -> None:
    cfg = RouterConfig()
    assert (cfg.n_interpretations, cfg.n_actions) == (5, 4)
    assert (cfg.calibration.lo, cfg.calibration.hi, cfg.calibration.step) == (0.0, 0.8, 0.01)
    assert cfg.empty_route == "act" and cfg.every_n == 1 and cfg.budget is None
    budget = episode_budget(RouterConfig(budget=1, every_n=2))
    assert [budget.allow() for _ in range(3)] == [True, False, False]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tau_au": 0.2}, "both tau_au and tau_eu"),
        ({"n_actions": 0}, "n_actions"),
        ({"empty_route": "ask"}, "empty_route"),
        ({"calibration": {"lo": 0.5, "hi": 0.4}}, "greater than lo"),
        ({"k": 5}, "Extra inputs"),
    ],
)
def test_bad_values_are_rejected(kwargs: dict, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        RouterConfig(**kwargs)
