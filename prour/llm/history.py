"""Plain-text rendering of a dialogue for the prompts of the decomposer, query generator,
responders and belief scorer.

Input is an OpenAI-format message list (what the episode runner records). The system prompt
(domain policy) is left out unless asked for: those prompts carry the policy separately where
they need it. Tool calls and observations are shown verbatim so that ids and values survive.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from prour.llm.base import Message


def _call_text(call: dict[str, Any]) -> str:
    fn = call.get("function", call)
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return f"{fn.get('name', '?')}({args})"
    return f"{fn.get('name', '?')}({json.dumps(args, sort_keys=True, ensure_ascii=False)})"


def render_message(message: Message) -> list[str]:
    """Lines for one message: ``role: text``; tool calls and results get their own lines."""
    role = message.get("role", "?")
    content = message.get("content") or ""
    if not isinstance(content, str):
        content = json.dumps(content, ensure_ascii=False)
    lines: list[str] = []
    if role == "tool":
        name = message.get("name") or "tool"
        return [f"tool {name} returned: {content}"]
    if content.strip():
        lines.append(f"{role}: {content.strip()}")
    for call in message.get("tool_calls") or []:
        lines.append(f"{role} calls tool: {_call_text(call)}")
    return lines


def render_history(
    messages: Sequence[Message] | Iterable[Message], include_system: bool = False
) -> str:
    """The dialogue as numbered-free plain text, one line per utterance, tool call or result."""
    lines: list[str] = []
    for message in messages:
        if message.get("role") == "system" and not include_system:
            continue
        lines.extend(render_message(message))
    return "\n".join(lines)
