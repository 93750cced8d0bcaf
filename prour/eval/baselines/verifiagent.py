"""``verifiagent``: meta- and tool-based verification of each drafted step; no questions.

Source: Han, Buntine and Shareghi (2025), "VerifiAgent: a Unified Verification Agent in Language
Model Reasoning" (Findings of EMNLP 2025; code at github.com/Jiuzhouh/VerifiAgent, not read
here). VerifiAgent checks a candidate solution at two levels: meta-verification (is it complete
and consistent?) and tool-based adaptive verification (it picks a tool suited to the reasoning
type and checks correctness with it); its feedback lets the model revise the solution.

What it does here, at every agent step: the task agent drafts its next step (a tool call or a
message); a meta-verifier on the agent backbone (role ``meta_verifier``) reads the agent's
policy, the dialogue and the draft and answers strict JSON ``{"verdict": "accept" | "revise" |
"check", "issue": str, "query": str}``:

- ``accept``: the draft is the step (turn tag ``act``);
- ``revise``: the draft is incomplete or inconsistent; the issue goes to the agent as a
  verification note and the agent drafts again (tags ``verify``, ``act``);
- ``check``: correctness rests on a fact of the world; the read-only tool verifier on the agent
  backbone (role ``tool_verifier``, prour's ReAct verifier over tau2's READ tools on a copy of
  the live environment) answers ``query``; its evidence goes to the agent as a note and the
  agent drafts again (tags ``verify``, ``act``).

The redraft is final (one verification round per step). Notes are the agent's alone (never sent
to the user or scored). The agent's bare stop token is not verified. An invalid meta-verifier
reply, or a failed tool verification, keeps the draft (recorded). It never asks the user.

Simplified: tau2's read-only tools stand for VerifiAgent's tool box (Python, search, symbolic
solvers), chosen by the ReAct verifier rather than by reasoning type; one revision per step; the
meta-verifier is prompted on the agent backbone rather than a separate verifier model.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from prour.env.agents import AgentTurn, TaskView
from prour.eval import agent as proactive
from prour.eval.agent import EVIDENCE_PREFIX, AgentWrapper, evidence_note, is_stop_only
from prour.eval.baselines import ask_strict_json, tagged, text_fields
from prour.llm.base import Message
from prour.llm.history import render_history, render_message

if TYPE_CHECKING:  # pragma: no cover
    from prour.env.agents import Agent
    from prour.eval.baselines import BaselineContext
    from prour.llm.base import LLM, SamplingParams
    from prour.rollout.verifier import Verifier

logger = logging.getLogger(__name__)

NAME = "verifiagent"
VERDICTS = ("accept", "revise", "check")

META_PROMPT = """\
You verify one step of a customer-service agent before it is carried out.

The agent's instructions and policy:
{policy}

Conversation so far:
{history}

The agent's proposed next step:
{draft}

Meta-verification: is the step complete (every argument and statement it needs is present and \
supported by the conversation or earlier tool results) and consistent (nothing contradicts the \
customer, earlier tool results or the policy)? If it is, but its correctness rests on a fact the \
agent has not looked up (a status, a price, a policy condition, a calculation), ask for a check \
with the read-only tools instead of guessing.

Answer with strict JSON only: {{"verdict": "accept" | "revise" | "check", "issue": "<what is \
incomplete or inconsistent, or empty>", "query": "<for check: one question a read-only lookup \
can answer; else empty>"}}"""


def check_verdict(data: dict[str, Any]) -> tuple[str, str, str]:
    """(verdict, issue, query) of a meta-verifier reply; ValueError naming what is wrong."""
    verdict, text = data.get("verdict"), text_fields(data, ("issue", "query"))
    if verdict not in VERDICTS:
        raise ValueError(f"verdict must be one of {', '.join(VERDICTS)}, got {verdict!r}")
    needed = {"check": "query", "revise": "issue"}.get(verdict)
    if needed is not None and not text[needed]:
        raise ValueError(f"a {verdict} verdict needs a non-empty {needed}")
    return verdict, text["issue"], text["query"]


def draft_text(turn: AgentTurn) -> str:
    """The drafted step as the history renders an agent message."""
    calls = [{"name": c.name, "arguments": c.arguments} for c in turn.tool_calls]
    lines = render_message({"role": "assistant", "content": turn.content, "tool_calls": calls})
    return "\n".join(lines) or "(an empty message)"


def meta_note(draft: str, issue: str) -> Message:
    """The agent-only note carrying the meta-verifier's objection to a draft."""
    text = (f"{EVIDENCE_PREFIX} Meta-check of the proposed step ({draft}): {issue} "
            "Revise the step.")
    return {"role": "assistant", "content": text}


