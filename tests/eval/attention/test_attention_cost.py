"""Conversation cost under every accounting, utility and efficiency, on hand-computed examples."""

from __future__ import annotations

import math

import pytest

from prour.eval.attention.cost import (
    ACCOUNTINGS,
    CostWeights,
    asking_efficiency,
    conversation_cost,
    judged_value,
    utility,
)

# Two discretionary requests and one exempt (policy-required) one.
CONVERSATION = [
    {"discretionary": True, "atomic_questions": 2, "reading_effort": 10, "value": 8},
    {"discretionary": True, "atomic_questions": 1, "reading_effort": 0, "value": 10},
    {"discretionary": False, "atomic_questions": 1, "reading_effort": 4, "value": 5},
]


@pytest.mark.parametrize("accounting, expected", [
    ("messages", 2.0),                        # 1 + 1
    ("atomic", 3.0),                          # 2 + 1
    ("effort", 2.5),                          # (1 + 10/20) + (1 + 0)
    ("full", 2.7),                            # (1 + 0.5 + 0.2) + (1 + 0 + 0)
    ("full+exempt", 4.4),                     # 2.7 + (1 + 4/20 + 0.5)
])
def test_every_accounting_by_hand(accounting, expected):
    assert conversation_cost(CONVERSATION, accounting) == pytest.approx(expected)


@pytest.mark.parametrize("accounting, expected", [
    ("messages", 4.0),                        # 2 + 2
    ("atomic", 4.5),                          # 1.5 · (2 + 1)
    ("effort", 4.25),                         # (2 + 0.5·0.5) + (2 + 0)
    ("full", 4.85),                           # 4.25 + 3·0.2 + 3·0
    ("full+exempt", 8.45),                    # 4.85 + (2 + 0.5·0.2 + 3·0.5)
])
def test_every_accounting_with_weights(accounting, expected):
    weights = CostWeights(message=2.0, atomic=1.5, effort=0.5, avoidability=3.0)
    assert conversation_cost(CONVERSATION, accounting, weights) == pytest.approx(expected)


def test_exempt_only_conversation_costs_nothing_except_under_full_plus_exempt():
    exempt = [{"discretionary": False, "atomic_questions": 1, "reading_effort": 20, "value": 0}]
    for accounting in ACCOUNTINGS[:-1]:
        assert conversation_cost(exempt, accounting) == 0.0
    assert conversation_cost(exempt, "full+exempt") == pytest.approx(1 + 1 + 1)
    assert conversation_cost([], "full") == 0.0


def test_utility_efficiency_and_value():
    cost = conversation_cost(CONVERSATION, "full")
    assert utility(1.0, cost, lam=0.03) == pytest.approx(1.0 - 0.03 * 2.7)
    assert utility(0.5, cost, lam=0.1) == pytest.approx(0.5 - 0.27)
    assert asking_efficiency(1.0, 0.4, cost) == pytest.approx(0.6 / 2.7)
    assert asking_efficiency(0.2, 0.4, 2.0) == pytest.approx(-0.1)
    assert math.isnan(asking_efficiency(0.5, 0.5, 0.0))  # nothing spent: undefined
    assert judged_value(CONVERSATION) == pytest.approx(9.0)  # exempt value not included
    assert math.isnan(judged_value(CONVERSATION[2:]))
    with pytest.raises(ValueError, match="lam"):
        utility(1.0, 1.0, lam=-0.1)


@pytest.mark.parametrize("field, value, pattern", [
    ("reading_effort", 21, r"request 1: reading_effort=21 is outside \[0, 20\]"),
    ("reading_effort", -0.5, r"request 1: reading_effort=-0.5 is outside"),
    ("value", 10.5, r"request 1: value=10.5 is outside \[0, 10\]"),
    ("value", float("nan"), r"request 1: value=nan"),
    ("atomic_questions", -1, r"request 1: atomic_questions=-1 must be an integer"),
    ("discretionary", "yes", r"request 1: discretionary='yes' must be a bool"),
    ("reading_effort", True, r"request 1: reading_effort=True is not a number"),
])
def test_out_of_range_scores_raise_naming_field_value_and_index(field, value, pattern):
    bad = [dict(r) for r in CONVERSATION]
    bad[1][field] = value
    for accounting in ACCOUNTINGS:  # checked whichever accounting is asked for
        with pytest.raises(ValueError, match=pattern):
            conversation_cost(bad, accounting)


def test_missing_scores_only_matter_where_the_accounting_needs_them():
    unjudged = [{"discretionary": True, "atomic_questions": 1}]
    assert conversation_cost(unjudged, "messages") == 1.0
    assert conversation_cost(unjudged, "atomic") == 1.0
    with pytest.raises(ValueError, match="request 0: missing 'reading_effort'"):
        conversation_cost(unjudged, "effort")
    with pytest.raises(ValueError, match="unknown accounting 'ful'; valid: messages, atomic, "
                                         "effort, full, full\\+exempt"):
        conversation_cost(unjudged, "ful")
    with pytest.raises(ValueError, match=r"CostWeights\neffort\n  Input should be greater than or equal to 0"):
        CostWeights(effort=-1.0)
