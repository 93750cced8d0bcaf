"""Request classifier: strict JSON validated and retried, heuristic fallback, cache."""

from __future__ import annotations

import json

import pytest

from prour.eval.attention.classifier import (
    RequestClassifier,
    count_atomic_questions,
    heuristic_classify,
)
from prour.eval.attention.strict_json import JsonCache
from prour.llm.scripted import ScriptedLLM


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
    result = RequestClassifier(llm, policy="Authenticate users first.").classify_one(
        "Which color and which size?", "user: I want to exchange a shirt.")
    assert (result.label, result.atomic_questions, result.source) == ("discretionary", 2, "llm")
    assert result.bundled
    assert llm.calls["chat"] == 3
    retry_prompt = llm.chat_log[-1].messages
    assert "rejected" in retry_prompt[-1]["content"]
    assert "atomic_questions must be 0" in retry_prompt[-1]["content"]


def test_llm_failure_falls_back_to_the_heuristic_and_says_so():
    llm = ScriptedLLM(default='{"label": "question"}')
    result = RequestClassifier(llm, max_attempts=2).classify_one("What is your email?")
    assert (result.label, result.atomic_questions, result.source) == ("discretionary", 1,
                                                                     "heuristic")
    assert "llm failed" in result.error and "missing field(s) ['atomic_questions']" in result.error
    assert llm.calls["chat"] == 2


def test_batched_and_cached(tmp_path):
    llm = ScriptedLLM(rules=[(r"Message to label\]\nDone", _json("answer", 0)),
                             (r"Message to label\]\nWhich", _json("discretionary", 1))])
    cache = JsonCache(tmp_path / "classifier.jsonl")
    classifier = RequestClassifier(llm, cache=cache)
    items = [("Done, the exchange is placed.", "ctx"), ("Which color?", "ctx")]
    labels = [r.label for r in classifier.classify(items)]
    assert labels == ["answer", "discretionary"]
    assert (llm.calls["chat"], llm.calls["chat_requests"]) == (1, 2)
    again = RequestClassifier(llm, cache=JsonCache(tmp_path / "classifier.jsonl"))
    assert [r.label for r in again.classify(items)] == labels
    assert llm.calls["chat"] == 1  # served from the file cache


def test_without_a_model_the_heuristic_labels_everything():
    result = RequestClassifier(None).classify_one("Could you share the order id and the item?")
    assert (result.label, result.atomic_questions, result.error) == ("discretionary", 2, None)
