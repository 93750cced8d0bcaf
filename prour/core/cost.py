"""User-attention cost of one request the agent delivers to the user (pure arithmetic).

A request is a mapping with ``discretionary`` (bool), ``atomic_questions`` (int ≥ 0),
``reading_effort`` r ∈ [0, 20] (judge; higher = more effort) and ``value`` v ∈ [0, 10] (judge).
The sources name the accountings (ask-less paper, Table 13) but print no formula; prour uses,
with configurable weights (all 1 by default), per discretionary request:

=============== ====================================================================
``messages``    w_msg
``atomic``      w_atomic · atomic(q)
``effort``      w_msg + w_effort · r/20
``full``        w_msg + w_effort · r/20 + w_avoid · (1 − v/10)
``full+exempt`` the ``full`` cost, charged to exempt requests too
=============== ====================================================================

Exempt (non-discretionary: answers/informs and policy-required requests) cost only under
``full+exempt``. 1 − v/10 is the request's *avoidability*. A conversation's cost A is the sum
(:func:`prour.eval.attention.cost.conversation_cost`); the attention-aware training reward
charges each clarify question its own cost.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from prour.config.attention import CostWeights

ACCOUNTINGS = ("messages", "atomic", "effort", "full", "full+exempt")
READING_EFFORT_MAX = 20.0
VALUE_MAX = 10.0


def score_in_range(request: Mapping[str, Any], field: str, index: int, high: float) -> float:
    """The field as a float in [0, high]; raise naming field, value and request index."""
    if field not in request or request[field] is None:
        raise ValueError(f"request {index}: missing {field!r} (needed by this accounting)")
    value = request[field]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"request {index}: {field}={value!r} is not a number")  # noqa: TRY004
    if not (math.isfinite(value) and 0.0 <= value <= high):
        raise ValueError(f"request {index}: {field}={value!r} is outside [0, {high:g}]")
    return float(value)


def atomic_count(request: Mapping[str, Any], index: int) -> int:
    value = request.get("atomic_questions")
    if value is None:
        raise ValueError(f"request {index}: missing 'atomic_questions' (needed by this accounting)")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"request {index}: atomic_questions={value!r} must be an integer >= 0")
    return value


def check_scores(request: Mapping[str, Any], index: int) -> None:
    """Range-check every score present, whether or not this accounting uses it."""
    flag = request.get("discretionary")
    if not isinstance(flag, bool):
        raise ValueError(f"request {index}: discretionary={flag!r} must be a bool")  # noqa: TRY004
    if request.get("reading_effort") is not None:
        score_in_range(request, "reading_effort", index, READING_EFFORT_MAX)
    if request.get("value") is not None:
        score_in_range(request, "value", index, VALUE_MAX)
    if request.get("atomic_questions") is not None:
        atomic_count(request, index)


def request_cost(request: Mapping[str, Any], accounting: str, weights: CostWeights,
                 index: int = 0) -> float:
    """Cost of one request under ``accounting`` (0 for exempt requests unless full+exempt)."""
    check_scores(request, index)
    if not request["discretionary"] and accounting != "full+exempt":
        return 0.0
    if accounting == "messages":
        return weights.message
    if accounting == "atomic":
        return weights.atomic * atomic_count(request, index)
    effort = weights.effort * score_in_range(request, "reading_effort", index, READING_EFFORT_MAX) / 20
    if accounting == "effort":
        return weights.message + effort
    avoid = weights.avoidability * (1.0 - score_in_range(request, "value", index, VALUE_MAX) / 10)
    return weights.message + effort + avoid
