"""The attention protocol at the episode level (ask-less paper): gate, record, judge, price.

:class:`AttentiveAgent` wraps any agent (base, proactive, oracle). Each user-directed message it
drafts, the proactive agent's clarify questions included, goes through an
:class:`~prour.eval.attention.budget.AttentionGate`: exempt messages pass, discretionary ones
spend the interruption budget or are blocked; a blocked draft makes the agent act again with a
note to continue without asking (its redraft), and if that fails the fixed fallback message is
sent. What happened is stored in the step meta under ``"attention"``.

After the episode, :func:`attention_summary` rebuilds the delivered requests from the
trajectory, has the judge score them (cached), and prices the conversation under every
accounting, so that the result line carries R, A, V and U for the report.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prour.config.attention import AttentionConfig
from prour.env.agents import Agent, AgentTurn, TaskView
from prour.env.trajectory import Trajectory, agent_view
from prour.eval.agent import AgentWrapper, is_agent_turn, is_stop_only
from prour.eval.attention.analysis import cost_requests
from prour.eval.attention.budget import (
    AttentionGate,
    ConversationState,
    DeliveredRequest,
    GateOutcome,
)
from prour.eval.attention.cost import ACCOUNTINGS, conversation_cost, judged_value, utility
from prour.eval.attention.policies import AttentionPolicy
from prour.llm.base import Message
from prour.llm.history import render_history
from prour.rewards.judge import Judgment, RequestJudge

logger = logging.getLogger(__name__)

REQUEST_LABELS = ("required", "discretionary")
"""Labels of messages that ask the user for something (answers are not requests)."""


@dataclass
class _Draft:
    """The turns of one gated step: the first draft's turn, the latest redraft, notes added."""

    first: AgentTurn
    latest: AgentTurn
    notes: list[Message]


class AttentiveAgent(AgentWrapper):
    """Passes every user-directed message of ``inner`` through an attention policy's gate."""

    def __init__(self, inner: Agent, policy: AttentionPolicy, max_redrafts: int):
        super().__init__(inner)
        self.policy = policy
        self.gate = AttentionGate(policy, max_redrafts)
        self.state: ConversationState = policy.new_state()

    def reset(self, domain: str, task_view: TaskView) -> str | None:
        self.state = self.policy.new_state()
        system = self.inner.reset(domain, task_view)
        addendum = self.policy.system_prompt_addendum()
        if addendum and system:
            return f"{system}\n\n{addendum}"
        return system

    def act(self, messages: list[Message], tools: list[dict[str, Any]]) -> AgentTurn:
        turn = self.inner.act(messages, tools)
        if turn.tool_calls or is_stop_only(turn.content):
            return turn
        draft = _Draft(turn, turn, [])
        self.state.messages = [*messages, *turn.extra_messages]

        def redraft(note_text: str) -> str | None:
            note = {"role": "system", "content": note_text}
            draft.notes.append(note)
            view = [*messages, *draft.first.extra_messages, *draft.notes]
            draft.latest = self.act_directly(view, tools)
            return None if draft.latest.tool_calls else draft.latest.content

        outcome = self.gate.submit(turn.content or "", self.state, redraft)
        return self._final_turn(draft, outcome)

    def _final_turn(self, draft: _Draft, outcome: GateOutcome) -> AgentTurn:
        """The turn to record: the delivered text (or the redraft's tool calls) and the notes."""
        first, latest = draft.first, draft.latest
        replaced = latest is not first
        extras = [*first.extra_messages, *draft.notes]
        if replaced:
            extras += latest.extra_messages
        meta = dict(first.meta)
        if replaced:  # the routing record stays the first draft's; the turn is the redraft's
            meta = {**latest.meta, **first.meta, "turn": latest.meta.get("turn", "act")}
        if outcome.kind == "fallback":
            meta["turn"] = "act"
        meta["attention"] = self._record(first.content or "", outcome)
        if outcome.message is None:  # the redraft went on with tool calls
            return AgentTurn(content=latest.content, tool_calls=latest.tool_calls,
                             extra_messages=extras, meta=meta, reasoning=latest.reasoning)
        source = latest if replaced else first
        return AgentTurn(content=outcome.message, extra_messages=extras, meta=meta,
                         reasoning=source.reasoning)

    def _record(self, draft: str, outcome: GateOutcome) -> dict[str, Any]:
        """What the gate did with this step's draft, for the step meta."""
        record: dict[str, Any] = {
            "outcome": outcome.kind,
            "draft": draft,
            "delivered": outcome.message is not None,
            "actions": [d.action.value for d in outcome.decisions],
            "reasons": [d.reason for d in outcome.decisions],
            "budget_spent": self.state.budget.spent,
            "budget_limit": self.state.budget.limit,
            "reviews": self.state.reviews,
            "vetoes": self.state.vetoes,
        }
        if outcome.message is not None:
            request: DeliveredRequest = self.state.delivered[-1]
            record.update(label=request.label, atomic_questions=request.atomic_questions,
                          discretionary=request.discretionary, spent_budget=request.spent_budget,
                          substituted=request.substituted, fallback=request.fallback)
            source = outcome.decisions[-1].request if outcome.decisions else None
            record["classifier"] = source.source if source is not None else None
        return record


