"""Left truncation of a state's history to the query-generator prompt budget (paper A.2.1).

The budget counts the tokens of the whole prompt (template, history and generation prompt) with
the policy's tokenizer and chat template. Oldest turns go first; system messages stay; a tool
result leaves together with the assistant turn that called it, so a kept result always has its
call.

If the newest turn alone is still too long, it is kept whole except for its tool results (or,
for a turn without results, its own text), each cut to its *head* followed by the marker
``[… truncated N characters …]`` (N: the characters left out), with the longest head that fits
(one cap for all results of the turn). The head, because tau2 tool results are JSON objects
that open with their identifying fields (``order_id``, ``user_id``, ``name``, ``product_id`` …)
and put long lists (items, variants, payment history) after them: the head says what the result
is about, a tail would be a fragment of a list with no subject. The marker tells the reader that
the text is an excerpt and how much of it is missing. The dataset card counts the rows whose
newest turn is such an excerpt (:func:`is_excerpt`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prour.llm.base import Message

EXCERPT_MARK = "[… truncated {n} characters …]"
"""Ends an excerpt of a message's text; ``n`` is the number of characters left out."""
_MARK_AT_END = re.compile(r"\[… truncated \d+ characters …\]\Z")
CountTokens = Callable[[list[Message]], int]
"""Tokens of the full prompt built around these history messages."""


@dataclass
class Truncation:
    """The history that fits, whether anything was cut, how many messages left, prompt tokens,
    and whether the newest turn had to be excerpted."""

    messages: list[Message]
    truncated: bool
    dropped: int
    tokens: int
    excerpted: bool = False


class PolicyTokens:
    """Token counts with the policy's tokenizer and chat template (thinking as in training)."""

    def __init__(self, tokenizer_path: str | Path, enable_thinking: bool = True):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path))
        self.enable_thinking = enable_thinking

    def chat(self, messages: Sequence[Message]) -> int:
        """Tokens of ``messages`` rendered with the generation prompt."""
        ids: Any = self.tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=True, tokenize=True,
            enable_thinking=self.enable_thinking,
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return len(ids)

    def text(self, text: str) -> int:
        """Tokens of plain text (no special tokens): the length of a reward target."""
        return len(self.tokenizer.encode(text, add_special_tokens=False))


def turn_groups(history: Sequence[Message]) -> tuple[list[Message], list[list[Message]]]:
    """System messages, and the other messages grouped so a tool result stays with its call."""
    system = [m for m in history if m.get("role") == "system"]
    groups: list[list[Message]] = []
    for message in history:
        if message.get("role") == "system":
            continue
        if message.get("role") == "tool" and groups:
            groups[-1].append(message)
        else:
            groups.append([message])
    return system, groups


def _flatten(system: list[Message], groups: Sequence[list[Message]]) -> list[Message]:
    return system + [m for group in groups for m in group]


def excerpt(text: str, keep: int) -> str:
    """The first ``keep`` characters of ``text`` and the marker; ``text`` itself when it is short."""
    if keep >= len(text):
        return text
    return text[:keep] + EXCERPT_MARK.format(n=len(text) - keep)


def is_excerpt(message: Message) -> bool:
    """Whether a message's text is an excerpt made by truncation (ends with the marker)."""
    content = message.get("content")
    return isinstance(content, str) and _MARK_AT_END.search(content) is not None


def _excerpt_turn(turn: list[Message], keep: int) -> list[Message]:
    """The turn with its tool results (a turn without results: its one message) cut to ``keep``
    characters each; the call stays whole."""
    has_results = any(m.get("role") == "tool" for m in turn)
    out = []
    for message in turn:
        content = message.get("content")
        if isinstance(content, str) and (message.get("role") == "tool" or not has_results):
            message = {**message, "content": excerpt(content, keep)}
        out.append(message)
    return out


def _excerpt_newest(system: list[Message], turn: list[Message], count: CountTokens,
                    budget: int) -> tuple[list[Message], int]:
    """Keep only the newest turn, its results cut to the longest head that fits."""
    lo, hi = 0, max(len(m.get("content") or "") for m in turn)  # largest kept length that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(system + _excerpt_turn(turn, mid)) <= budget:
            lo = mid
        else:
            hi = mid - 1
    kept = system + _excerpt_turn(turn, lo)
    tokens = count(kept)
    if tokens > budget:
        raise ValueError(
            f"the query-generator prompt needs {tokens} tokens with only the newest turn, its text "
            f"cut to the truncation marker, more than data.max_prompt_tokens={budget}; raise the "
            "budget"
        )
    return kept, tokens


def truncate_history(history: Sequence[Message], count: CountTokens, budget: int) -> Truncation:
    """The longest suffix of whole turns (plus system messages) whose prompt fits ``budget``; the
    newest turn excerpted (module docstring) when it alone does not fit."""
    history = list(history)
    tokens = count(history)
    if tokens <= budget:
        return Truncation(history, False, 0, tokens)
    system, groups = turn_groups(history)
    lo, hi = 1, len(groups)  # smallest number of dropped leading turns that fits
    while lo < hi:
        mid = (lo + hi) // 2
        if count(_flatten(system, groups[mid:])) <= budget:
            hi = mid
        else:
            lo = mid + 1
    kept = _flatten(system, groups[lo:])
    if lo < len(groups) and (tokens := count(kept)) <= budget:
        return Truncation(kept, True, len(history) - len(kept), tokens)
    if not groups:
        raise ValueError(f"the system messages alone exceed data.max_prompt_tokens={budget}")
    kept, tokens = _excerpt_newest(system, groups[-1], count, budget)
    return Truncation(kept, True, len(history) - len(kept), tokens, excerpted=True)
