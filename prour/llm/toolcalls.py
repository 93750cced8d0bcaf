"""Qwen3-style tool calls ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``.

Parsing never raises: a block that cannot be read becomes a :class:`ToolCall` with ``error`` set,
so that the episode runner can hand it to the environment as an error observation.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_BLOCK = re.compile(re.escape(CALL_OPEN) + r"(.*?)" + re.escape(CALL_CLOSE), re.DOTALL)
_NAME_GUESS = re.compile(r'"name"\s*:\s*"([^"\\]*)"')


@dataclass(frozen=True)
class ToolCall:
    """One parsed tool call. ``error`` is set (and ``arguments`` may be empty) when malformed."""

    name: str
    arguments: dict[str, Any]
    id: str = ""
    raw: str = ""
    error: str | None = None


def _call_id(index: int, raw: str) -> str:
    """A deterministic call id from the block's position and text (reproducible trajectories)."""
    return f"call_{index}_{hashlib.sha1(raw.encode()).hexdigest()[:8]}"


def _malformed(index: int, raw: str, error: str) -> ToolCall:
    """A call that could not be read, with the best guess at its name."""
    match = _NAME_GUESS.search(raw)
    name = match.group(1) if match else ""
    return ToolCall(name=name, arguments={}, id=_call_id(index, raw), raw=raw, error=error)


def _read_arguments(value: Any) -> dict[str, Any] | None:
    """Arguments as a dict; a JSON-encoded object string is accepted; anything else is None."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    return value if isinstance(value, dict) else None


def parse_call(raw: str, index: int = 0) -> ToolCall:
    """Read the JSON inside one ``<tool_call>`` block (``raw`` is the text between the tags)."""
    body = raw.strip()
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        return _malformed(index, raw, f"tool call is not valid JSON: {exc.msg} at char {exc.pos}")
    if not isinstance(obj, dict):
        return _malformed(index, raw, f"tool call must be a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return _malformed(index, raw, 'tool call has no "name" string')
    arguments = _read_arguments(obj.get("arguments"))
    if arguments is None:
        kind = type(obj.get("arguments")).__name__
        return ToolCall(
            name=name,
            arguments={},
            id=_call_id(index, raw),
            raw=raw,
            error=f'tool call "arguments" must be a JSON object, got {kind}',
        )
    return ToolCall(name=name, arguments=arguments, id=_call_id(index, raw), raw=raw)


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """Split generated text into (content without the call blocks, parsed calls in order)."""
    calls: list[ToolCall] = []
    pieces: list[str] = []
    cursor = 0
    for match in _BLOCK.finditer(text):
        pieces.append(text[cursor : match.start()])
        calls.append(parse_call(match.group(1), len(calls)))
        cursor = match.end()
    rest = text[cursor:]
    open_at = rest.find(CALL_OPEN)
    if open_at >= 0:
        raw = rest[open_at + len(CALL_OPEN) :]
        calls.append(
            _malformed(len(calls), raw, "unclosed <tool_call> tag (generation cut short?)")
        )
        rest = rest[:open_at]
    pieces.append(rest)
    return "".join(pieces).strip(), calls


def split_thinking(text: str) -> tuple[str | None, str]:
    """Split off the ``<think>…</think>`` block: (reasoning or None, the text after it).

    A closing tag without an opening one (the opening tag was in the prompt) still ends the
    reasoning; an opening tag that is never closed makes everything reasoning and leaves no answer.
    """
    stripped = text.lstrip()
    close_at = stripped.find(THINK_CLOSE)
    if close_at >= 0:
        head = stripped[:close_at].removeprefix(THINK_OPEN)
        return head.strip(), stripped[close_at + len(THINK_CLOSE) :].lstrip()
    if stripped.startswith(THINK_OPEN):
        return stripped[len(THINK_OPEN) :].strip(), ""
    return None, text


def to_openai_tool_calls(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    """Calls in OpenAI message format (``arguments`` as a JSON string) for an assistant message."""
    return [
        {
            "id": call.id,
            "type": "function",
            "function": {
                "name": call.name,
                "arguments": json.dumps(call.arguments, ensure_ascii=False),
            },
        }
        for call in calls
    ]
