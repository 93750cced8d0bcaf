"""Self-review and memory-guided review (MGR) on a tau2-grounded conversation, scripted models."""

from __future__ import annotations

import json

import pytest

from prour.config.attention import AttentionConfig
from prour.eval.attention import AttentionGate, RequestClassifier, build_policy
from prour.eval.attention.classifier import count_atomic_questions
from prour.eval.attention.mgr import (
    SelfReviewer,
    answer_memory,
    approx_tokens,
    evidence_window,
    render_answer_memory,
    take_recent,
)
from prour.llm.scripted import ScriptedLLM

# The self-review settings of a default eval.attention section.
REVIEW = {"evidence_tokens": AttentionConfig().evidence_window_tokens,
          "memory_tokens": AttentionConfig().memory_window_tokens,
          "max_attempts": AttentionConfig().review_attempts}

LABELS = {"zip code": ("discretionary", 1), "Which color": ("discretionary", 1),
          "color and size": ("discretionary", 3), "Which power source": ("discretionary", 1)}
SINGLE_ASK = "Which power source do you prefer for the new desk lamp?"


def reviewer_llm(sections):
    """Reviews like a careful model would: block what memory or evidence already answers,
    replace a bundled draft by a single ask, approve the rest."""

    def review(messages):
        prompt = messages[1]["content"]
        known = sections(prompt, "What the customer has told the agent so far") + \
            sections(prompt, "Recent conversation")
        draft = sections(prompt, "Draft question")
        if "zip" in draft and "28236" in known:
            verdict = {"decision": "block", "question": "", "reason": "zip already given"}
        elif count_atomic_questions(draft) > 1:
            verdict = {"decision": "substitute", "question": SINGLE_ASK, "reason": "bundled"}
        else:
            verdict = {"decision": "approve", "question": "", "reason": "needed"}
        return json.dumps(verdict)

    return ScriptedLLM(rules=[(r"Draft question", review),
                              (r"short notes", "- name Mei Kovacs\n- zip code 28236")])


LATER_TURNS = [
    {"role": "assistant", "content": "Thanks, Mei, I found your account and your orders."},
    {"role": "user", "content": "It's the order with the water bottle and the desk lamp."},
    {"role": "assistant", "content": "Got it. Which item would you like to start with?"},
    {"role": "user", "content": "The water bottle. I want a bigger one."},
]


@pytest.fixture
def setup(retail_task, labelling_llm, sections):
    classifier = RequestClassifier(labelling_llm(LABELS), retail_task["policy"], 3)
    return retail_task["messages"] + LATER_TURNS, classifier, reviewer_llm(sections)


def test_mgr_blocks_a_question_answered_in_memory(setup, sections):
    messages, classifier, llm = setup
    policy = build_policy("budgeted+mgr", classifier, llm, budget=2,
                          **{**REVIEW, "evidence_tokens": 60})
    state = policy.new_state(messages)
    outcome = AttentionGate(policy, max_redrafts=0).submit(
        "What is the zip code on your account?", state)
    assert outcome.decisions[0].action.value == "block"
    assert state.budget.spent == 0 and state.reviews == 1
    prompt = llm.chat_log[-1].messages[1]["content"]
    # The zip code (user reply and tau2's user record) sits outside the 60-token evidence
    # window, which holds the latest turns; memory still holds the user's answer.
    evidence = sections(prompt, "Recent conversation")
    assert "bigger one" in evidence and "28236" not in evidence
    assert "28236" in sections(prompt, "What the customer has told the agent so far")


def test_review_without_memory_cannot_see_the_old_answer(setup, sections):
    messages, classifier, llm = setup
    policy = build_policy("budgeted+review", classifier, llm, budget=2,
                          **{**REVIEW, "evidence_tokens": 60})
    state = policy.new_state(messages)
    outcome = AttentionGate(policy, max_redrafts=1).submit(
        "What is the zip code on your account?", state)
    assert outcome.kind == "delivered" and state.budget.spent == 1
    prompt = llm.chat_log[-1].messages[1]["content"]
    assert sections(prompt, "What the customer has told the agent so far") == "(not available)"
    assert "bigger one" in sections(prompt, "Recent conversation")


def test_mgr_substitutes_a_bundled_question_with_a_single_ask(setup):
    messages, classifier, llm = setup
    policy = build_policy("budgeted+mgr", classifier, llm, budget=1, **REVIEW)
    state = policy.new_state(messages)
    draft = "Which color and size do you want for the bottle, and which power source?"
    outcome = AttentionGate(policy, max_redrafts=1).submit(draft, state)
    assert outcome.kind == "substituted" and outcome.message == SINGLE_ASK
    delivered = state.delivered[-1]
    assert delivered.substituted and delivered.draft == draft
    assert (delivered.label, delivered.atomic_questions) == ("discretionary", 1)
    assert state.budget.spent == 1


def test_summary_memory_is_written_once_per_dialogue_and_shown(setup, sections):
    messages, classifier, llm = setup
    policy = build_policy("budgeted+review+summary", classifier, llm, budget=3, **REVIEW)
    state = policy.new_state(messages)
    gate = AttentionGate(policy, max_redrafts=1)
    gate.submit("Which color do you want?", state)
    gate.submit("What is the zip code on your account?", state)
    summaries = [r for r in llm.chat_log if "short notes" in r.messages[0]["content"]]
    assert len(summaries) == 1  # same dialogue both times: cached
    prompt = llm.chat_log[-1].messages[1]["content"]
    assert sections(prompt, "What the customer has told the agent so far").startswith("- name")
    assert state.budget.spent == 1  # the second draft was blocked using the summary


def test_failed_review_lets_the_draft_through_and_says_so(retail_task):
    llm = ScriptedLLM(default='{"decision": "maybe", "question": "", "reason": ""}')
    reviewer = SelfReviewer(llm, "answers", **{**REVIEW, "max_attempts": 2})
    verdict = reviewer.review("Which color?", retail_task["messages"])
    assert verdict.failed and verdict.decision == "approve"
    assert "decision 'maybe' is not one of" in verdict.reason and llm.calls["chat"] == 2


def test_windows_are_bounded_by_hand():
    assert approx_tokens("abcd") == 1 and approx_tokens("abcde") == 2
    lines = ["a" * 8, "b" * 4, "c" * 4]  # 2 + 1, 1 + 1, 1 + 1 tokens with the newline
    assert take_recent(lines, 4) == ["b" * 4, "c" * 4]
    assert take_recent(lines, 7) == lines
    assert take_recent(lines, 1) == []
    messages = [{"role": "system", "content": "policy"},
                {"role": "user", "content": "I want to return an item."},
                {"role": "assistant", "content": "Which item?"},
                {"role": "user", "content": "The lamp."}]
    assert answer_memory(messages) == [
        'Customer: "I want to return an item."',
        'Agent: "Which item?" → Customer: "The lamp."']
    assert render_answer_memory(messages).splitlines()[0].endswith('"The lamp."')  # newest first
    assert render_answer_memory(messages, max_tokens=12).count("\n") == 0
    assert evidence_window(messages, max_tokens=5) == "user: The lamp."
    assert "policy" not in evidence_window(messages)