class VerifiAgent(AgentWrapper):
    """Drafts with the task agent, verifies the draft, redrafts with the feedback."""

    def __init__(self, task_agent: Agent, meta_llm: LLM, tool_verifier: Verifier,
                 sampling: SamplingParams):
        super().__init__(task_agent)
        self.name = NAME
        self.meta_llm, self.tool_verifier, self.sampling = meta_llm, tool_verifier, sampling
        self.view: TaskView | None = None
        self.env: Any = None

    def reset(self, domain: str, task_view: TaskView) -> str | None:
        self.view, self.env = task_view, None
        return self.inner.reset(domain, task_view)

    def bind_environment(self, env: Any) -> None:
        self.env = env
        super().bind_environment(env)

    def act(self, messages: list[Message], tools: list[dict[str, Any]]) -> AgentTurn:
        draft = self.inner.act(messages, tools)
        if not draft.tool_calls and is_stop_only(draft.content):
            return tagged(draft, "act", decision={"router": NAME, "route": "act",
                                                  "verdict": "stop"})
        text = draft_text(draft)
        outcome = ask_strict_json(self.meta_llm, self.meta_prompt(messages, text), check_verdict,
                                  self.sampling)
        if outcome.failed:
            return tagged(draft, "act", decision={"router": NAME, "route": "act", "valid": False,
                                                  "error": outcome.errors[-1]})
        verdict, issue, query = outcome.value
        decision = {"router": NAME, "route": "act" if verdict == "accept" else "verify",
                    "valid": True, "verdict": verdict, "issue": issue, "query": query}
        if verdict == "accept":
            return tagged(draft, "act", decision=decision)
        if verdict == "revise":
            record = {"kind": "meta", "answer": issue, "failed": False}
            return self.redraft(messages, tools, meta_note(text, issue), decision, record)
        return self.tool_check(messages, tools, draft, decision)

    def tool_check(self, messages: list[Message], tools: list[dict[str, Any]], draft: AgentTurn,
                   decision: dict[str, Any]) -> AgentTurn:
        """Tool-based verification of ``decision["query"]``, then the redraft with its evidence
        (the draft stands when the verifier failed)."""
        view = self.view
        if view is None:
            raise RuntimeError("verifiagent acted before reset")
        query = decision["query"]
        result = proactive.verify_in_episode(self.tool_verifier, query, messages, self.env,
                                             view.domain, view.task_id)
        record = {**proactive.verifier_record(result), "kind": "tool"}
        if result.failed:
            logger.warning("tool verification failed (%s); the draft stands", result.error)
            return tagged(draft, "act", decision=decision, verify=record)
        return self.redraft(messages, tools, evidence_note(query, result.answer), decision, record)

    def redraft(self, messages: list[Message], tools: list[dict[str, Any]], note: Message,
                decision: dict[str, Any], record: dict[str, Any]) -> AgentTurn:
        """The agent's step again, with the verification note in its context (and transcript)."""
        turn = self.inner.act([*messages, note], tools)
        turn.extra_messages = [note, *turn.extra_messages]
        return tagged(turn, "act", decision=decision, verify=record)

    def meta_prompt(self, messages: list[Message], draft: str) -> str:
        policy = messages[0]["content"] if messages and messages[0].get("role") == "system" \
            else "(none given)"
        return META_PROMPT.format(policy=policy, history=render_history(messages) or "(empty)",
                                  draft=draft)


def build(context: BaselineContext) -> Agent:
    return VerifiAgent(context.task_agent, context.backbone("meta_verifier"),
                       context.verifier("tool_verifier"), context.decision_sampling())
