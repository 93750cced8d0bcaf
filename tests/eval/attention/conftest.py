"""A conversation grounded in a real tau2 task (retail test task 5) and scripted model helpers.

The tool results are produced by tau2's own retail environment for the task's reference calls;
the user's lines use only what the task lets the user know (name and zip code, two items to
exchange). The helper models answer the attention prompts from lookup tables so that each test
controls the label or verdict of every draft.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from prour.llm.scripted import ScriptedLLM

Message = dict[str, Any]


def _call(name: str, arguments: dict[str, Any], call_id: str) -> Message:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": call_id, "type": "function",
         "function": {"name": name, "arguments": json.dumps(arguments)}}]}


@pytest.fixture(scope="session")
def retail_task() -> dict[str, Any]:
    """Policy and an opening dialogue of retail test task 5, tool results from tau2 itself."""
    from prour.env.domains import domain_policy, get_task
    from prour.env.environment import execute_tool_call, make_env

    task = get_task("retail", "5")
    env = make_env("retail", task)
    reference = task.evaluation_criteria.actions
    find, details = reference[0], reference[1]
    messages: list[Message] = [
        {"role": "user", "content": "Hi, I want to exchange a couple of things I ordered."},
        {"role": "assistant", "content": "I can help. To verify your identity, could you share "
                                         "your email, or your first and last name and zip code?"},
        {"role": "user", "content": "I don't remember my email. I'm Mei Kovacs, zip code 28236."},
    ]
    for i, action in enumerate((find, details)):
        observation, error = execute_tool_call(env, action.name, action.arguments)
        assert not error, observation
        messages += [_call(action.name, action.arguments, f"call_{i}"),
                     {"role": "tool", "tool_call_id": f"call_{i}", "name": action.name,
                      "content": observation}]
    return {"task": task, "policy": domain_policy("retail"), "messages": messages}


def _section(text: str, title: str) -> str:
    match = re.search(rf"\[{re.escape(title)}\]\n(.*?)(?:\n\n\[|\Z)", text, re.DOTALL)
    return match.group(1) if match else ""


def last_user_text(messages: list[Message]) -> str:
    return next(m["content"] for m in messages if m["role"] == "user")


@pytest.fixture
def labelling_llm() -> Callable[[dict[str, tuple[str, int]]], ScriptedLLM]:
    """A scripted classifier: the first table key found in the message gives (label, count)."""

    def build(table: dict[str, tuple[str, int]]) -> ScriptedLLM:
        def answer(messages: list[Message]) -> str:
            message = _section(last_user_text(messages), "Message to label")
            for key, (label, count) in table.items():
                if key in message:
                    return json.dumps({"label": label, "atomic_questions": count})
            return json.dumps({"label": "answer", "atomic_questions": 0})

        return ScriptedLLM(rules=[(r"Message to label", answer)])

    return build


@pytest.fixture
def sections() -> Callable[[str, str], str]:
    return _section
