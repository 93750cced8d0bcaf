"""SABER baseline: user confirmation gated on mutating actions, targeted reflection, context cleaning.

Source: Cuadron et al., "SABER: Small Actions, Big Errors — Safeguarding Mutating Steps in LLM
Agents", ICLR 2026 MemAgents workshop (arXiv 2512.07850), as the Prour paper (section 4, A.2)
re-implements it on the task agent's backbone: it "gates explicit user confirmation on mutating
actions, adds targeted reflection, and cleans context".

What it does, at every agent step:

1. **Context cleaning**: the task agent sees the dialogue with stale tool results replaced by a
   short stub: a result superseded by a later call of the same tool with the same arguments, and
   tool errors from before the user's latest message (earlier blocks). The stored transcript
   keeps everything; only the agent's view is cleaned.
2. The task agent proposes its turn. A turn without a *mutating* call (a tool tau2 marks
   ``ToolType.WRITE``) runs as it is.
3. **Targeted reflection**: before a mutating turn the agent's model reviews it against the policy
   and the dialogue (one strict-JSON call counted as role ``reflection``, decoding as every
   baseline's decision module: ``router.llm_router_temperature`` / ``_max_tokens``): ``proceed``,
   or ``revise`` with the issue; an invalid review counts as ``proceed`` and is recorded invalid. On ``revise`` the issue is added to the agent's context as a note (never shown to the
   user) and the task agent proposes again, once.
4. **Confirmation gate**: a mutating turn runs only when the user was asked to confirm exactly
   those calls (tool and arguments) and the task agent, having read the reply, proposes them
   again. Otherwise the agent's turn is a confirmation request to the user, tagged ``confirm``.

Settings: ``eval.saber``. Each step's ``decision`` records the route (act / confirm), the gate
(``asked`` / ``confirmed``), the review and how many tool results were cleaned.

What prour simplified. Reading the user's reply is left to the task agent (proposing the same
call again after the reply counts as consent; there is no separate consent classifier); the
confirmation is a fixed template listing tool and arguments; reflection runs once per mutating
proposal, with no memory across steps; context cleaning uses the two staleness rules above
instead of the paper's block-based filtering. The tau2 policies already ask agents to get a
"yes" before changes, so an agent that asked on its own is asked again by the gate.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from prour.env.agents import AgentTurn, TaskView
from prour.eval.agent import AgentWrapper
from prour.eval.baselines import ask_strict_json, tagged, text_fields, write_tools
from prour.llm.base import ToolCall
from prour.llm.history import render_history
from prour.router.candidates import canonical_json

if TYPE_CHECKING:  # pragma: no cover
    from prour.config.eval import SaberConfig
    from prour.env.agents import Agent
    from prour.eval.baselines import BaselineContext
    from prour.llm.base import LLM, Message, SamplingParams

NAME = "saber"

REFLECTION_PREFIX = "[Reflection]"
STALE_RESULT = "[cleaned: superseded by a later call of this tool with the same arguments]"
OLD_ERROR = "[cleaned: a tool error from an earlier part of the conversation]"


# ---- mutating calls -------------------------------------------------------------------------


def call_signature(call: ToolCall) -> str:
    """A call's tool and arguments as canonical JSON (equal calls, equal signatures)."""
    return canonical_json({"tool": call.name, "arguments": call.arguments})


def describe_call(call: ToolCall) -> str:
    """A readable line for a call: ``cancel pending order (order_id: "#W1", reason: ...)``."""
    args = call.arguments if isinstance(call.arguments, dict) else {}
    listed = ", ".join(f"{k}: {json.dumps(v, ensure_ascii=False)}" for k, v in args.items())
    return f"{call.name.replace('_', ' ')} ({listed})" if listed else call.name.replace("_", " ")


def confirmation_text(calls: Sequence[ToolCall]) -> str:
    """The gate's request for consent before mutating ``calls``."""
    lines = "\n".join(f"- {describe_call(c)}" for c in calls)
    return (f"Before I make this change, please confirm that I should do the following:\n{lines}\n"
            "Shall I go ahead? (yes/no)")


# ---- context cleaning -----------------------------------------------------------------------


def _calls_by_id(messages: Sequence[Message]) -> dict[str, str]:
    """Tool-call id → canonical (tool, arguments) of every assistant tool call."""
    out = {}
    for message in messages:
        for call in message.get("tool_calls") or []:
            fn = call.get("function", {})
            args = fn.get("arguments", {})
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    pass
            out[call.get("id", "")] = canonical_json({"tool": fn.get("name"), "arguments": args})
    return out


def stale_results(messages: Sequence[Message]) -> dict[int, str]:
    """Index → stub of each tool result the agent need not see again (module docstring, step 1):
    superseded by a later identical call, or an error before the latest user message."""
    calls = _calls_by_id(messages)
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    latest: dict[str, int] = {}
    for i, message in enumerate(messages):
        if message.get("role") == "tool":
            latest[calls.get(message.get("tool_call_id", ""), f"#{i}")] = i
    out = {}
    for i, message in enumerate(messages):
        if message.get("role") != "tool":
            continue
        key = calls.get(message.get("tool_call_id", ""), f"#{i}")
        if latest[key] != i:
            out[i] = STALE_RESULT
        elif i < last_user and str(message.get("content") or "").startswith("Error"):
            out[i] = OLD_ERROR
    return out


def clean_context(messages: Sequence[Message]) -> tuple[list[Message], int]:
    """The agent's view with stale tool results stubbed (ids kept), and how many were."""
    stale = stale_results(messages)
    cleaned = [{**m, "content": stale[i]} if i in stale else m for i, m in enumerate(messages)]
    return cleaned, len(stale)