# ---- after the episode --------------------------------------------------------------------


@dataclass(frozen=True)
class DeliveredMessage:
    """A gated message as delivered, with the dialogue the agent had seen before it."""

    message_index: int
    text: str
    label: str
    atomic_questions: int
    spent_budget: bool
    fallback: bool
    context: str

    @property
    def discretionary(self) -> bool:
        return self.label == "discretionary"

    @property
    def is_request(self) -> bool:
        return self.label in REQUEST_LABELS


def delivered_messages(trajectory: Trajectory) -> list[DeliveredMessage]:
    """Every message the gate delivered in an episode, in order."""
    out = []
    for step in trajectory.steps:
        record = step.meta.get("attention")
        if not is_agent_turn(step) or not isinstance(record, dict) or not record.get("delivered"):
            continue
        index = step.message_index
        before = agent_view(trajectory.messages[:index], trajectory.steps)
        out.append(DeliveredMessage(
            message_index=index,
            text=trajectory.messages[index].get("content") or "",
            label=record["label"],
            atomic_questions=int(record["atomic_questions"]),
            spent_budget=bool(record["spent_budget"]),
            fallback=bool(record.get("fallback")),
            context=render_history(before)))
    return out


def budget_respected(trajectory: Trajectory) -> bool:
    """No step reports more budget spent than its limit."""
    for step in trajectory.steps:
        record = step.meta.get("attention")
        limited = isinstance(record, dict) and record.get("budget_limit") is not None
        if limited and record["budget_spent"] > record["budget_limit"]:
            return False
    return True


def _judgments(requests: Sequence[DeliveredMessage],
               judge: RequestJudge | None) -> list[Judgment | None]:
    if judge is None or not requests:
        return [None] * len(requests)
    return list(judge.judge([(r.text, r.context) for r in requests]))


def _priced(rows: list[dict[str, Any]], accounting: str, config: AttentionConfig) -> float | None:
    """Cost under one accounting, or None when a request it counts lacks judge scores."""
    try:
        return conversation_cost(rows, accounting, config.weights)
    except ValueError as exc:
        logger.debug("cost under %s not computable: %s", accounting, exc)
        return None


def attention_summary(trajectory: Trajectory, config: AttentionConfig, reward: float,
                      judge: RequestJudge | None) -> dict[str, Any]:
    """The attention block of a result line: requests with judge scores, costs, utility, V."""
    delivered = delivered_messages(trajectory)
    requests = [d for d in delivered if d.is_request]
    judgments = _judgments(requests, judge)
    rows = cost_requests(
        [DeliveredRequest(r.text, r.label, r.atomic_questions, r.spent_budget, r.text,
                          fallback=r.fallback) for r in requests], judgments)
    for row, request in zip(rows, requests):
        row.update(text=request.text, label=request.label, message_index=request.message_index)
    costs = {accounting: _priced(rows, accounting, config) for accounting in ACCOUNTINGS}
    cost = costs[config.accounting]
    try:
        value = judged_value(rows)
    except ValueError:
        value = None
    records = [s.meta["attention"] for s in trajectory.steps
               if is_agent_turn(s) and isinstance(s.meta.get("attention"), dict)]
    return {
        "policy": config.policy,
        "budget": config.budget,
        "accounting": config.accounting,
        "lam": config.lam,
        "weights": config.weights.model_dump(),
        "requests": rows,
        "discretionary": sum(1 for r in requests if r.discretionary),
        "spent": max((r["budget_spent"] for r in records), default=0),
        "blocked": sum(r["actions"].count("block") for r in records),
        "fallbacks": sum(1 for d in delivered if d.fallback),
        "reviews": max((r["reviews"] for r in records), default=0),
        "vetoes": max((r.get("vetoes", 0) for r in records), default=0),
        "judged": judge is not None,
        "judge_failures": sum(1 for j in judgments if j is not None and j.failed),
        "costs": costs,
        "cost": cost,
        "utility": utility(reward, cost, config.lam) if cost is not None else None,
        "value": None if value is None or math.isnan(value) else value,
    }
