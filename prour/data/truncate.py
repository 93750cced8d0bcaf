"""Left truncation of a state's history to the query-generator prompt budget (paper A.2.1).

The budget counts the tokens of the whole prompt (template, history and generation prompt) with
the policy's tokenizer and chat template. Oldest turns go first; system messages stay; a tool
result leaves together with the assistant turn that called it. If the newest turn alone is still
too long, its text is cut from the left.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prour.llm.base import Message

ELLIPSIS = "…"
CountTokens = Callable[[list[Message]], int]
"""Tokens of the full prompt built around these history messages."""


@dataclass
class Truncation:
    """The history that fits, whether anything was cut, how many messages left, prompt tokens."""

    messages: list[Message]
    truncated: bool
    dropped: int
    tokens: int


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


def _cut_text(message: Message, keep_chars: int) -> Message:
    cut = copy.deepcopy(message)
    content = cut.get("content") or ""
    cut["content"] = ELLIPSIS + content[len(content) - keep_chars:] if keep_chars < len(content) else content
    return cut


def _shrink_last(system: list[Message], last: list[Message], count: CountTokens,
                 budget: int) -> tuple[list[Message], int]:
    """Keep only the newest message of the last turn, its text cut from the left to fit."""
    message = last[-1]
    content = message.get("content") or ""
    lo, hi = 0, len(content)  # largest kept length that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(system + [_cut_text(message, mid)]) <= budget:
            lo = mid
        else:
            hi = mid - 1
    kept = system + [_cut_text(message, lo)]
    tokens = count(kept)
    if tokens > budget:
        raise ValueError(
            f"the query-generator prompt needs {tokens} tokens with an empty history, more than "
            f"data.max_prompt_tokens={budget}; raise the budget"
        )
    return kept, tokens


def truncate_history(history: Sequence[Message], count: CountTokens, budget: int) -> Truncation:
    """The longest suffix of whole turns (plus system messages) whose prompt fits ``budget``."""
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
    kept, tokens = _shrink_last(system, groups[-1], count, budget)
    return Truncation(kept, True, len(history) - len(kept), tokens)
