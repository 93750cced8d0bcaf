"""The inferred turn-tag rule (prour.eval.tags) on hand-built retail and telecom trajectories,
with tau2's own tool types of those domains."""

from __future__ import annotations

import json

from prour.env.trajectory import StepRecord, Trajectory
from prour.eval.tags import asks_something, tag_counts, turn_tags


def _call(name: str, number: int) -> dict:
    return {"id": f"c{number}", "type": "function",
            "function": {"name": name, "arguments": json.dumps({})}}


def _trajectory(domain: str, turns: list[tuple[str, object]]) -> Trajectory:
    """``turns``: (kind, content) in order; an agent tool call's content is its tool names."""
    traj = Trajectory(domain=domain, task_id="0", agent="a", user="u")
    traj.messages.append({"role": "system", "content": "policy"})
    number = 0
    for kind, content in turns:
        meta = {}
        if kind == "greeting":
            kind, meta = "agent_message", {"greeting": True}
        if kind in ("agent_tool_call", "user_tool_call"):
            calls = [_call(name, number + i) for i, name in enumerate(content)]
            number += len(calls)
            role = "assistant" if kind == "agent_tool_call" else "user"
            message = {"role": role, "content": "", "tool_calls": calls}
        elif kind == "tool_result":
            message = {"role": "tool", "tool_call_id": "x", "content": "{}"}
        else:
            message = {"role": "assistant" if kind == "agent_message" else "user",
                       "content": content}
        traj.messages.append(message)
        traj.steps.append(StepRecord(kind=kind, message_index=len(traj.messages) - 1, meta=meta))
    return traj


def test_each_agent_turn_gets_the_first_matching_tag() -> None:
    traj = _trajectory("retail", [
        ("greeting", "Hi! How can I help you today?"),  # not a turn
        ("user_message", "I want to return something. Can you help?"),  # the user's: not a turn
        ("agent_message", "Could you tell me your email address?"),
        ("user_message", "it is a@b.c"),
        ("agent_tool_call", ["find_user_id_by_email"]),  # READ
        ("tool_result", None),
        ("agent_tool_call", ["get_order_details", "return_delivered_order_items"]),  # READ+WRITE
        ("tool_result", None),
        ("agent_message", "See https://shop.example/order?id=7 for the label."),  # no question
        ("agent_message", "I will return item 1 (shall I?) and refund to your card."),
        ("agent_tool_call", ["calculate"]),  # GENERIC
        ("agent_tool_call", ["no_such_tool"]),
        ("agent_message", "Done. Your return is filed"),
    ])
    assert turn_tags(traj) == ["question", "lookup", "write", "reply", "question", "reply",
                               "reply", "reply"]
    assert tag_counts(turn_tags(traj)) == {"question": 2, "lookup": 1, "write": 1, "reply": 4}


def test_telecom_user_tool_calls_are_not_agent_turns() -> None:
    traj = _trajectory("telecom", [
        ("agent_tool_call", ["get_customer_by_phone"]),
        ("tool_result", None),
        ("user_tool_call", ["toggle_airplane_mode"]),  # a WRITE tool of the user's device
        ("tool_result", None),
        ("agent_tool_call", ["enable_roaming"]),
        ("agent_tool_call", ["transfer_to_human_agents"]),
    ])
    assert turn_tags(traj) == ["lookup", "write", "reply"]


def test_question_marks_end_sentences() -> None:
    assert asks_something('You said "the blue one?" Yes')
    assert asks_something("Which order?\nThe first?")
    assert not asks_something("order?id=3")
    assert not asks_something(None)
