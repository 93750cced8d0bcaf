"""SAGE-Agent baseline: structured uncertainty over tool parameters, the highest-EVPI question.

Source: Suri et al., "Structured Uncertainty guided Clarification for LLM Agents", Findings of
ACL 2026 (arXiv 2511.08798), as the Prour paper (section 4, A.2) re-implements it on the task
agent's backbone.

What it does. Before the task agent's tool call runs, the agent's model proposes more candidate
calls for the same step (one batched call of ``eval.sage_agent.samples`` samples at
``eval.sage_agent.temperature``, counted as role ``sampler``). The candidates define a belief over
the intended call and, through their arguments, a structured uncertainty over each *aspect*: the
tool name and every argument key. For an aspect ``a`` with value ``v_a(c)`` in candidate ``c``,
the expected value of perfect information is the gain in the probability of executing the
intended call if the user told us ``a``::

    EVPI(a) = Σ_v max_{c : v_a(c) = v} p(c)  -  max_c p(c)

The agent asks about the aspect with the largest ``EVPI(a) - cost(a)`` when that is positive,
where ``cost(a) = ask_cost + repeat_cost × (times a was asked before)`` (``eval.sage_agent``; the
paper's aspect-based cost that keeps it from asking the same thing twice); otherwise the task
agent's own call runs. The question (turn tag ``clarify``) names the aspect and the values the
candidates hold, most probable first; the decision (belief, EVPI and cost of every informative
aspect, the aspect asked) is kept in the step meta.

What prour simplified. The candidate set is the agent's own samples (no separate domain
constraints or schema-enumerated parameter domains); the belief is their empirical frequency;
only the first tool call of a turn is a candidate, and samples that write to the user are left
out; a turn that writes to the user is never questioned; the question is a fixed template (the
paper phrases it with the model), so ``models.generator`` plays no part; the belief is rebuilt each
step from the dialogue, where the user's answer now is, instead of a Bayesian update.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prour.env.agents import AgentTurn, TaskView
from prour.eval.agent import AgentWrapper
from prour.eval.baselines import tagged
from prour.llm.base import LLM, Message, ToolCall
from prour.router.candidates import canonical_json

if TYPE_CHECKING:  # pragma: no cover
    from prour.config.eval import SageAgentConfig
    from prour.env.agents import Agent, LLMAgent
    from prour.eval.baselines import BaselineContext

NAME = "sage-agent"

TOOL_ASPECT = "tool"
"""The aspect "which tool"; every other aspect is an argument key."""
UNSET = "<not given>"
"""An argument a candidate leaves out."""
SAMPLE_SEEDS = 1_000_000
"""Offset of the candidates' seeds from the task agent's (``seed * 1000 + call``)."""


@dataclass(frozen=True)
class Candidate:
    """One proposed tool call: the tool and its arguments (each value as canonical JSON)."""

    tool: str
    arguments: tuple[tuple[str, str], ...] = ()

    def value(self, aspect: str) -> str:
        """This candidate's value of ``aspect`` (:data:`UNSET` for an argument it leaves out)."""
        if aspect == TOOL_ASPECT:
            return self.tool
        return dict(self.arguments).get(aspect, UNSET)


def candidate(tool: str, arguments: dict[str, Any] | None = None) -> Candidate:
    args = arguments if isinstance(arguments, dict) else {}
    return Candidate(tool, tuple(sorted((k, canonical_json(v)) for k, v in args.items())))


def belief(candidates: Sequence[Candidate]) -> dict[Candidate, float]:
    """Empirical probability of each distinct candidate, most frequent first."""
    if not candidates:
        raise ValueError("the belief needs at least one candidate")
    counts = Counter(candidates)
    total = len(candidates)
    return {c: n / total for c, n in counts.most_common()}


def aspects(beliefs: dict[Candidate, float]) -> list[str]:
    """The tool aspect, then every argument key any candidate uses (sorted)."""
    keys = {key for c in beliefs for key, _ in c.arguments}
    return [TOOL_ASPECT, *sorted(keys)]


def evpi(beliefs: dict[Candidate, float], aspect: str) -> float:
    """Expected value of perfect information about ``aspect`` (module docstring), in [0, 1)."""
    best: dict[str, float] = {}
    for c, p in beliefs.items():
        value = c.value(aspect)
        best[value] = max(best.get(value, 0.0), p)
    return sum(best.values()) - max(beliefs.values())


def aspect_values(beliefs: dict[Candidate, float], aspect: str) -> list[str]:
    """The values the candidates hold for ``aspect``, most probable first."""
    mass: Counter[str] = Counter()
    for c, p in beliefs.items():
        mass[c.value(aspect)] += p
    return [value for value, _ in mass.most_common()]


@dataclass(frozen=True)
class AspectScore:
    aspect: str
    evpi: float
    cost: float

    @property
    def net(self) -> float:
        return self.evpi - self.cost


