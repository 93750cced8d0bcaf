"""Belief prompts: the contexts under which the policy scores the reward target Y.

``clarify``: the policy summarizes the user's hidden profile and intent; Y is the normalized goal
G*. ``verify``: the policy predicts the agent's next tool call; Y is the canonical JSON of the
reference action. The *prior* prompt leaves the turn slot empty; the *posterior* fills it with the
query and the responder's answer. Everything else is identical, so the two differ only by the
exchange whose information the reward measures.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from prour.llm.base import Message
from prour.llm.history import render_history

BELIEF_VERSION = "belief-v1"

Mode = Literal["clarify", "verify"]

CLARIFY_BELIEF = """\
You are an analyst reading a customer-service conversation. Describe who the user is and what
they are really trying to get done, including details they have not stated yet.

Conversation:
{history}
{turn}
### The user's profile and intent:"""

VERIFY_BELIEF = """\
You are a customer-service agent on tau-bench. From the conversation and any evidence from the
verifier, predict the tool call the agent should make next.

Conversation:
{history}
{turn}
### Next tool call:"""

_TEMPLATES = {"clarify": CLARIFY_BELIEF, "verify": VERIFY_BELIEF}


def belief_turn(mode: Mode, query: str, answer: str) -> str:
    """The exchange that fills the posterior's turn slot."""
    if mode == "clarify":
        return f"[Clarification]\nagent asks the user: {query.strip()}\nuser: {answer.strip()}\n"
    return f"[Verification]\nagent asks the verifier: {query.strip()}\nverifier: {answer.strip()}\n"


def belief_prompt(
    mode: Mode,
    history: Sequence[Message] | str,
    query: str | None = None,
    answer: str | None = None,
) -> list[Message]:
    """Chat context for scoring Y: the prior without ``query``/``answer``, the posterior with both."""
    if mode not in _TEMPLATES:
        raise ValueError(f"unknown belief mode {mode!r}; valid: clarify, verify")
    if (query is None) != (answer is None):
        raise ValueError("belief_prompt needs both query and answer (posterior) or neither (prior)")
    text = history if isinstance(history, str) else render_history(history)
    turn = "" if query is None else belief_turn(mode, query, answer or "")
    return [{"role": "user", "content": _TEMPLATES[mode].format(history=text, turn=turn)}]
