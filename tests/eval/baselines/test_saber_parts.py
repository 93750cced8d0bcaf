"""SABER's parts: tau2's WRITE tools as the mutating set, context cleaning, the review's JSON."""

from __future__ import annotations

import json

import pytest

from prour.config import EnvConfig
from prour.eval.baselines.saber import (
    OLD_ERROR,
    STALE_RESULT,
    clean_context,
    confirmation_text,
    read_verdict,
)
from prour.llm.base import SamplingParams, ToolCall


def _saber(replies: list[str], **settings: bool):
    from prour.config.eval import SaberConfig
    from prour.env.agents import LLMAgent, TaskView
    from prour.env.domains import domain_policy
    from prour.eval.baselines.saber import SaberAgent
    from prour.llm.scripted import ScriptedLLM

    llm = ScriptedLLM(replies=replies)
    agent = SaberAgent(LLMAgent(llm, EnvConfig()), llm, SamplingParams(temperature=0.0), SaberConfig(**settings))
    agent.reset("retail", TaskView("retail", "5", domain_policy("retail")))
    return agent, llm


CANCEL = ('<tool_call>{"name": "cancel_pending_order", "arguments": '
          '{"order_id": "#W1", "reason": "no longer needed"}}</tool_call>')


def test_the_gate_guards_exactly_taus_write_tools() -> None:
    from tau2.environment.toolkit import ToolType

    from prour.env.agents import TaskView
    from prour.env.environment import new_environment

    agent, _ = _saber([])
    for domain in ("retail", "airline"):
        tools = new_environment(domain).tools
        writes = {n for n in tools.get_tools() if tools.tool_type(n) == ToolType.WRITE}
        agent.reset(domain, TaskView(domain, "0", "policy"))
        assert agent.writes == writes
    assert "book_reservation" in agent.writes and "get_reservation_details" not in agent.writes


def _call(call_id: str, name: str, **arguments: str) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [{
        "id": call_id, "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)}}]}


def _result(call_id: str, name: str, content: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


def test_context_cleaning_stubs_superseded_results_and_old_errors_only() -> None:
    messages = [
        {"role": "system", "content": "policy"},
        {"role": "user", "content": "Cancel order #W1."},
        _call("c0", "get_order_details", order_id="#W1"),
        _result("c0", "get_order_details", '{"status": "pending"}'),
        _call("c1", "get_order_details", order_id="#W9"),
        _result("c1", "get_order_details", "Error: order not found"),
        {"role": "user", "content": "Sorry, #W2 as well."},
        _call("c2", "get_order_details", order_id="#W2"),
        _result("c2", "get_order_details", "Error: temporary failure"),
        _call("c3", "get_order_details", order_id="#W1"),
        _result("c3", "get_order_details", '{"status": "cancelled"}'),
    ]
    cleaned, count = clean_context(messages)
    assert count == 2
    assert cleaned[3]["content"] == STALE_RESULT  # #W1 read again later
    assert cleaned[5]["content"] == OLD_ERROR  # an error before the latest user message
    assert cleaned[8]["content"] == "Error: temporary failure"  # this block's error stays
    assert cleaned[10]["content"] == '{"status": "cancelled"}'
    assert [m.get("tool_call_id") for m in cleaned] == [m.get("tool_call_id") for m in messages]
    assert messages[3]["content"] == '{"status": "pending"}'  # the transcript is not touched


def test_confirmation_lists_every_mutating_call_with_its_arguments() -> None:
    text = confirmation_text([ToolCall("cancel_pending_order",
                                       {"order_id": "#W1", "reason": "no longer needed"})])
    assert text == ("Before I make this change, please confirm that I should do the following:\n"
                    '- cancel pending order (order_id: "#W1", reason: "no longer needed")\n'
                    "Shall I go ahead? (yes/no)")


@pytest.mark.parametrize(("data", "expected"), [
    ({"verdict": "proceed"}, {"verdict": "proceed", "issue": ""}),
    ({"verdict": "revise", "issue": " Check the order first. "},
     {"verdict": "revise", "issue": "Check the order first."}),
])
def test_review_verdicts(data: dict, expected: dict) -> None:
    assert read_verdict(data) == expected


@pytest.mark.parametrize("data", [{"verdict": "revise"}, {"verdict": "maybe"},
                                  {"verdict": "proceed", "why": "x"}])
def test_invalid_reviews_are_rejected(data: dict) -> None:
    with pytest.raises(ValueError):
        read_verdict(data)


def test_the_task_agent_sees_the_cleaned_context() -> None:
    agent, llm = _saber(["Let me check."])
    messages = [{"role": "system", "content": "policy"}, {"role": "user", "content": "Hi"},
                _call("c0", "get_order_details", order_id="#W1"),
                _result("c0", "get_order_details", "first"),
                _call("c1", "get_order_details", order_id="#W1"),
                _result("c1", "get_order_details", "second")]
    turn = agent.act(messages, [])
    assert turn.meta["turn"] == "act" and turn.meta["decision"]["cleaned"] == 1
    seen = llm.chat_log[0].messages
    assert [m["content"] for m in seen if m["role"] == "tool"] == [STALE_RESULT, "second"]


def test_one_consent_allows_one_execution() -> None:
    agent, llm = _saber([CANCEL] * 3, reflection=False)
    history = [{"role": "system", "content": "policy"}, {"role": "user", "content": "Cancel #W1"}]
    asked = agent.act(history, [])
    assert asked.meta["turn"] == "confirm" and not asked.tool_calls
    done = agent.act([*history, {"role": "assistant", "content": asked.content},
                      {"role": "user", "content": "yes"}], [])
    assert done.meta["decision"]["gate"] == "confirmed"
    assert [c.name for c in done.tool_calls] == ["cancel_pending_order"]
    again = agent.act(history, [])  # the same write proposed once more needs a new yes
    assert again.meta["turn"] == "confirm"
    assert llm.calls["chat"] == 3  # reflection off: the task agent's three proposals only


def test_an_invalid_review_lets_the_gate_ask_and_is_recorded() -> None:
    agent, _ = _saber([CANCEL, "I think it is fine."])  # the agent's proposal, then the review
    history = [{"role": "system", "content": "policy"}, {"role": "user", "content": "Cancel #W1"}]
    turn = agent.act(history, [])
    assert turn.meta["turn"] == "confirm"
    review = turn.meta["decision"]["reflection"]
    assert review["verdict"] == "proceed" and review["valid"] is False
    assert "not valid JSON" in review["error"]
