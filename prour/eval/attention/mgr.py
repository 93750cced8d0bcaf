"""Self-review of discretionary drafts, with or without memory of the user's earlier answers.

Before a discretionary draft spends budget, a second call to the backbone model reviews it and
decides to **approve** it, **substitute** a better single question, or **block** it. The review
sees a bounded *evidence window* (the most recent part of the dialogue) and, depending on the
variant, a bounded *memory*:

- ``none``: evidence only (Budgeted + Review);
- ``summary``: a model-written summary of what the user has said so far (+ Summary);
- ``answers``: the user's earlier replies verbatim, each with the agent message it answered,
  most recent first (memory-guided review, MGR).

Windows are counted in tokens by ``count_tokens`` (default: about four characters per token).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from prour.config.attention import EVIDENCE_WINDOW_TOKENS, MEMORY_WINDOW_TOKENS
from prour.llm.base import LLM, ChatRequest, Message
from prour.llm.history import render_message
from prour.llm.strict_json import (
    JUDGE_SAMPLING,
    JsonCache,
    ask_json,
    cache_key,
    require_keys,
)

log = logging.getLogger(__name__)

MEMORY_KINDS = ("none", "summary", "answers")
DECISIONS = ("approve", "substitute", "block")
TokenCounter = Callable[[str], int]

REVIEW_SYSTEM = """\
You check a question that a customer-service agent is about to send to its customer, before it
is sent. Each question interrupts the customer, so only worthwhile questions should go out.

Decide one of:
- "block": the answer is already known from the memory or the recent conversation, the agent
  could find it with its own tools or policy, or the task does not need it now.
- "substitute": the question is worth asking but could be better: it bundles several asks,
  is hard to read, or asks for more than is needed. Write a replacement that asks exactly one
  thing, the most important missing piece, in one short sentence.
- "approve": the question is needed, not yet answered, and already asks one clear thing.

