"""User-attention cost of a conversation, utility and asking efficiency (pure functions).

A conversation's cost A sums a per-request cost over the requests the agent delivered to the
user. Each request is a mapping with ``discretionary`` (bool), ``atomic_questions`` (int ≥ 0),
``reading_effort`` r ∈ [0, 20] (judge; higher = more effort) and ``value`` v ∈ [0, 10] (judge).
The sources name the accountings (ask-less paper, Table 13) but print no formula; prour uses,
with configurable weights (all 1 by default):

=============== ====================================================================
``messages``    Σ_disc w_msg
``atomic``      Σ_disc w_atomic · atomic(q)
``effort``      Σ_disc (w_msg + w_effort · r/20)
``full``        Σ_disc (w_msg + w_effort · r/20 + w_avoid · (1 − v/10))
``full+exempt`` the ``full`` sum taken over discretionary *and* exempt requests
=============== ====================================================================

Exempt (non-discretionary: answers/informs and policy-required requests) count only under
``full+exempt``. 1 − v/10 is the request's *avoidability*.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from prour.config.attention import CostWeights
from prour.core.cost import (  # noqa: F401 - a request's cost, importable from here as before
    ACCOUNTINGS,
    READING_EFFORT_MAX,
    VALUE_MAX,
    check_scores,
    request_cost,
    score_in_range,
)
from prour.core.reward import utility  # noqa: F401 - U = R − λ·A, importable from here as before


def conversation_cost(
    requests: Sequence[Mapping[str, Any]], accounting: str = "full",
    weights: CostWeights | None = None,
) -> float:
    """User-attention cost A of one conversation under one accounting (module docstring)."""
    if accounting not in ACCOUNTINGS:
        raise ValueError(f"unknown accounting {accounting!r}; valid: {', '.join(ACCOUNTINGS)}")
    weights = weights or CostWeights()
    return float(sum(request_cost(r, accounting, weights, i) for i, r in enumerate(requests)))


def asking_efficiency(reward: float, reward_no_ask: float, cost: float) -> float:
    """(R − R_no-ask) / A: reward gained per unit of attention cost.

    With A = 0 nothing was spent, so the ratio is undefined and the result is NaN (reports show
    it as "–" and aggregate efficiency from mean R and mean A instead). A < 0 raises.
    """
    if cost < 0:
        raise ValueError(f"cost must be >= 0, got {cost}")
    if cost == 0:
        return math.nan
    return float((reward - reward_no_ask) / cost)


def judged_values(requests: Sequence[Mapping[str, Any]]) -> list[float]:
    """The judged values v ∈ [0, 10] of the delivered discretionary requests."""
    values = []
    for i, request in enumerate(requests):
        check_scores(request, i)
        if request["discretionary"]:
            values.append(score_in_range(request, "value", i, VALUE_MAX))
    return values


def judged_value(requests: Sequence[Mapping[str, Any]]) -> float:
    """V: mean judged value of the discretionary requests (NaN when there are none)."""
    values = judged_values(requests)
    return float(sum(values) / len(values)) if values else math.nan


def discretionary_count(requests: Sequence[Mapping[str, Any]]) -> int:
    """Number of delivered discretionary requests (the quantity a budget N caps)."""
    return sum(1 for r in requests if r.get("discretionary") is True)