# ---- targeted reflection --------------------------------------------------------------------

REFLECTION_PROMPT = """\
You review one action of a customer service agent before it runs. The action changes the \
customer's records, so a mistake cannot be undone. The agent must follow this policy:
<policy>
{policy}
</policy>

Conversation so far:
{history}

The agent now wants to run:
{calls}

Check only this action. Is it the change the customer asked for? Is every argument taken from \
what the customer said or what a tool returned, with no guessed ids, items or amounts? Does the \
policy allow it now, with its preconditions checked? Answer with only a JSON object: \
{{"verdict": "proceed"}} when the action is right, or {{"verdict": "revise", "issue": "<one \
sentence: what is wrong and what to do instead>"}}."""


def reflection_prompt(policy: str, messages: Sequence[Message],
                      calls: Sequence[ToolCall]) -> str:
    listed = "\n".join(f"- {c.name}({json.dumps(c.arguments, ensure_ascii=False)})"
                       for c in calls)
    return REFLECTION_PROMPT.format(policy=policy, history=render_history(messages), calls=listed)


def read_verdict(data: dict[str, Any]) -> dict[str, str]:
    """A validated review: ``proceed``, or ``revise`` with a non-empty issue."""
    verdict, issue = data.get("verdict"), text_fields(data, ("issue",))["issue"]
    extra = sorted(set(data) - {"verdict", "issue"})
    if extra:
        raise ValueError(f"unexpected field(s) {extra}; expected verdict and, to revise, issue")
    if verdict == "proceed":
        return {"verdict": "proceed", "issue": ""}
    if verdict != "revise" or not issue:
        raise ValueError('verdict must be "proceed", or "revise" with a non-empty "issue"')
    return {"verdict": "revise", "issue": issue}


def reflection_note(issue: str) -> Message:
    """The agent-only note carrying a review's issue."""
    return {"role": "assistant", "content": f"{REFLECTION_PREFIX} Before changing records: {issue}"}


# ---- the agent ------------------------------------------------------------------------------


class SaberAgent(AgentWrapper):
    """The task agent behind SABER's cleaning, reflection and confirmation gate (module
    docstring). ``reviewer`` is the agent's own model (the paper's single backbone), decoding
    with ``sampling``."""

    def __init__(self, task_agent: Agent, reviewer: LLM, sampling: SamplingParams,
                 config: SaberConfig):
        super().__init__(task_agent)
        self.name = NAME
        self.reviewer, self.sampling, self.config = reviewer, sampling, config
        self.policy = ""
        self.writes: set[str] = set()  # the domain's tau2 WRITE tools
        self.asked: set[str] = set()  # signatures of the calls the user was last asked about

    def reset(self, domain: str, task_view: TaskView) -> str | None:
        self.policy, self.writes, self.asked = task_view.policy, write_tools(domain), set()
        return self.inner.reset(domain, task_view)

    def act(self, messages: list[Message], tools: list[dict[str, Any]]) -> AgentTurn:
        view, cleaned = clean_context(messages) if self.config.clean_context else (messages, 0)
        record: dict[str, Any] = {"router": NAME, "cleaned": cleaned}
        turn = self.inner.act(view, tools)
        writes = self._mutating(turn)
        if writes and not self._consented(writes) and self.config.reflection:
            turn, record = self._reflect(view, tools, turn, writes, record)
            writes = self._mutating(turn)
        if not writes:
            return tagged(turn, "act", decision={**record, "route": "act"})
        if self._consented(writes):
            self.asked = set()  # one consent, one execution
            return tagged(turn, "act", decision={**record, "route": "act", "gate": "confirmed"})
        self.asked = {call_signature(c) for c in writes}
        request = AgentTurn(content=confirmation_text(writes), extra_messages=turn.extra_messages)
        return tagged(request, "confirm", decision={**record, "route": "confirm", "gate": "asked",
                                                    "calls": [c.name for c in writes]})

    def _mutating(self, turn: AgentTurn) -> list[ToolCall]:
        return [c for c in turn.tool_calls if c.error is None and c.name in self.writes]

    def _consented(self, writes: list[ToolCall]) -> bool:
        """The user was last asked about exactly these calls (the agent proposes them again)."""
        return {call_signature(c) for c in writes} == self.asked

    def _reflect(self, view: list[Message], tools: list[dict[str, Any]], turn: AgentTurn,
                 writes: list[ToolCall], record: dict[str, Any]) -> tuple[AgentTurn, dict]:
        """Review the mutating proposal; on ``revise`` the agent proposes again with the note."""
        outcome = ask_strict_json(self.reviewer, reflection_prompt(self.policy, view, writes),
                                  read_verdict, self.sampling)
        review = outcome.value or {"verdict": "proceed", "issue": ""}
        error = outcome.errors[-1] if outcome.failed else None
        record = {**record, "reflection": {**review, "valid": not outcome.failed, "error": error}}
        if review["verdict"] != "revise":
            return turn, record
        note = reflection_note(review["issue"])
        revised = self.inner.act([*view, note], tools)
        revised.extra_messages = [note, *revised.extra_messages]
        return revised, record


def build(context: BaselineContext) -> Agent:
    """SABER for one episode: the task agent, reviewed by the agent backbone (``reflection``)."""
    return SaberAgent(context.task_agent, context.backbone("reflection"),
                      context.decision_sampling(), context.episode.recipe.eval.saber)
