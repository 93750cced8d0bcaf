"""``ask-before-plan``: predict whether clarification is needed before the agent plans, then ask.

Source: Zhang et al. (2024), "Ask-before-Plan: Proactive Language Agents for Real-World
Planning" (Findings of EMNLP 2024; code announced at github.com/magicgh/Ask-before-Plan, not
read here). Their Clarification-Execution-Planning framework splits the agent in three: a
clarification agent predicts, from the user-agent conversation and the agent-environment
interaction so far, whether the instruction still needs clarification and asks the question; an
execution agent gathers information with tools; a planning agent writes the plan once
clarification is done.

What it does here: before the task agent's first mutating action (a tau2 ``write`` tool: the
plan being carried out), a clarification predictor on the agent backbone (role
``clarification_predictor``) reads the dialogue, tool results included, and answers strict JSON
``{"clarification_needed": bool, "missing": str}``. When it predicts a need, the question is
written on the agent backbone (``models.agent``, counted as ``question_writer``, with the query
generator's clarify template; its ``NO`` or an invalid answer lets the agent act) and sent to the user (turn tag ``clarify``); otherwise the task agent acts. The task agent
is the execution and planning agent at once. After the first write call the predictor is no
longer asked (decision ``phase: "execution"``). An invalid predictor reply lets the agent act and
is recorded (``valid: false``).

Simplified: the predictor is prompted, not trajectory-tuned; the question is written by a second
backbone call with the query generator's clarify prompt rather than by the predictor itself
(never by prour's trained generator); execution
and planning are the one task agent of the recipe, without memory recollection.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from prour.eval.agent import ProactiveAgent, RouteChoice
from prour.eval.baselines import ask_strict_json, history_mutated, text_fields
from prour.llm.base import Message
from prour.llm.history import render_history

if TYPE_CHECKING:  # pragma: no cover
    from prour.env.agents import Agent
    from prour.eval.baselines import BaselineContext
    from prour.llm.base import LLM, SamplingParams

NAME = "ask-before-plan"

PREDICTOR_PROMPT = """\
You are the clarification agent of a customer-service assistant that works with tools. Before \
the assistant carries out the customer's request, predict whether the request still lacks \
something only the customer can tell: an intention, a preference, or a choice among options. \
Facts the assistant can look up with its tools, or read in earlier tool results, need no \
clarification, and neither does anything the customer has already said.

Tools the assistant can use: {tools}

Conversation so far:
{history}

Answer with strict JSON only: \
{{"clarification_needed": true | false, "missing": "<what the customer must still tell, or \
empty>"}}"""


def check_prediction(data: dict[str, Any]) -> tuple[bool, str]:
    """(needed, missing) of a predictor reply; ValueError naming what is wrong."""
    needed = data.get("clarification_needed")
    if not isinstance(needed, bool):  # ask_json expects ValueError for a rejected reply
        raise ValueError(  # noqa: TRY004
            f"clarification_needed must be true or false, got {needed!r}")
    return needed, text_fields(data, ("missing",))["missing"]


class ClarificationPredictor:
    """Routes clarify while the predictor sees a need before the first mutating action."""

    def __init__(self, llm: LLM, domain: str, sampling: SamplingParams):
        from prour.env.environment import tool_schemas

        self.llm, self.domain, self.sampling = llm, domain, sampling
        self.tools = ", ".join(s["function"]["name"] for s in tool_schemas(domain))

    def choose(self, messages: Sequence[Message], seed: int) -> RouteChoice:
        if history_mutated(self.domain, list(messages)):
            return RouteChoice("act", {"router": NAME, "route": "act", "phase": "execution"})
        prompt = PREDICTOR_PROMPT.format(tools=self.tools,
                                         history=render_history(messages) or "(empty)")
        outcome = ask_strict_json(self.llm, prompt, check_prediction, self.sampling)
        record: dict[str, Any] = {"router": NAME, "phase": "before-plan",
                                  "valid": not outcome.failed}
        if outcome.failed:
            return RouteChoice("act", {**record, "route": "act", "error": outcome.errors[-1]})
        needed, missing = outcome.value
        route = "clarify" if needed else "act"
        return RouteChoice(route, {**record, "route": route, "needed": needed, "missing": missing})


def build(context: BaselineContext) -> Agent:
    predictor = ClarificationPredictor(context.backbone("clarification_predictor"),
                                       context.domain, context.decision_sampling())
    return ProactiveAgent(context.task_agent, predictor, context.new_generator(),
                          routes=("act", "clarify"), new_budget=context.budget)
