"""Request classifier: strict JSON validated and retried, heuristic fallback, cache."""

from __future__ import annotations

import json

import pytest

from prour.eval.attention.classifier import (
    RequestClassifier,
    count_atomic_questions,
    heuristic_classify,
)
from prour.llm.scripted import ScriptedLLM
from prour.llm.strict_json import JsonCache


@pytest.mark.parametrize("text, expected", [
    ("Your refund of $54.20 has been issued to your gift card.", 0),
    ("Is there anything else I can help you with?", 0),
    ("Which size would you like, small or medium?", 1),
    ("Would you like to exchange or return the item?", 1),
    ("Could you provide your name and zip code?", 2),
    ("What is your order id, and what is the new address?", 2),
    ("I found the order. Please provide:\n- the item\n- the new color\n- the size", 3),
    ("Let me know your preferred color. Also, what is your email?", 2),
])
def test_heuristic_atomic_question_counts(text, expected):
    assert count_atomic_questions(text) == expected


def test_heuristic_labels():
    assert heuristic_classify("Done: the order is cancelled.").label == "answer"
    confirm = heuristic_classify("I will cancel order #W123. Shall I proceed (yes/no)?")
    assert (confirm.label, confirm.atomic_questions, confirm.source) == ("required", 1, "heuristic")
    auth = heuristic_classify("To verify your identity, please share your email.")
    assert auth.label == "required"
    bundled = heuristic_classify("Which color and which size do you want?")
    assert bundled.discretionary and bundled.bundled


def _json(label: str, count: int) -> str:
    return json.dumps({"label": label, "atomic_questions": count})


def test_llm_classification_retries_invalid_replies_with_feedback():
    llm = ScriptedLLM(replies=["label: discretionary", _json("answer", 2),
                               _json("discretionary", 2)])
    result = RequestClassifier(llm, "Authenticate users first.", 3).classify_one(
        "Which color and which size?", "user: I want to exchange a shirt.")
    assert (result.label, result.atomic_questions, result.source) == ("discretionary", 2, "llm")
    assert result.bundled
    assert llm.calls["chat"] == 3
    retry_prompt = llm.chat_log[-1].messages
    assert "rejected" in retry_prompt[-1]["content"]
    assert "atomic_questions must be 0" in retry_prompt[-1]["content"]


def test_llm_failure_falls_back_to_the_heuristic_and_says_so():
    llm = ScriptedLLM(default='{"label": "question"}')
    result = RequestClassifier(llm, "", 2).classify_one("What is your email?")
    assert (result.label, result.atomic_questions, result.source) == ("discretionary", 1,
                                                                     "heuristic")
    assert "llm failed" in result.error and "missing field(s) ['atomic_questions']" in result.error
    assert llm.calls["chat"] == 2


def test_batched_and_cached(tmp_path):
    llm = ScriptedLLM(rules=[(r"Message to label\]\nDone", _json("answer", 0)),
                             (r"Message to label\]\nWhich", _json("discretionary", 1))])
    cache = JsonCache(tmp_path / "classifier.jsonl")
    classifier = RequestClassifier(llm, "", 3, cache=cache)
    items = [("Done, the exchange is placed.", "ctx"), ("Which color?", "ctx")]
    labels = [r.label for r in classifier.classify(items)]
    assert labels == ["answer", "discretionary"]
    assert (llm.calls["chat"], llm.calls["chat_requests"]) == (1, 2)
    again = RequestClassifier(llm, "", 3, cache=JsonCache(tmp_path / "classifier.jsonl"))
    assert [r.label for r in again.classify(items)] == labels
    assert llm.calls["chat"] == 1  # served from the file cache


def test_without_a_model_the_heuristic_labels_everything():
    result = RequestClassifier(None, "", 3).classify_one(
        "Could you share the order id and the item?")
    assert (result.label, result.atomic_questions, result.error) == ("discretionary", 2, None)


# --- required (policy-demanded) versus discretionary: the eval probe's examples ---------------
# A request is exempt only when the domain policy demands it: identity details, or the explicit
# yes before an action that updates the database (tau2 retail / airline policies). A choice
# between options or a question about what the user wants is discretionary, even when it says
# "confirm", "proceed" or "go ahead" (issue 17, item 4; shared/evidence/eval-probe).

