"""Interruption budget and the gate every user-directed agent message passes through.

A budget N caps the *delivered discretionary* requests of one conversation. Answers and
policy-required requests are exempt: they are always delivered and never spend budget. When the
policy blocks a draft, the agent is told to continue without asking (``redraft``); if it cannot
(it keeps drafting blocked requests, or no redraft is possible), the fixed fallback message is
sent instead and counted, which gives the fallback rate of the ask-less paper.

The budget is spent in exactly one place, :meth:`AttentionGate.submit`, and
:meth:`InterruptionBudget.spend` raises rather than overdraw, so no policy bug can exceed N.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from prour.eval.attention.classifier import RequestClass
from prour.llm.base import Message
from prour.llm.history import render_history

log = logging.getLogger(__name__)

FALLBACK_MESSAGE = (
    "I'm sorry, but I can't complete this request with the information I have, so I have to "
    "stop here. Please contact us again with the full details of what you need.")
CONTINUE_WITHOUT_ASKING = (
    "Your last message to the customer was not sent ({reason}). Do not ask the customer for "
    "anything else now: continue with your tools, act on what you already know, or reply "
    "without a question.")


class BudgetExceeded(RuntimeError):
    """A discretionary request was about to be delivered with no budget left."""


@dataclass
class InterruptionBudget:
    """At most ``limit`` delivered discretionary requests; ``None`` means no limit."""

    limit: int | None
    spent: int = 0

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 0:
            raise ValueError(f"budget limit must be None or >= 0, got {self.limit}")

    @property
    def remaining(self) -> int | None:
        return None if self.limit is None else self.limit - self.spent

    @property
    def exhausted(self) -> bool:
        return self.limit is not None and self.spent >= self.limit

    def spend(self) -> None:
        if self.exhausted:
            raise BudgetExceeded(f"budget of {self.limit} discretionary requests already spent")
        self.spent += 1


class GateAction(str, Enum):
    DELIVER = "deliver"
    BLOCK = "block"
    SUBSTITUTE = "substitute"


@dataclass(frozen=True)
class GateDecision:
    """What the policy does with a draft: deliver it, block it, or deliver ``message`` instead.

    ``request`` classifies the message that would be delivered (for a block, the draft).
    """

    action: GateAction
    message: str | None
    reason: str
    request: RequestClass
    reviewed: bool = False  # a review model call (self-review, VoI) was made for this decision


@dataclass(frozen=True)
class DeliveredRequest:
    """One message sent to the user, with its label and whether it spent budget."""

    text: str
    label: str
    atomic_questions: int
    spent_budget: bool
    draft: str
    substituted: bool = False
    fallback: bool = False

    @property
    def discretionary(self) -> bool:
        return self.label == "discretionary"


@dataclass
class ConversationState:
    """What a policy may look at: the dialogue so far, the budget and the gate's own records."""

    messages: list[Message]
    budget: InterruptionBudget
    delivered: list[DeliveredRequest] = field(default_factory=list)
    blocked: list[GateDecision] = field(default_factory=list)
    fallbacks: int = 0
    reviews: int = 0
    vetoes: int = 0  # reviewed drafts the review blocked (a VoI veto, a self-review block)

    def dialogue_text(self, max_chars: int | None = None) -> str:
        """The dialogue as plain text (system prompt left out), the last ``max_chars`` of it."""
        text = render_history(self.messages)
        return text if max_chars is None else text[-max_chars:]


class GatePolicy(Protocol):
    """An attention policy as the gate sees it (implemented in :mod:`policies`)."""

    name: str

    def review(self, draft: str, state: ConversationState) -> GateDecision: ...

    def system_prompt_addendum(self) -> str: ...


@dataclass(frozen=True)
class GateOutcome:
    """What the gate sent: ``message`` (None when the agent went on without messaging) and how."""

    message: str | None
    kind: str  # "delivered", "substituted", "redrafted", "continued" or "fallback"
    decisions: tuple[GateDecision, ...]


Redraft = Callable[[str], "str | None"]
"""Ask the agent again with a note; returns a new user-directed draft, or None when the agent
continued with something other than a message (a tool call)."""


class AttentionGate:
    """Pass each outgoing user-directed draft through a policy; spend budget; count fallbacks."""

    def __init__(self, policy: GatePolicy, max_redrafts: int):
        if max_redrafts < 0:
            raise ValueError(f"max_redrafts must be >= 0, got {max_redrafts}")
        self.policy = policy
        self.max_redrafts = max_redrafts

    def submit(self, draft: str, state: ConversationState,
               redraft: Redraft | None = None) -> GateOutcome:
        """Deliver, substitute, or block and redraft; the fallback message when all else fails."""
        decisions: list[GateDecision] = []
        current = draft
        for attempt in range(self.max_redrafts + 1):
            decision = self.policy.review(current, state)
            decisions.append(decision)
            state.reviews += int(decision.reviewed)
            state.vetoes += int(decision.reviewed and decision.action is GateAction.BLOCK)
            if decision.action is not GateAction.BLOCK:
                kind = self._deliver(decision, current, state)
                return GateOutcome(decision.message, "redrafted" if attempt else kind,
                                   tuple(decisions))
            state.blocked.append(decision)
            if redraft is None or attempt == self.max_redrafts:
                break
            current = redraft(CONTINUE_WITHOUT_ASKING.format(reason=decision.reason))
            if current is None:
                return GateOutcome(None, "continued", tuple(decisions))
        return self._fallback(draft, state, decisions)

    def _deliver(self, decision: GateDecision, draft: str, state: ConversationState) -> str:
        request = decision.request
        if request.discretionary:
            state.budget.spend()
        substituted = decision.action is GateAction.SUBSTITUTE
        state.delivered.append(DeliveredRequest(
            decision.message or "", request.label, request.atomic_questions,
            request.discretionary, draft, substituted=substituted))
        return "substituted" if substituted else "delivered"

    @staticmethod
    def _fallback(draft: str, state: ConversationState,
                  decisions: list[GateDecision]) -> GateOutcome:
        log.info("no message could be delivered without asking; sending the fallback message")
        state.fallbacks += 1
        state.delivered.append(DeliveredRequest(FALLBACK_MESSAGE, "answer", 0, False, draft,
                                                fallback=True))
        return GateOutcome(FALLBACK_MESSAGE, "fallback", tuple(decisions))
