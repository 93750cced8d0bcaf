"""The query generator's prompts (clarify and verify) and the strict parser of its output.

The policy may reason inside one leading ``<think>…</think>`` block; what follows must be exactly
``NO`` or ``YES [QUESTION]…[/QUESTION]``. Everything else is *invalid* and carries a reason, so
that the reward can penalise it and the logs can say why.

Case is strict: ``yes``/``No``/``[question]`` are invalid (reason ``wrong case``). The prompt asks
for the exact tokens, the reward trains the policy to follow the format, and a lenient parser
would also accept prose that merely starts with "no" ("no idea what to ask"), rewarding it as a
deliberate decision. A missing *opening* think tag is tolerated (text before a lone ``</think>``
counts as reasoning) because some chat templates put ``<think>`` into the prompt itself.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from prour.llm.base import Message
from prour.llm.history import render_history

PROMPTS_VERSION = "qg-v1"
"""Bumped whenever the wording of a query-generator prompt changes (stored with datasets/runs)."""

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
Q_OPEN, Q_CLOSE = "[QUESTION]", "[/QUESTION]"

# Stable invalid reasons (tests and metrics group by them).
NOT_TEXT = "not text"
EMPTY = "empty"
UNCLOSED_THINK = "truncated: unclosed think block"
NO_ANSWER = "no answer after thinking"
EXTRA_THINK = "more than one think block"
MULTIPLE_QUESTIONS = "multiple question blocks"
UNCLOSED_QUESTION = "truncated: unclosed question block"
BOTH_DECISIONS = "both decisions"
EMPTY_QUESTION = "empty question"
PLACEHOLDER_QUESTION = "placeholder question"
WRONG_CASE = "wrong case"
MISSING_DECISION = "missing decision"
MISSING_QUESTION = "YES without a question"
TEXT_OUTSIDE = "text outside the answer"

Kind = Literal["ask", "none", "invalid"]


@dataclass(frozen=True)
class ParsedQuery:
    """The policy's decision: ``ask`` (with ``question``), ``none``, or ``invalid`` (with ``reason``)."""

    kind: Kind
    question: str | None = None
    reason: str | None = None
    thinking: str | None = None


_STRICT_ANSWER = re.compile(r"(?:NO|YES\s*\[QUESTION\](?P<q>.*)\[/QUESTION\])", re.DOTALL)
_LOOSE_ANSWER = re.compile(
    r"(?:NO|YES\s*\[QUESTION\](?P<q>.*)\[/QUESTION\])", re.DOTALL | re.IGNORECASE
)
_DECISION_WORD = re.compile(r"\b(yes|no)\b", re.IGNORECASE)
_PLACEHOLDERS = {
    "question",
    "your question",
    "your question here",
    "question here",
    "insert question here",
    "insert your question here",
    "clarifying question",
    "verification query",
    "your query here",
    "query",
}
_PLACEHOLDER_SHAPES = (
    re.compile(
        r"(insert |write |put |enter )?(your|the|a)( \w+)* (question|query)( goes)?( here)?"
    ),
    re.compile(r"your( \w+)* here"),
    re.compile(r"[\[<{(]+ ?[\w .]* ?[\]>})]+"),  # <question>, {question}, [...]
)


def _invalid(reason: str, thinking: str | None = None) -> ParsedQuery:
    return ParsedQuery(kind="invalid", reason=reason, thinking=thinking)


def _split_think(text: str) -> tuple[str | None, str] | str:
    """Return ``(thinking, rest)``, or an invalid reason when the think block is malformed."""
    if text.startswith(THINK_OPEN):
        end = text.find(THINK_CLOSE)
        if end < 0:
            return UNCLOSED_THINK
        return text[len(THINK_OPEN) : end].strip(), text[end + len(THINK_CLOSE) :].strip()
    if THINK_OPEN not in text and THINK_CLOSE in text:
        end = text.find(THINK_CLOSE)
        return text[:end].strip(), text[end + len(THINK_CLOSE) :].strip()
    if THINK_OPEN in text:
        return TEXT_OUTSIDE  # a think block that does not lead the output
    return None, text


def is_placeholder(question: str) -> bool:
    """True for template text copied from the prompt ("your question here", "...", "<question>")."""
    if not any(ch.isalnum() for ch in question):
        return True
    norm = " ".join(question.lower().replace("_", " ").split()).strip(" \t\"'`.?!:")
    if norm in _PLACEHOLDERS:
        return True
    return any(shape.fullmatch(norm) for shape in _PLACEHOLDER_SHAPES)


def _check_question(question: str, thinking: str | None) -> ParsedQuery:
    question = question.strip()
    if not question:
        return _invalid(EMPTY_QUESTION, thinking)
    if is_placeholder(question):
        return _invalid(PLACEHOLDER_QUESTION, thinking)
    return ParsedQuery(kind="ask", question=question, thinking=thinking)


