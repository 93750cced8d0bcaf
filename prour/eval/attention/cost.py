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

ACCOUNTINGS = ("messages", "atomic", "effort", "full", "full+exempt")
READING_EFFORT_MAX = 20.0
VALUE_MAX = 10.0


def _number(request: Mapping[str, Any], field: str, index: int, high: float) -> float:
    """The field as a float in [0, high]; raise naming field, value and request index."""
    if field not in request or request[field] is None:
        raise ValueError(f"request {index}: missing {field!r} (needed by this accounting)")
    value = request[field]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"request {index}: {field}={value!r} is not a number")  # noqa: TRY004
    if not (math.isfinite(value) and 0.0 <= value <= high):
        raise ValueError(f"request {index}: {field}={value!r} is outside [0, {high:g}]")
    return float(value)


def _atomic(request: Mapping[str, Any], index: int) -> int:
    value = request.get("atomic_questions")
    if value is None:
        raise ValueError(f"request {index}: missing 'atomic_questions' (needed by this accounting)")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"request {index}: atomic_questions={value!r} must be an integer >= 0")
    return value


def _check_present(request: Mapping[str, Any], index: int) -> None:
    """Range-check every score present, whether or not this accounting uses it."""
    flag = request.get("discretionary")
    if not isinstance(flag, bool):
        raise ValueError(f"request {index}: discretionary={flag!r} must be a bool")  # noqa: TRY004
    if request.get("reading_effort") is not None:
        _number(request, "reading_effort", index, READING_EFFORT_MAX)
    if request.get("value") is not None:
        _number(request, "value", index, VALUE_MAX)
    if request.get("atomic_questions") is not None:
        _atomic(request, index)


def request_cost(request: Mapping[str, Any], accounting: str, weights: CostWeights,
                 index: int = 0) -> float:
    """Cost of one request under ``accounting`` (0 for exempt requests unless full+exempt)."""
    _check_present(request, index)
    if not request["discretionary"] and accounting != "full+exempt":
        return 0.0
    if accounting == "messages":
        return weights.message
    if accounting == "atomic":
        return weights.atomic * _atomic(request, index)
    effort = weights.effort * _number(request, "reading_effort", index, READING_EFFORT_MAX) / 20
    if accounting == "effort":
        return weights.message + effort
    avoid = weights.avoidability * (1.0 - _number(request, "value", index, VALUE_MAX) / 10)
    return weights.message + effort + avoid


def conversation_cost(
    requests: Sequence[Mapping[str, Any]], accounting: str = "full",
    weights: CostWeights | None = None,
) -> float:
    """User-attention cost A of one conversation under one accounting (module docstring)."""
    if accounting not in ACCOUNTINGS:
        raise ValueError(f"unknown accounting {accounting!r}; valid: {', '.join(ACCOUNTINGS)}")
    weights = weights or CostWeights()
    return float(sum(request_cost(r, accounting, weights, i) for i, r in enumerate(requests)))


def utility(reward: float, cost: float, lam: float) -> float:
    """U = R − λ·A: task reward minus the priced attention cost."""
    if not (math.isfinite(lam) and lam >= 0):
        raise ValueError(f"lam must be a finite number >= 0, got {lam}")
    if cost < 0:
        raise ValueError(f"cost must be >= 0, got {cost}")
    return float(reward - lam * cost)


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
        _check_present(request, i)
        if request["discretionary"]:
            values.append(_number(request, "value", i, VALUE_MAX))
    return values


def judged_value(requests: Sequence[Mapping[str, Any]]) -> float:
    """V: mean judged value of the discretionary requests (NaN when there are none)."""
    values = judged_values(requests)
    return float(sum(values) / len(values)) if values else math.nan


def discretionary_count(requests: Sequence[Mapping[str, Any]]) -> int:
    """Number of delivered discretionary requests (the quantity a budget N caps)."""
    return sum(1 for r in requests if r.get("discretionary") is True)