PREFERENCE_QUESTIONS = [  # probe_classifier.py and probe_budget_exempt.py
    "Which color would you like for the replacement?",
    "Would you like to proceed with the blue one or the red one?",
    "Can you confirm whether you want the refund on PayPal or on your original card?",
    "Should I go ahead with the exchange to the larger bottle, or return it instead?",
    "Do you prefer a battery-powered or a USB lamp?",
    "CLARIFY-Q2: would you like to proceed with the first option or the second?",
    "How would you like to proceed?",
    "Shall I proceed (yes/no)?",  # a go-ahead that names no change: nothing the policy demands
]
WRITE_CONFIRMATIONS = [
    "I will cancel order #W123. Shall I proceed (yes/no)?",
    "I will exchange both items. Shall I proceed (yes)?",
    "Here are the details:\n- cancel order #W1\n- refund to the gift card\nShall I proceed (yes/no)?",
    ("I'll change flight HAT170 to economy; $120 will be charged to your card. "
     "Do you want me to go ahead?"),
    "Please confirm (yes/no) that I should book the 10:00 flight to JFK for you.",
]


@pytest.mark.parametrize("text", PREFERENCE_QUESTIONS)
def test_heuristic_preference_questions_are_discretionary(text):
    found = heuristic_classify(text)
    assert (found.label, found.atomic_questions, found.exempt) == ("discretionary", 1, False)


@pytest.mark.parametrize("text", WRITE_CONFIRMATIONS)
def test_heuristic_write_confirmations_are_required(text):
    found = heuristic_classify(text)
    assert (found.label, found.atomic_questions, found.exempt) == ("required", 1, True)


def test_heuristic_confirmation_bundled_with_a_preference_is_discretionary():
    found = heuristic_classify("I will cancel order #W1. Shall I proceed (yes/no)? Also, which "
                               "refund method do you prefer?")
    assert (found.label, found.atomic_questions) == ("discretionary", 2)


def _gate(policy_name, budget, drafts):
    """Each draft through the attention gate with the heuristic classifier (no model)."""
    from prour.eval.attention.budget import FALLBACK_MESSAGE, AttentionGate
    from prour.eval.attention.policies import build_policy

    policy = build_policy(policy_name, RequestClassifier(None, "", 3), budget=budget)
    state = policy.new_state([])
    gate = AttentionGate(policy, max_redrafts=0)
    sent = []
    for draft in drafts:
        outcome = gate.submit(draft, state, None)
        sent.append(outcome.message)
        state.messages += [{"role": "assistant", "content": outcome.message},
                           {"role": "user", "content": "ok"}]
    return state, sent, FALLBACK_MESSAGE


@pytest.mark.parametrize("policy_name, budget, delivered_preferences",
                         [("budgeted", 1, 1), ("no-ask", None, 0), ("budgeted", 2, 2)])
def test_preference_questions_spend_budget_and_cost_confirmations_stay_exempt(
        policy_name, budget, delivered_preferences):
    from prour.eval.attention.analysis import cost_requests
    from prour.eval.attention.cost import conversation_cost
    from prour.rewards.judge import Judgment

    preference = PREFERENCE_QUESTIONS[5]  # the probe's "proceed with the first option or ..."
    confirmation = WRITE_CONFIRMATIONS[0]
    drafts = [preference, confirmation, PREFERENCE_QUESTIONS[1], confirmation]
    state, sent, fallback = _gate(policy_name, budget, drafts)
    # Budget: one unit per delivered preference question, none for the confirmations.
    assert state.budget.spent == delivered_preferences
    expected = [preference if delivered_preferences >= 1 else fallback, confirmation,
                PREFERENCE_QUESTIONS[1] if delivered_preferences >= 2 else fallback, confirmation]
    assert sent == expected
    assert [(d.text, d.discretionary) for d in state.delivered if not d.fallback] == \
        [(text, text != confirmation) for text in expected if text != fallback]
    # Cost: each delivered preference question costs w_msg + r/20 + (1 − v/10); the
    # confirmations cost nothing outside full+exempt (fallbacks are answers: no cost either).
    judgments = [Judgment(reading_effort=4.0, value=6.0) for _ in state.delivered]
    rows = cost_requests(state.delivered, judgments)
    per_question = 1.0 + 4.0 / 20 + (1 - 6.0 / 10)
    assert conversation_cost(rows, "full") == pytest.approx(delivered_preferences * per_question)
    assert conversation_cost(rows, "messages") == delivered_preferences
    assert conversation_cost(rows, "full+exempt") == pytest.approx(len(rows) * per_question)
