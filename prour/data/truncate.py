"""Left truncation of a state's history to the query-generator prompt budget (paper A.2.1).

The budget counts the tokens of the whole prompt (template, history and generation prompt) with
the policy's tokenizer and chat template. System messages stay. The other messages form *turns*:
each message that is not a tool result opens one, and a tool result belongs to the turn of the
call before it, so a kept result always has its call.

The rule, in order (the first that fits wins):

1. The whole history fits: it is kept as it is.
2. The *anchor* is the turn of the newest user message: that message and everything after it
   (the agent's calls and their results, which that message prompted). Older turns leave oldest
   first, whole; the kept history is the longest suffix of whole turns that fits and still holds
   the anchor. So every kept row holds the newest user message, verbatim.
3. The anchor alone (no older turn) is over budget: it is kept whole except for its tool
   results, each cut to its *head* followed by the marker ``[… truncated N characters …]`` (N:
   the characters left out), with the longest head that fits (one cap for all tool results after
   the newest user message). The user message and the agent's calls are never cut.
4. Even with every such result cut to the marker alone it does not fit (or the anchor has no tool
   result to cut): the state has no row. :class:`OverBudget` is raised; extraction drops the
   state and counts it (``over_budget`` in the extraction summary and the dataset card).

A history without any user message (the agent speaks first and the task has no user turn before
the decision) anchors at its newest turn instead, and step 3 may then also cut that turn's own
text when it has no tool result. A budget below the prompt of the system messages alone is a
configuration error (:class:`ValueError`), not a drop: no state could fit it.

The head, because tau2 tool results are JSON objects that open with their identifying fields
(``order_id``, ``user_id``, ``name``, ``product_id`` …) and put long lists (items, variants,
payment history) after them: the head says what the result is about, a tail would be a fragment
of a list with no subject. The marker tells the reader that the text is an excerpt and how much
of it is missing. The dataset card counts the rows holding such an excerpt (:func:`is_excerpt`).
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


class OverBudget(ValueError):
    """The newest user message and what follows it do not fit the budget even with their tool
    results cut to the marker (module docstring, step 4): the state has no row."""


def anchor_turn(groups: Sequence[list[Message]]) -> int:
    """Index of the turn opened by the newest user message (the newest turn when none is)."""
    for index in range(len(groups) - 1, -1, -1):
        if groups[index][0].get("role") == "user":
            return index
    return len(groups) - 1


def _cut(messages: list[Message], keep: int, text_too: bool) -> list[Message]:
    """The messages with each tool result (``text_too``: with no tool result, every message)
    cut to ``keep`` characters; calls and user messages stay whole."""
    has_results = any(m.get("role") == "tool" for m in messages)
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str) and (message.get("role") == "tool"
                                         or (text_too and not has_results)):
            message = {**message, "content": excerpt(content, keep)}
        out.append(message)
    return out


def _excerpt_anchor(system: list[Message], anchor: list[Message], count: CountTokens,
                    budget: int, text_too: bool) -> tuple[list[Message], int]:
    """Keep only the anchor, its tool results cut to the longest head that fits (step 3)."""
    cuttable = [m for m in _cut(anchor, 0, text_too) if m not in anchor]
    if not cuttable:
        tokens = count(system + anchor)
        raise OverBudget(
            f"the query-generator prompt needs {tokens} tokens with only the newest user message "
            f"and what follows it, more than data.max_prompt_tokens={budget}, and it has no tool "
            "result to cut")
    lo, hi = 0, max(len(m.get("content") or "") for m in anchor)  # largest kept length that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(system + _cut(anchor, mid, text_too)) <= budget:
            lo = mid
        else:
            hi = mid - 1
    kept = system + _cut(anchor, lo, text_too)
    tokens = count(kept)
    if tokens > budget:
        raise OverBudget(
            f"the query-generator prompt needs {tokens} tokens with only the newest user message "
            "and what follows it, its tool results cut to the truncation marker, more than "
            f"data.max_prompt_tokens={budget}")
    return kept, tokens


def truncate_history(history: Sequence[Message], count: CountTokens, budget: int) -> Truncation:
    """The history that fits ``budget`` by the module docstring's rule: the longest suffix of
    whole turns (plus system messages) that still holds the newest user message; that message and
    what follows it with their tool results excerpted when they alone do not fit. Raises
    :class:`OverBudget` when even that does not fit (the state has no row), ValueError when the
    system messages alone do not."""
    history = list(history)
    tokens = count(history)
    if tokens <= budget:
        return Truncation(history, False, 0, tokens)
    system, groups = turn_groups(history)
    if not groups or count(system) > budget:
        raise ValueError(f"the query-generator prompt without any history message needs "
                         f"{count(system)} tokens, more than data.max_prompt_tokens={budget}; "
                         "raise the budget")
    anchor = anchor_turn(groups)
    fits = lambda drop: count(_flatten(system, groups[drop:])) <= budget
    if anchor > 0 and fits(anchor):
        lo, hi = 1, anchor  # smallest number of dropped leading turns that fits
        while lo < hi:
            mid = (lo + hi) // 2
            if fits(mid):
                hi = mid
            else:
                lo = mid + 1
        kept = _flatten(system, groups[lo:])
        return Truncation(kept, True, len(history) - len(kept), count(kept))
    text_too = groups[anchor][0].get("role") != "user"  # no user message: today's newest turn
    kept, tokens = _excerpt_anchor(system, _flatten([], groups[anchor:]), count, budget, text_too)
    return Truncation(kept, True, len(history) - len(kept), tokens, excerpted=True)