Reply with one JSON object and nothing else:
{"decision": "approve" | "substitute" | "block", "question": "<replacement, or empty unless
substituting>", "reason": "<one short sentence>"}"""

REVIEW_USER = """\
[What the customer has told the agent so far]
{memory}

[Recent conversation]
{evidence}

[Draft question]
{draft}"""

SUMMARY_SYSTEM = """\
Write down, as short notes, everything the customer has told the agent in this conversation:
facts about them and their orders or bookings, choices they made, things they refused or do not
know. Do not add anything the customer did not say. Reply with the notes only."""


def approx_tokens(text: str) -> int:
    """A tokenizer-free length estimate: one token per four characters, rounded up."""
    return math.ceil(len(text) / 4)


def take_recent(lines: Sequence[str], max_tokens: int,
                count_tokens: TokenCounter = approx_tokens) -> list[str]:
    """The longest suffix of ``lines`` that fits in ``max_tokens`` (one line per newline)."""
    kept: list[str] = []
    used = 0
    for line in reversed(lines):
        cost = count_tokens(line) + 1
        if used + cost > max_tokens:
            break
        kept.append(line)
        used += cost
    return kept[::-1]


def evidence_window(messages: Sequence[Message], max_tokens: int = EVIDENCE_WINDOW_TOKENS,
                    count_tokens: TokenCounter = approx_tokens) -> str:
    """The most recent dialogue lines (tool calls and results included) within ``max_tokens``."""
    lines = [line for m in messages if m.get("role") != "system" for line in render_message(m)]
    return "\n".join(take_recent(lines, max_tokens, count_tokens))


def answer_memory(messages: Sequence[Message]) -> list[str]:
    """One entry per user message: what the user said and the agent message it replied to."""
    entries: list[str] = []
    last_agent = ""
    for message in messages:
        role, content = message.get("role"), (message.get("content") or "").strip()
        if role == "assistant" and content:
            last_agent = content
        elif role == "user" and content:
            asked = f'Agent: "{last_agent}" → ' if last_agent else ""
            entries.append(f'{asked}Customer: "{content}"')
            last_agent = ""
    return entries


def render_answer_memory(messages: Sequence[Message], max_tokens: int = MEMORY_WINDOW_TOKENS,
                         count_tokens: TokenCounter = approx_tokens) -> str:
    """The user's answers, most recent first, cut to ``max_tokens``."""
    kept = take_recent(answer_memory(messages), max_tokens, count_tokens)
    return "\n".join(reversed(kept))


@dataclass(frozen=True)
class ReviewVerdict:
    """A self-review decision; ``failed`` when the reviewer never gave a valid reply."""

    decision: str
    question: str
    reason: str
    failed: bool = False


def validate_review(data: dict[str, Any]) -> ReviewVerdict:
    """Check the review JSON: a known decision, and a non-empty question when substituting."""
    require_keys(data, ("decision", "question", "reason"))
    decision, question, reason = data["decision"], data["question"], data["reason"]
    if decision not in DECISIONS:
        raise ValueError(f"decision {decision!r} is not one of {list(DECISIONS)}")
    if not isinstance(question, str) or not isinstance(reason, str):
        raise ValueError("question and reason must be strings")  # noqa: TRY004
    if decision == "substitute" and not question.strip():
        raise ValueError("a substitute decision needs the replacement in 'question'")
    return ReviewVerdict(decision, question.strip(), reason.strip())


class SelfReviewer:
    """Review discretionary drafts against bounded evidence and (optionally) memory."""

    def __init__(self, llm: LLM, memory: str, evidence_tokens: int, memory_tokens: int,
                 max_attempts: int, count_tokens: TokenCounter = approx_tokens,
                 cache: JsonCache | None = None):
        if memory not in MEMORY_KINDS:
            raise ValueError(f"unknown memory kind {memory!r}; valid: {', '.join(MEMORY_KINDS)}")
        self.llm, self.memory = llm, memory
        self.evidence_tokens, self.memory_tokens = evidence_tokens, memory_tokens
        self.max_attempts, self.count_tokens = max_attempts, count_tokens
        self.summaries = cache if cache is not None else JsonCache()

    def summary(self, messages: Sequence[Message]) -> str:
        """A model-written note of what the user said (cached per dialogue), cut to the window."""
        said = "\n".join(answer_memory(messages))
        if not said:
            return ""
        key = cache_key("summary-v1", said)
        if key not in self.summaries:
            prompt = [{"role": "system", "content": SUMMARY_SYSTEM},
                      {"role": "user", "content": said}]
            reply = self.llm.chat([ChatRequest(prompt, JUDGE_SAMPLING)])[0]
            self.summaries.put(key, reply[0].content.strip() if reply else "")
        lines = self.summaries.get(key).splitlines()
        return "\n".join(take_recent(lines, self.memory_tokens, self.count_tokens))

    def memory_text(self, messages: Sequence[Message]) -> str:
        if self.memory == "answers":
            return render_answer_memory(messages, self.memory_tokens, self.count_tokens)
        if self.memory == "summary":
            return self.summary(messages)
        return ""

    def prompt(self, draft: str, messages: Sequence[Message]) -> list[Message]:
        memory = self.memory_text(messages) if self.memory != "none" else None
        user = REVIEW_USER.format(
            memory=memory or ("(nothing yet)" if memory is not None else "(not available)"),
            evidence=evidence_window(messages, self.evidence_tokens, self.count_tokens)
            or "(start)", draft=draft)
        return [{"role": "system", "content": REVIEW_SYSTEM}, {"role": "user", "content": user}]

    def review(self, draft: str, messages: Sequence[Message]) -> ReviewVerdict:
        """Approve, substitute or block ``draft``; a failed review approves it, marked failed."""
        outcome = ask_json(self.llm, [self.prompt(draft, messages)], validate_review,
                           self.max_attempts)[0]
        if outcome.failed:
            return ReviewVerdict("approve", "", f"review failed: {outcome.errors[-1]}", True)
        return outcome.value
