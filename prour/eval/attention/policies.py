"""Attention policies: gates the agent consults on every outgoing user-directed message.

Each policy classifies the draft first. Answers and policy-required requests are always
delivered (exempt). A discretionary draft is blocked once the conversation's budget is spent
(checked before any review call); otherwise the policy decides:

=========================== =================================================================
``no-ask``                  block every discretionary request (budget 0)
``unrestricted``            deliver
``frugal``                  deliver; the system prompt asks the agent to ask sparingly
``voi-gate-as-run``         deliver; the system prompt gives the agent the threshold c and
                            asks it to ask only when it judges the answer's value ≥ c (no
                            review call, no veto: the ask-less paper's gate "as run")
``voi-gate``                a review call estimates the value of asking, p ∈ [0, 1]; the
                            draft is vetoed when p < c (enforced veto)
``budgeted``                deliver while the budget N lasts
``budgeted+review``         + self-review over the evidence window, no memory
``budgeted+review+summary`` + self-review with a model-written summary as memory
``budgeted+mgr``            + self-review against the user's earlier answers (MGR)
=========================== =================================================================

A review that never returns valid JSON does not invent a decision: the draft goes through as
under plain ``budgeted`` (or an ungated VoI policy), and the decision's reason records it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from prour.config.attention import AttentionConfig, check_policy_options, policy_spec
from prour.eval.attention.budget import (
    ConversationState,
    GateAction,
    GateDecision,
    InterruptionBudget,
)
from prour.eval.attention.classifier import RequestClass, RequestClassifier
from prour.eval.attention.mgr import SelfReviewer
from prour.llm.base import LLM, Message
from prour.llm.strict_json import ask_json, require_keys

log = logging.getLogger(__name__)

FRUGAL_ADDENDUM = (
    "Questions cost the customer time and attention. Ask only when you cannot continue "
    "correctly without the answer and cannot find it with your tools or the policy; ask for one "
    "thing at a time, in one short sentence.")
NO_ASK_ADDENDUM = (
    "Do not ask the customer questions beyond what the policy requires (identity checks and "
    "explicit confirmation of changes). Work with the information you already have.")
BUDGET_ADDENDUM = (
    "You may ask the customer at most {n} discretionary question(s) in this conversation; "
    "identity checks and confirmations required by the policy do not count. Spend them well.")

VOI_AS_RUN_ADDENDUM = (
    "Before you ask the customer for anything the policy does not require, estimate the "
    "probability, from 0 to 1, that their answer changes whether you complete the task "
    "correctly. Ask only when that estimate is at least {c:.2f}; below it, go on with your tools, "
    "the policy and what you already know.")

VOI_SYSTEM = """\
A customer-service agent is about to ask its customer the draft question below. Estimate how
much the answer would raise the chance that the agent completes the customer's task correctly,
compared with continuing without asking (using its tools, its policy and what it already
knows). 0 means no gain at all; 1 means the task cannot succeed without it.

Reply with one JSON object and nothing else:
{"voi": <number between 0 and 1>, "reason": "<one short sentence>"}"""

VOI_USER = """\
[Recent conversation]
{context}

[Draft question]
{draft}"""


class AttentionPolicy:
    """Base gate: exempt messages pass, an exhausted budget blocks, subclasses decide the rest."""

    name = "base"

    def __init__(self, classifier: RequestClassifier, budget: int | None = None,
                 context_chars: int = 3000):
        self.classifier = classifier
        self.budget = budget
        self.context_chars = context_chars

    def new_state(self, messages: list[Message] | None = None) -> ConversationState:
        """A fresh conversation state carrying this policy's budget."""
        return ConversationState(list(messages or []), InterruptionBudget(self.budget))

    def system_prompt_addendum(self) -> str:
        return ""

    def review(self, draft: str, state: ConversationState) -> GateDecision:
        request = self.classifier.classify_one(draft, state.dialogue_text(self.context_chars))
        if not request.discretionary:
            return GateDecision(GateAction.DELIVER, draft, f"exempt ({request.label})", request)
        if state.budget.exhausted:
            reason = (f"interruption budget of {state.budget.limit} spent" if state.budget.limit
                      else "no discretionary requests allowed")
            return GateDecision(GateAction.BLOCK, None, reason, request)
        return self.review_discretionary(draft, request, state)

    def review_discretionary(self, draft: str, request: RequestClass,
                             state: ConversationState) -> GateDecision:
        return GateDecision(GateAction.DELIVER, draft, "discretionary, budget left", request)


class NoAsk(AttentionPolicy):
    """Only exempt messages reach the user (a budget of zero)."""

    name = "no-ask"

    def __init__(self, classifier: RequestClassifier, context_chars: int = 3000):
        super().__init__(classifier, budget=0, context_chars=context_chars)

    def system_prompt_addendum(self) -> str:
        return NO_ASK_ADDENDUM


class Unrestricted(AttentionPolicy):
    """Every discretionary request is delivered."""

    name = "unrestricted"


class Frugal(AttentionPolicy):
    """Unlimited, but the system prompt asks the agent to ask sparingly."""

    name = "frugal"

    def system_prompt_addendum(self) -> str:
        return FRUGAL_ADDENDUM


class Budgeted(AttentionPolicy):
    """Discretionary requests are delivered until the budget N is spent."""

    name = "budgeted"

    def system_prompt_addendum(self) -> str:
        return BUDGET_ADDENDUM.format(n=self.budget)