def _parse_answer(rest: str, thinking: str | None) -> ParsedQuery:
    """Classify the text after the think block."""
    upper = rest.upper()
    opens, closes = upper.count(Q_OPEN), upper.count(Q_CLOSE)
    if opens > 1 or closes > 1:
        return _invalid(MULTIPLE_QUESTIONS, thinking)
    if opens == 1 and closes == 0:
        return _invalid(UNCLOSED_QUESTION, thinking)
    outside = rest
    if opens == 1 and upper.find(Q_OPEN) < upper.find(Q_CLOSE):
        outside = rest[: upper.find(Q_OPEN)] + " " + rest[upper.find(Q_CLOSE) + len(Q_CLOSE) :]
    words = {w.lower() for w in _DECISION_WORD.findall(outside)}
    if words == {"yes", "no"} or (opens == 1 and "no" in words and "yes" not in words):
        return _invalid(BOTH_DECISIONS, thinking)
    strict = _STRICT_ANSWER.fullmatch(rest)
    if strict:
        if strict.group("q") is None:
            return ParsedQuery(kind="none", thinking=thinking)
        return _check_question(strict.group("q"), thinking)
    if _LOOSE_ANSWER.fullmatch(rest):
        return _invalid(WRONG_CASE, thinking)
    if opens == 0 and re.fullmatch(r"yes\W*", rest, flags=re.IGNORECASE):
        return _invalid(MISSING_QUESTION, thinking)
    return _invalid(TEXT_OUTSIDE if words else MISSING_DECISION, thinking)


def parse_query(text: Any) -> ParsedQuery:
    """Parse one query-generator output; never raises (non-text input is invalid too)."""
    try:
        if not isinstance(text, str):
            return _invalid(NOT_TEXT)
        text = text.strip()
        if not text:
            return _invalid(EMPTY)
        split = _split_think(text)
        if isinstance(split, str):
            return _invalid(split)
        thinking, rest = split
        if THINK_OPEN in rest or THINK_CLOSE in rest:
            return _invalid(EXTRA_THINK, thinking)
        if not rest:
            return _invalid(NO_ANSWER if thinking is not None else EMPTY, thinking)
        return _parse_answer(rest, thinking)
    except Exception as exc:  # noqa: BLE001 - the contract is "never raises": report instead
        return _invalid(f"parser error: {type(exc).__name__}")


_FORMAT_RULES = """\
How to answer:
- You may reason first, but only inside one <think> ... </think> block at the very start.
- After that block, write exactly one of these two answers and nothing else:
  YES [QUESTION]the question itself[/QUESTION]
  NO
- A decision written only inside the think block does not count."""

CLARIFY_TEMPLATE = """\
You help a customer-service agent decide whether it must ask the user something before it acts.

Conversation so far:
{history}

Look at what the user wants and at what the agent would need to know to carry it out. If the
user's intent is still open on a point that only the user can settle, the agent should ask one
short question about it; otherwise no question is needed.

{format_rules}

Rules for the question:
- Ask about the user's intent or preferences, one thing at a time, in a single short sentence.
- Never ask for facts the agent can look up with its tools (order contents, prices, statuses).
- Never ask something the conversation has already asked or answered."""

VERIFY_TEMPLATE = """\
You help a customer-service agent that is unsure about a fact of the world: a field of an order
or reservation, what the policy allows, or the result of a calculation. A separate Verifier that
can read the databases and the policy will answer one query for it. Decide whether such a query
is needed and, if so, write it.

{format_rules}

Rules for the query:
- It must be precise and answerable from evidence: a tool lookup, a calculation, or a policy rule.
  Good examples: "Which items does order #W1234567 contain?", "May a basic-economy ticket be
  changed under the policy?", "What do flights HAT001 and HAT002 cost together in economy?"
- Do not address the user; the user has already said what they want. Ask about the world.
- One query, fewer than 30 words.

Conversation so far:
{history}

Your decision:"""


def _history_text(history: Sequence[Message] | str) -> str:
    return history if isinstance(history, str) else render_history(history)


def clarify_prompt(history: Sequence[Message] | str) -> list[Message]:
    """Chat messages asking the policy whether to ask the *user* a clarifying question."""
    text = CLARIFY_TEMPLATE.format(history=_history_text(history), format_rules=_FORMAT_RULES)
    return [{"role": "user", "content": text}]


def verify_prompt(history: Sequence[Message] | str) -> list[Message]:
    """Chat messages asking the policy whether to send the *verifier* a query about the world."""
    text = VERIFY_TEMPLATE.format(history=_history_text(history), format_rules=_FORMAT_RULES)
    return [{"role": "user", "content": text}]


def query_prompt(mode: str, history: Sequence[Message] | str) -> list[Message]:
    """The prompt for a routed mode (``clarify`` or ``verify``)."""
    if mode == "clarify":
        return clarify_prompt(history)
    if mode == "verify":
        return verify_prompt(history)
    raise ValueError(f"unknown query mode {mode!r}; valid: clarify, verify")
