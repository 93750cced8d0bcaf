"""LLM judge: effort/value mapping, validation, bounded retries, failures recorded, cache."""

from __future__ import annotations

import json

import pytest

from prour.eval.attention.analysis import ConversationRecord, cost_requests, method_rows
from prour.eval.attention.budget import DeliveredRequest
from prour.llm.scripted import ScriptedLLM
from prour.llm.strict_json import JsonCache
from prour.rewards.judge import RequestJudge, reading_effort_from_ratings

GOOD = {"goal_clarity": 5, "single_ask": 4, "answer_effort": 3, "actionability": 2,
        "conciseness": 1, "needed": True, "not_in_context": True, "not_lookup": True,
        "precise": True, "value": 8}


def reply(**changes) -> str:
    data = {**GOOD, **changes}
    for key in [k for k, v in changes.items() if v is None]:
        del data[key]
    return json.dumps(data)


def test_reading_effort_mapping_by_hand():
    # r = Σ (5 − s): 0 + 1 + 2 + 3 + 4 = 10
    assert reading_effort_from_ratings(GOOD) == 10.0
    assert reading_effort_from_ratings(dict.fromkeys(GOOD, 5)) == 0.0
    assert reading_effort_from_ratings(dict.fromkeys(GOOD, 1)) == 20.0


def test_valid_reply_is_scored():
    llm = ScriptedLLM(replies=[reply()])
    judgment = RequestJudge(llm, max_attempts=3).judge_one("Which size do you need?",
                                                           "user: exchange a shirt")
    assert (judgment.reading_effort, judgment.value, judgment.failed) == (10.0, 8.0, False)
    assert judgment.attempts == 1 and judgment.criteria["precise"] is True


def test_malformed_reply_is_retried_then_scored():
    llm = ScriptedLLM(replies=["The question is fine, 8/10.", "```json\n" + reply() + "\n```"])
    judgment = RequestJudge(llm, max_attempts=3).judge_one("Which size?")
    assert not judgment.failed and judgment.attempts == 2 and judgment.value == 8.0
    assert "not valid JSON" in llm.chat_log[1].messages[-1]["content"]


@pytest.mark.parametrize("bad, message", [
    (reply(goal_clarity=6), "goal_clarity=6 is outside [1, 5]"),
    (reply(value=11), "value=11 is outside [0, 10]"),
    (reply(conciseness=2.5), "conciseness=2.5 must be an integer"),
    (reply(needed="yes"), "needed='yes' must be true or false"),
    (reply(single_ask=None), "missing field(s) ['single_ask']"),
    (reply(comment="nice"), "unexpected field(s) ['comment']"),
    (reply(precise=False, value=9), "value=9 is high but ['precise'] do not hold"),
    ("[1, 2, 3]", "expected a JSON object, got list"),
    ("", "empty reply"),
])
def test_invalid_replies_are_retried_then_recorded_as_failed(bad, message):
    llm = ScriptedLLM(default=bad)
    judge = RequestJudge(llm, max_attempts=3)
    judgment = judge.judge_one("Which size?", "ctx")
    assert judgment.failed
    assert judgment.reading_effort is None and judgment.value is None
    assert judgment.attempts == 3 and llm.calls["chat"] == 3
    assert message in judgment.error
    # Failures are not cached: the next run asks again.
    judge.judge_one("Which size?", "ctx")
    assert llm.calls["chat"] == 6


def test_a_failed_judgment_is_never_silently_scored_downstream():
    llm = ScriptedLLM(rules=[(r"Request to judge\]\nWhich size", reply(goal_clarity=0))],
                      default=reply())
    delivered = [DeliveredRequest("Which size?", "discretionary", 1, True, "Which size?"),
                 DeliveredRequest("Which color?", "discretionary", 1, True, "Which color?")]
    judgments = RequestJudge(llm, max_attempts=2).judge([(d.text, "") for d in delivered])
    assert [j.failed for j in judgments] == [True, False]
    requests = cost_requests(delivered, judgments)
    assert requests[0]["reading_effort"] is None and "goal_clarity=0" in requests[0]["judge_error"]
    records = [ConversationRecord("budgeted@2", "m", "retail", "t1", 0, 1.0, requests),
               ConversationRecord("budgeted@2", "m", "retail", "t2", 0, 0.0, requests[1:])]
    row = method_rows(records, "full", 0.03)[0]
    assert row.unscored == 1 and row.conversations == 2
    assert row.cost == pytest.approx(1 + 10 / 20 + (1 - 8 / 10))  # only t2's conversation
    assert row.reward == pytest.approx(0.5)
    assert method_rows(records, "messages", 0.03)[0].unscored == 0  # no judge scores needed


def test_judgments_are_cached_by_request_and_context(tmp_path):
    llm = ScriptedLLM(default=reply())
    path = tmp_path / "judge.jsonl"
    judge = RequestJudge(llm, max_attempts=3, cache=JsonCache(path))
    first = judge.judge([("Which size?", "ctx A"), ("Which size?", "ctx B")])
    assert llm.calls["chat_requests"] == 2 and not first[0].cached
    fresh = RequestJudge(llm, max_attempts=3, cache=JsonCache(path))
    again = fresh.judge([("Which size?", "ctx A"), ("Which size?", "ctx B")])
    assert [j.cached for j in again] == [True, True]
    assert again[0].reading_effort == 10.0 and llm.calls["chat_requests"] == 2
    fresh.judge_one("Which size?", "ctx C")
    assert llm.calls["chat_requests"] == 3