class VoIGateAsRun(AttentionPolicy):
    """The agent is told the VoI threshold c and weighs each question itself: no review call,
    no veto, no budget (the ask-less paper's original gate)."""

    name = "voi-gate-as-run"

    def __init__(self, classifier: RequestClassifier, threshold: float,
                 context_chars: int = 3000):
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"voi-gate-as-run threshold c must be in [0, 1], got {threshold}")
        super().__init__(classifier, None, context_chars)
        self.threshold = threshold

    def system_prompt_addendum(self) -> str:
        return VOI_AS_RUN_ADDENDUM.format(c=self.threshold)


def validate_voi(data: dict[str, Any]) -> float:
    """Check the VoI JSON: ``voi`` a number in [0, 1] and ``reason`` a string."""
    require_keys(data, ("voi", "reason"))
    voi = data["voi"]
    if isinstance(voi, bool) or not isinstance(voi, (int, float)) or not 0 <= voi <= 1:
        raise ValueError(f"voi={voi!r} must be a number in [0, 1]")
    if not isinstance(data["reason"], str):
        raise ValueError("reason must be a string")  # noqa: TRY004
    return float(voi)


class VoIGate(AttentionPolicy):
    """Every discretionary draft is scored for value of information; below ``threshold`` it is
    vetoed, and the veto is enforced (the draft is not delivered)."""

    name = "voi-gate"

    def __init__(self, classifier: RequestClassifier, llm: LLM, threshold: float,
                 budget: int | None = None, *, max_attempts: int, context_chars: int = 3000):
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"voi-gate threshold c must be in [0, 1], got {threshold}")
        super().__init__(classifier, budget, context_chars)
        self.llm, self.threshold, self.max_attempts = llm, threshold, max_attempts

    def review_discretionary(self, draft: str, request: RequestClass,
                             state: ConversationState) -> GateDecision:
        user = VOI_USER.format(context=state.dialogue_text(self.context_chars) or "(start)",
                               draft=draft)
        prompt = [{"role": "system", "content": VOI_SYSTEM}, {"role": "user", "content": user}]
        outcome = ask_json(self.llm, [prompt], validate_voi, self.max_attempts)[0]
        if outcome.failed:
            return GateDecision(GateAction.DELIVER, draft,
                                f"VoI review failed, not vetoed: {outcome.errors[-1]}",
                                request, reviewed=True)
        voi = outcome.value
        if voi < self.threshold:
            return GateDecision(GateAction.BLOCK, None, f"VoI {voi:.2f} < c={self.threshold:.2f}",
                                request, reviewed=True)
        return GateDecision(GateAction.DELIVER, draft, f"VoI {voi:.2f} >= c={self.threshold:.2f}",
                            request, reviewed=True)


class ReviewedBudget(Budgeted):
    """Budgeted with self-review of each discretionary draft (memory per subclass)."""

    name = "budgeted+review"
    memory = "none"

    def __init__(self, classifier: RequestClassifier, llm: LLM, budget: int, *,
                 evidence_tokens: int, memory_tokens: int, max_attempts: int,
                 context_chars: int = 3000):
        super().__init__(classifier, budget, context_chars)
        self.reviewer = SelfReviewer(llm, self.memory, evidence_tokens, memory_tokens,
                                     max_attempts)

    def review_discretionary(self, draft: str, request: RequestClass,
                             state: ConversationState) -> GateDecision:
        verdict = self.reviewer.review(draft, state.messages)
        reason = f"review: {verdict.reason}" if verdict.reason else "review"
        if verdict.decision == "block":
            return GateDecision(GateAction.BLOCK, None, reason, request, reviewed=True)
        if verdict.decision == "approve":
            return GateDecision(GateAction.DELIVER, draft, reason, request, reviewed=True)
        substitute = self.classifier.classify_one(verdict.question,
                                                  state.dialogue_text(self.context_chars))
        counted = RequestClass("discretionary", max(1, substitute.atomic_questions),
                               substitute.source, substitute.error)
        return GateDecision(GateAction.SUBSTITUTE, verdict.question, reason, counted,
                            reviewed=True)


class ReviewSummary(ReviewedBudget):
    """Self-review with a model-written summary of the user's words as memory."""

    name = "budgeted+review+summary"
    memory = "summary"


class MemoryGuidedReview(ReviewedBudget):
    """MGR: self-review against the user's earlier answers, verbatim."""

    name = "budgeted+mgr"
    memory = "answers"


def build_policy(name: str, classifier: RequestClassifier, llm: LLM | None = None,
                 budget: int | None = None, threshold: float | None = None,
                 **options: Any) -> AttentionPolicy:
    """Build a policy by registry name with the options it takes (see module docstring)."""
    check_policy_options(name, budget, threshold, llm is not None)
    spec = policy_spec(name)
    factory: Callable[..., AttentionPolicy] = globals()[spec.factory]
    kwargs: dict[str, Any] = dict(options)
    if spec.needs_llm:
        kwargs["llm"] = llm
    if spec.takes_budget:
        kwargs["budget"] = budget
    if spec.needs_threshold:
        kwargs["threshold"] = threshold
    return factory(classifier, **kwargs)


def configured_policy(config: AttentionConfig, classifier: RequestClassifier,
                      llm: LLM | None = None) -> AttentionPolicy:
    """The policy an ``eval.attention`` section names; ``llm`` reviews drafts (VoI, self-review)."""
    spec = policy_spec(config.policy)
    options: dict[str, int] = {}
    if spec.needs_llm:
        options["max_attempts"] = config.review_attempts
    if spec.self_review:
        options["evidence_tokens"] = config.evidence_window_tokens
        options["memory_tokens"] = config.memory_window_tokens
    return build_policy(config.policy, classifier, llm, config.budget, config.voi_threshold,
                        **options)
