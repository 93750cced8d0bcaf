"""SAGE-Agent's structured uncertainty: belief, EVPI and aspect costs against hand computations."""

from __future__ import annotations

from collections import Counter

import pytest

from prour.eval.baselines.sage_agent import (
    TOOL_ASPECT,
    UNSET,
    aspect_values,
    belief,
    best_question,
    candidate,
    evpi,
    question_text,
    score_aspects,
)

A = candidate("cancel_pending_order", {"order_id": "#W1", "reason": "no longer needed"})
B = candidate("cancel_pending_order", {"order_id": "#W2", "reason": "no longer needed"})
C = candidate("cancel_pending_order", {"order_id": "#W1", "reason": "ordered by mistake"})
D = candidate("modify_pending_order_address", {"order_id": "#W1"})


def test_belief_is_the_empirical_frequency_of_distinct_calls() -> None:
    beliefs = belief([A, B, A, C, B])
    assert beliefs == {A: 0.4, B: 0.4, C: 0.2}
    assert candidate("t", {"x": {"b": 1, "a": 2}}) == candidate("t", {"x": {"a": 2, "b": 1}})


def test_evpi_by_hand() -> None:
    beliefs = belief([A, A, B, B, C])  # p = .4, .4, .2; acting now is right with .4
    # order_id: #W1 -> best .4 (A), #W2 -> .4 (B): .8 - .4
    assert evpi(beliefs, "order_id") == pytest.approx(0.4)
    # reason: "no longer needed" -> .4, "ordered by mistake" -> .2: .6 - .4
    assert evpi(beliefs, "reason") == pytest.approx(0.2)
    assert evpi(beliefs, TOOL_ASPECT) == pytest.approx(0.0)  # every candidate cancels


def test_evpi_equals_its_definition_as_expected_best_posterior() -> None:
    """Σ_v p(v) max_c p(c | v) - max_c p(c), computed from conditionals."""
    beliefs = belief([A, A, A, B, C, D, D])
    for aspect in (TOOL_ASPECT, "order_id", "reason"):
        values = {c.value(aspect) for c in beliefs}
        expected = 0.0
        for v in values:
            p_v = sum(p for c, p in beliefs.items() if c.value(aspect) == v)
            expected += p_v * max(p / p_v for c, p in beliefs.items() if c.value(aspect) == v)
        assert evpi(beliefs, aspect) == pytest.approx(expected - max(beliefs.values()))
    assert D.value("reason") == UNSET


def test_the_question_goes_to_the_best_net_aspect_and_repeats_cost_more() -> None:
    beliefs = belief([A, A, B, B, C])
    first = best_question(score_aspects(beliefs, Counter(), ask_cost=0.1, repeat_cost=1.0))
    assert first is not None and first.aspect == "order_id"
    assert first.net == pytest.approx(0.3)
    asked = Counter({"order_id": 1})
    second = best_question(score_aspects(beliefs, asked, ask_cost=0.1, repeat_cost=1.0))
    assert second is not None and second.aspect == "reason" and second.net == pytest.approx(0.1)
    assert best_question(score_aspects(beliefs, asked, ask_cost=0.25, repeat_cost=1.0)) is None


def test_agreeing_candidates_ask_nothing() -> None:
    assert best_question(score_aspects(belief([A, A, A]), Counter(), 0.0, 1.0)) is None


def test_the_question_names_the_aspect_and_its_values_most_probable_first() -> None:
    beliefs = belief([A, B, A, C])  # order_id mass: #W1 .75, #W2 .25
    assert aspect_values(beliefs, "order_id") == ['"#W1"', '"#W2"']
    assert question_text("order_id", aspect_values(beliefs, "order_id")) == (
        'Before I continue, could you tell me which order id you mean: "#W1", or "#W2"?')
    tools = aspect_values(belief([A, D, D]), TOOL_ASPECT)
    assert question_text(TOOL_ASPECT, tools) == (
        "Before I continue, could you tell me what you would like me to do: "
        '"modify pending order address", or "cancel pending order"?')