def score_aspects(beliefs: dict[Candidate, float], asked: Counter[str], ask_cost: float,
                  repeat_cost: float) -> list[AspectScore]:
    """EVPI and cost of every aspect, best net value first (ties: the listed order)."""
    scores = [AspectScore(a, evpi(beliefs, a), ask_cost + repeat_cost * asked[a])
              for a in aspects(beliefs)]
    return sorted(scores, key=lambda s: -s.net)


def best_question(scores: Sequence[AspectScore]) -> AspectScore | None:
    """The aspect to ask about: the best net value when it is positive, else None (act)."""
    return scores[0] if scores and scores[0].net > 0 else None


def _readable(value: str) -> str:
    if value == UNSET:
        return "none"
    try:
        decoded = json.loads(value)
    except json.JSONDecodeError:
        return value
    return decoded if isinstance(decoded, str) else value


def question_text(aspect: str, values: Sequence[str]) -> str:
    """The question about ``aspect`` offering the candidates' values."""
    if aspect == TOOL_ASPECT:
        options = [v.replace("_", " ") for v in values]
        subject = "what you would like me to do"
    else:
        options = [_readable(v) for v in values]
        subject = f"which {aspect.replace('_', ' ')} you mean"
    listed = ", ".join(f'"{o}"' for o in options[:-1]) + f', or "{options[-1]}"' \
        if len(options) > 1 else f'"{options[0]}"'
    return f"Before I continue, could you tell me {subject}: {listed}?"


# ---- the agent ----------------------------------------------------------------------------


def turn_candidate(tool_calls: Sequence[ToolCall]) -> Candidate | None:
    """The candidate a turn stands for: its first tool call (None for a message to the user)."""
    if not tool_calls:
        return None
    first = tool_calls[0]
    return candidate(first.name, first.arguments if first.error is None else None)


class SageAgent(AgentWrapper):
    """The task agent with SAGE-Agent's EVPI question before its tool calls (module docstring).
    ``sampler`` is the agent's own model (the paper's single backbone), counted apart."""

    def __init__(self, task_agent: LLMAgent, sampler: LLM, config: SageAgentConfig):
        super().__init__(task_agent)
        self.name, self.task_agent = NAME, task_agent
        self.sampler, self.config = sampler, config
        self.asked: Counter[str] = Counter()
        self.seed, self.step = 0, 0

    def reset(self, domain: str, task_view: TaskView) -> str | None:
        self.asked, self.seed, self.step = Counter(), task_view.seed, 0
        return self.task_agent.reset(domain, task_view)

    def act(self, messages: list[Message], tools: list[dict[str, Any]]) -> AgentTurn:
        self.step += 1
        turn = self.task_agent.act(messages, tools)
        if not turn.tool_calls:
            return tagged(turn, "act", decision={"router": NAME, "route": "act", "skipped": True,
                                                 "why": "message to the user"})
        proposals = [turn_candidate(turn.tool_calls), *self._samples(messages, tools)]
        beliefs = belief([c for c in proposals if c is not None])  # tool calls only
        scores = score_aspects(beliefs, self.asked, self.config.ask_cost, self.config.repeat_cost)
        chosen = best_question(scores)
        record = decision_record(beliefs, scores, chosen)
        if chosen is None:
            return tagged(turn, "act", decision=record)
        self.asked[chosen.aspect] += 1
        question = question_text(chosen.aspect, aspect_values(beliefs, chosen.aspect))
        return tagged(AgentTurn(content=question), "clarify", decision=record)

    def _samples(self, messages: list[Message],
                 tools: list[dict[str, Any]]) -> list[Candidate | None]:
        """``eval.sage_agent.samples`` more proposals for this step from the agent's model, in
        one call (a sample that writes to the user is None)."""
        cfg = self.config
        request = self.task_agent.request(messages, tools,
                                          seed=SAMPLE_SEEDS + self.seed * 1000 + self.step,
                                          n=cfg.samples, temperature=cfg.temperature)
        completions = self.sampler.chat([request])[0]
        return [turn_candidate(c.tool_calls) for c in completions]


def decision_record(beliefs: dict[Candidate, float], scores: Sequence[AspectScore],
                    chosen: AspectScore | None) -> dict[str, Any]:
    """What the step meta keeps of a decision: belief, every informative aspect's EVPI and cost,
    and the aspect asked about (None: the agent's call ran)."""
    return {
        "router": NAME,
        "route": "act" if chosen is None else "clarify",
        "belief": [{"tool": c.tool, "arguments": dict(c.arguments), "p": round(p, 6)}
                   for c, p in beliefs.items()],
        "aspects": [{"aspect": s.aspect, "evpi": round(s.evpi, 6), "cost": s.cost}
                    for s in scores if s.evpi > 0],
        "asked": None if chosen is None else chosen.aspect,
    }


def build(context: BaselineContext) -> Agent:
    """SAGE-Agent for one episode: candidates from the agent backbone (counted as ``sampler``)."""
    return SageAgent(context.task_agent, context.backbone("sampler"),
                     context.episode.recipe.eval.sage_agent)
