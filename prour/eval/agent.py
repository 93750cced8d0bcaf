"""The proactive agent (prour paper 3, 4): before each task-agent step, route act / clarify / verify.

At every agent step a router (the AU/EU decomposer, or the prompted LLM router) picks a mode:

- ``clarify``: the query generator (clarify template) writes one question; it is sent to the user
  simulator as an ordinary agent message and the user's reply comes back on the next turn;
- ``verify``: the generator (verify template) writes one query; the verifier answers it from
  read-only tools on a copy of the live environment; the answer is added to the agent's context
  as an agent note (never shown to the user, never scored by tau2) and the task agent acts;
- ``act``: the task agent acts.

A generator answer of ``NO``, an invalid one, a disabled route (clarify-only / verify-only) and a
step without a router call (``router.budget`` spent, or between every ``router.every_n``-th steps;
the decision records ``skipped`` and why) all fall back to ``act``. The episode's router settings
and call counts go to the trajectory's meta (:meth:`ProactiveAgent.episode_meta`).
Every agent step records its route, the router's decision and its turn tag (:data:`TURN_TAGS`:
question, confirmation, verification, act) in the step meta; :func:`turn_labels` reads the tags
back and :func:`prour.eval.metrics.paper_split` turns them into the act / clarify / verify counts of the paper's
tables. Baselines (:mod:`prour.eval.baselines`) tag their turns the same way.

Model calls, and the tokens of chat calls, are counted per episode by :class:`CountingLLM`
proxies and written into each step's meta (``model_calls``, ``model_tokens``) by
:class:`MeteredAgent` / :class:`MeteredUser`.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from prour.config.router import RouterConfig
from prour.env.agents import Agent, AgentTurn, TaskView
from prour.env.prompts import AGENT_STOP
from prour.llm.base import (
    LLM,
    ChatRequest,
    Completion,
    Message,
    SamplingParams,
    ScoreRequest,
    ScoreResult,
)
from prour.rollout.query import ParsedQuery, parse_query, query_prompt
from prour.router.routing import ROUTES, DecomposerBudget, episode_budget

if TYPE_CHECKING:  # pragma: no cover
    from prour.env.trajectory import StepRecord, Trajectory
    from prour.env.users import UserSimulator, UserTurn
    from prour.rollout.verifier import Verifier, VerifierResult
    from prour.router.decomposer import Decomposer
    from prour.router.llm_router import LLMRouter

logger = logging.getLogger(__name__)

EVIDENCE_PREFIX = "[Verification]"
AGENT_TURN_KINDS = ("agent_message", "agent_tool_call")
TURN_TAGS = ("act", "clarify", "confirm", "verify")
"""What an agent turn did, stored as the step meta's ``turn`` (``verify`` is added by
:func:`step_labels` when the step carries verification evidence): ``clarify`` a question to the
user, ``confirm`` a request for the user's consent before a mutating action, ``verify`` evidence
from the world added to the agent's context, ``act`` the task agent's own step."""


# ---- model-call accounting ------------------------------------------------------------------


class CallCounts:
    """Backend calls of one episode side, by role; :meth:`take` returns what is new since the
    last take (so each step reports its own calls)."""

    def __init__(self) -> None:
        self._total: Counter[str] = Counter()
        self._taken: Counter[str] = Counter()
        self._tokens: Counter[str] = Counter()  # role.requests / .prompt / .sequences / .completion
        self._tokens_taken: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, key: str, n: int = 1) -> int:
        """Count ``n`` more ``key`` calls; returns how many there were before."""
        with self._lock:
            before = self._total[key]
            self._total[key] += n
        return before

    def take(self) -> dict[str, int]:
        with self._lock:
            new = self._total - self._taken
            self._taken = Counter(self._total)
        return dict(sorted(new.items()))

    def add_tokens(self, role: str, outputs: Sequence[Sequence[Completion]]) -> None:
        """Count the tokens of one chat call of ``role`` as its backend counted them: per request
        its prompt once, per returned sequence its generated tokens."""
        prompt = sum(out[0].prompt_tokens for out in outputs if out)
        completion = sum(c.completion_tokens for out in outputs for c in out)
        if prompt + completion == 0:  # a backend that counts none (scripted): nothing to record
            return
        with self._lock:
            self._tokens[f"{role}.requests"] += len(outputs)
            self._tokens[f"{role}.prompt"] += prompt
            self._tokens[f"{role}.sequences"] += sum(len(out) for out in outputs)
            self._tokens[f"{role}.completion"] += completion

    def take_tokens(self) -> dict[str, int]:
        """The token counts since the last take, by ``role.kind``."""
        with self._lock:
            new = self._tokens - self._tokens_taken
            self._tokens_taken = Counter(self._tokens)
        return dict(sorted(new.items()))


class CountingLLM:
    """A proxy to a shared backend that counts this episode's chat and score calls by role.

    With ``seed`` (the episode's, from its key), a sampled request that brings no seed of its own
    gets one from the seed, the role and the call's index in the episode
    (:func:`prour.eval.queue.keyed_seed`), not from the backend's stream, whose state depends on
    what other episodes ran before: an episode's outcome is the same in any queue order.

    With ``lane`` (the model's lane, :func:`prour.llm.registry.lane_name`), each call holds its
    requests' slots of that lane in the running evaluation queue
    (:func:`prour.eval.queue.request_slot`): every episode's calls to one model together stay
    at its in-flight limit."""

    def __init__(self, llm: LLM, counts: CallCounts, role: str, seed: int | None = None,
                 lane: str | None = None):
        self.llm, self.counts, self.role, self.seed, self.lane = llm, counts, role, seed, lane
        self.name = getattr(llm, "name", role)

    def chat(self, requests: Sequence[ChatRequest]) -> list[list[Completion]]:
        from prour.eval.queue import request_slot

        call = self.counts.add(f"{self.role}.chat")
        if self.seed is not None:
            requests = [self._seeded(request, call, i) for i, request in enumerate(requests)]
        with request_slot(self.lane, len(requests)):
            outputs = self.llm.chat(requests)
        self.counts.add_tokens(self.role, outputs)
        return outputs

    def _seeded(self, request: ChatRequest, call: int, item: int) -> ChatRequest:
        from dataclasses import replace

        from prour.eval.queue import keyed_seed

        sampling = request.sampling
        if sampling.seed is not None or sampling.temperature == 0:
            return request
        seed = keyed_seed(int(self.seed or 0), self.role, call, item)
        return replace(request, sampling=replace(sampling, seed=seed))

    def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        from prour.eval.queue import request_slot

        self.counts.add(f"{self.role}.score")
        with request_slot(self.lane, len(requests)):
            return self.llm.score(requests)

    def close(self) -> None:
        """The backend is shared across episodes: the harness closes it, not the proxy."""


class AgentWrapper:
    """Base of agent wrappers: forwards reset/act and the environment hook to ``inner``."""

    def __init__(self, inner: Agent):
        self.inner = inner
        self.name = inner.name
        self.model_name = inner.model_name

    def reset(self, domain: str, task_view: TaskView) -> str | None:
        return self.inner.reset(domain, task_view)

    def act(self, messages: list[Message], tools: list[dict[str, Any]]) -> AgentTurn:
        return self.inner.act(messages, tools)

    def act_directly(self, messages: list[Message], tools: list[dict[str, Any]]) -> AgentTurn:
        """Act without any proactive step (used when a drafted message must be replaced)."""
        direct = getattr(self.inner, "act_directly", None)
        return direct(messages, tools) if callable(direct) else self.inner.act(messages, tools)

    def episode_meta(self) -> dict[str, Any]:
        """The inner agent's record of the episode (the runner stores it in the trajectory)."""
        inner = getattr(self.inner, "episode_meta", None)
        return inner() if callable(inner) else {}

    def bind_environment(self, env: Any) -> None:
        """Hand the episode's live environment to the inner agent if it wants it."""
        bind = getattr(self.inner, "bind_environment", None)
        if callable(bind):
            bind(env)


class MeteredAgent(AgentWrapper):
    """Outermost wrapper: writes the step's backend calls into ``meta["model_calls"]``."""

    def __init__(self, inner: Agent, counts: CallCounts, name: str | None = None):
        super().__init__(inner)
        self.counts = counts
        self.name = name or inner.name

    def reset(self, domain: str, task_view: TaskView) -> str | None:
        self.counts.take()
        self.counts.take_tokens()
        return self.inner.reset(domain, task_view)

    def act(self, messages: list[Message], tools: list[dict[str, Any]]) -> AgentTurn:
        turn = self.inner.act(messages, tools)
        turn.meta = {**turn.meta, "model_calls": self.counts.take(), **_tokens(self.counts)}
        return turn


class MeteredUser:
    """User-simulator wrapper that writes each turn's backend calls into its meta."""

    def __init__(self, inner: UserSimulator, counts: CallCounts):
        self.inner, self.counts = inner, counts
        self.name, self.model_name = inner.name, inner.model_name

    def reset(self, domain: str, task: Any, seed: int = 0) -> None:
        self.counts.take()
        self.counts.take_tokens()
        self.inner.reset(domain, task, seed)

    def respond(self, messages: list[Message], tools: list[dict[str, Any]]) -> UserTurn:
        turn = self.inner.respond(messages, tools)
        turn.meta = {**turn.meta, "model_calls": self.counts.take(), **_tokens(self.counts)}
        return turn


def _tokens(counts: CallCounts) -> dict[str, dict[str, int]]:
    """The step's ``model_tokens`` meta, when its calls counted any tokens."""
    tokens = counts.take_tokens()
    return {"model_tokens": tokens} if tokens else {}


# ---- routers ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RouteChoice:
    """A router's mode for one step and what to record about the decision."""

    route: str
    record: dict[str, Any]


class Router(Protocol):
    """Picks act / clarify / verify from the agent's view of the dialogue."""

    def choose(self, messages: Sequence[Message], seed: int) -> RouteChoice: ...


class DecomposerRouter:
    """AU/EU routing through the decomposer (paper Eq. 6); the empty route when |C| = 0."""

    def __init__(self, decomposer: Decomposer):
        if decomposer.thresholds is None:
            raise ValueError("the decomposer has no (τ_AU, τ_EU) thresholds; set router.tau_au "
                             "and router.tau_eu or router.thresholds_file")
        self.decomposer = decomposer

    def choose(self, messages: Sequence[Message], seed: int) -> RouteChoice:
        decision = self.decomposer.decide(messages, seed=seed)
        route = decision.route or self.decomposer.config.empty_route
        record = {
            "router": "decomposer",
            "route": route,
            "au": decision.au,
            "eu": decision.eu,
            "total": decision.total,
            "empty": decision.empty,
            "interpretations": decision.interpretations,
            "candidates": len(decision.candidates),
            "invalid_actions": sum(decision.invalid.values()),
            "latency_s": round(decision.latency_s, 6),
        }
        return RouteChoice(route, record)


class PromptedRouter:
    """The LLM-router ablation: a prompted model names the mode directly (no AU/EU)."""

    def __init__(self, router: LLMRouter):
        self.router = router

    def choose(self, messages: Sequence[Message], seed: int) -> RouteChoice:
        decision = self.router.decide(messages)
        record = {"router": "llm", "route": decision.mode, "valid": decision.valid,
                  "rationale": decision.rationale, "error": decision.error or None}
        return RouteChoice(decision.mode, record)


# ---- query generator ----------------------------------------------------------------------


class QueryGenerator:
    """Writes one clarify or verify query with the generator model; decoding as the recipe says
    (:func:`prour.eval.components.query_generator` reads it: paper temperature 0.0, training's
    length and thinking)."""

    def __init__(self, llm: LLM, temperature: float, max_tokens: int, enable_thinking: bool):
        self.llm = llm
        self.temperature, self.max_tokens = temperature, max_tokens
        self.enable_thinking = enable_thinking

    def write(self, mode: str, messages: Sequence[Message], seed: int) -> tuple[ParsedQuery, str]:
        """The parsed decision (``ask`` / ``none`` / ``invalid``) and the raw text."""
        sampling = SamplingParams(temperature=self.temperature, max_tokens=self.max_tokens,
                                  seed=seed)
        request = ChatRequest(messages=query_prompt(mode, messages), sampling=sampling,
                              enable_thinking=self.enable_thinking)
        completion = self.llm.chat([request])[0][0]
        text = completion.text
        parsed = parse_query(text)
        if completion.finish_reason == "length" and parsed.kind != "invalid":
            parsed = ParsedQuery("invalid", reason="truncated at max_tokens",
                                 thinking=parsed.thinking)
        return parsed, text


def query_record(mode: str, parsed: ParsedQuery) -> dict[str, Any]:
    """What the step meta keeps of the generator's decision."""
    return {"mode": mode, "kind": parsed.kind, "question": parsed.question,
            "reason": parsed.reason}


def evidence_note(question: str, answer: str) -> Message:
    """The agent-only note carrying a verification exchange."""
    text = f"{EVIDENCE_PREFIX} I checked: {question.strip()}\nVerifier: {answer.strip()}"
    return {"role": "assistant", "content": text}


def verifier_record(result: VerifierResult) -> dict[str, Any]:
    """What the step meta keeps of a verifier reply (answer, grounding, tools used)."""
    return {"answer": result.answer, "grounded": result.grounded, "failed": result.failed,
            "error": result.error, "rounds": result.steps, "refused": list(result.refused),
            "tools": [c.name for c in result.tool_calls], "evidence": result.evidence}


# ---- the proactive agent ------------------------------------------------------------------


def default_budget() -> DecomposerBudget:
    """The per-episode budget of the ``router`` section's defaults (unlimited, every step)."""
    return episode_budget(RouterConfig())


@dataclass
class _EpisodeState:
    domain: str = ""
    task_id: str = ""
    seed: int = 0
    step: int = 0
    budget: DecomposerBudget = field(default_factory=default_budget)
    env: Any = None


class ProactiveAgent:
    """Wraps a task agent with routing, the query generator and the verifier (module docstring)."""

    name = "proactive"

    def __init__(
        self,
        task_agent: Agent,
        router: Router,
        generator: QueryGenerator,
        verifier: Verifier | None = None,
        routes: Sequence[str] = ROUTES,
        new_budget: Callable[[], DecomposerBudget] = default_budget,
    ):
        unknown = sorted(set(routes) - set(ROUTES))
        if unknown:
            raise ValueError(f"unknown routes {unknown}; valid: {', '.join(ROUTES)}")
        if "verify" in routes and verifier is None:
            raise ValueError("the verify route needs a verifier")
        self.task_agent, self.router, self.generator = task_agent, router, generator
        self.verifier = verifier
        self.routes = tuple(routes)
        self.new_budget = new_budget
        self.model_name = task_agent.model_name
        self.state = _EpisodeState()

    def reset(self, domain: str, task_view: TaskView) -> str | None:
        self.state = _EpisodeState(domain, task_view.task_id, task_view.seed,
                                   budget=self.new_budget())
        return self.task_agent.reset(domain, task_view)

    def bind_environment(self, env: Any) -> None:
        """The runner's live environment: the verifier works on a deep copy of it."""
        self.state.env = env

    def act(self, messages: list[Message], tools: list[dict[str, Any]]) -> AgentTurn:
        seed = self.state.seed * 1000 + self.state.step
        self.state.step += 1
        budget = self.state.budget
        if not budget.allow():
            why = "budget" if budget.exhausted else "every_n"
            return self._act(messages, tools,
                             {"route": "act", "decision": {"skipped": True, "why": why}})
        choice = self.router.choose(messages, seed)
        meta: dict[str, Any] = {"route": choice.route, "decision": choice.record}
        if choice.route not in self.routes:
            return self._act(messages, tools, {**meta, "disabled": True})
        if choice.route == "clarify":
            return self._clarify(messages, tools, seed, meta)
        if choice.route == "verify":
            return self._verify(messages, tools, seed, meta)
        return self._act(messages, tools, meta)

    def episode_meta(self) -> dict[str, Any]:
        """``router``: the episode's router settings (``router.budget``, ``router.every_n``) and
        how many decision steps ran the router (``calls``) or went to the base agent
        (``skipped``)."""
        budget = self.state.budget
        return {"router": {"budget": budget.max_calls, "every_n": budget.every_n,
                           "calls": budget.calls, "skipped": budget.skipped}}

    def act_directly(self, messages: list[Message], tools: list[dict[str, Any]]) -> AgentTurn:
        """The task agent's own step, no routing (a blocked question is being replaced)."""
        return self._act(messages, tools, {"route": "act", "redraft": True})

    def _act(self, messages: list[Message], tools: list[dict[str, Any]],
             meta: dict[str, Any]) -> AgentTurn:
        turn = self.task_agent.act(messages, tools)
        turn.meta = {**turn.meta, **meta, "turn": "act"}
        return turn

    def _query(self, mode: str, messages: list[Message], seed: int,
               meta: dict[str, Any]) -> tuple[ParsedQuery | None, dict[str, Any]]:
        """The generator's query for ``mode`` (None unless it asks something), recorded in meta."""
        parsed, _ = self.generator.write(mode, messages, seed)
        meta = {**meta, "query": query_record(mode, parsed)}
        return (parsed if parsed.kind == "ask" and parsed.question else None), meta

    def _clarify(self, messages: list[Message], tools: list[dict[str, Any]], seed: int,
                 meta: dict[str, Any]) -> AgentTurn:
        parsed, meta = self._query("clarify", messages, seed, meta)
        if parsed is None:
            return self._act(messages, tools, meta)
        return AgentTurn(content=parsed.question, meta={**meta, "turn": "clarify"},
                         reasoning=parsed.thinking)

    def _verify(self, messages: list[Message], tools: list[dict[str, Any]], seed: int,
                meta: dict[str, Any]) -> AgentTurn:
        parsed, meta = self._query("verify", messages, seed, meta)
        if parsed is None:
            return self._act(messages, tools, meta)
        result = self._answer(parsed.question, messages)
        meta["verify"] = verifier_record(result)
        if result.failed:
            logger.warning("verifier failed (%s); the agent acts without evidence", result.error)
            return self._act(messages, tools, meta)
        note = evidence_note(parsed.question, result.answer)
        turn = self._act([*messages, note], tools, meta)
        turn.extra_messages = [note, *turn.extra_messages]
        return turn

    def _answer(self, question: str, messages: list[Message]) -> VerifierResult:
        """Verifier answer on a copy of the live environment (or one rebuilt from the history)."""
        if self.verifier is None:  # __init__ refuses the verify route without one
            raise RuntimeError("verify was routed but the proactive agent has no verifier")
        state = self.state
        return verify_in_episode(self.verifier, question, messages, state.env, state.domain,
                                 state.task_id)


def verify_in_episode(verifier: Verifier, question: str, messages: list[Message], env: Any,
                      domain: str, task_id: str) -> VerifierResult:
    """The verifier's answer on a copy of the episode's live environment ``env``, or, without
    one (no runner hook), on the environment rebuilt from the agent's view of the history."""
    if env is not None:
        return verifier.answer(question, messages, env)
    from prour.rollout.verifier import environment_at

    rebuilt = environment_at(domain, task_id, messages)
    return verifier.answer(question, messages, rebuilt, copy_env=False)


# ---- turn labels --------------------------------------------------------------------------


def is_agent_turn(step: StepRecord) -> bool:
    """An agent decision step of the episode (not prior history, not the fixed greeting)."""
    return step.kind in AGENT_TURN_KINDS and not step.initial and not step.meta.get("greeting")


def step_labels(meta: dict[str, Any]) -> list[str]:
    """Turns one agent step stands for: ``verify`` when evidence was added, then its own tag
    (``meta["turn"]``, one of :data:`TURN_TAGS`; an untagged step acts)."""
    verify = meta.get("verify")
    labels = ["verify"] if isinstance(verify, dict) and not verify.get("failed") else []
    tag = meta.get("turn", "act")
    if tag not in TURN_TAGS:
        raise ValueError(f"agent step tagged {tag!r}; valid turn tags: {', '.join(TURN_TAGS)}")
    return [*labels, tag]


def turn_labels(trajectory: Trajectory) -> list[str]:
    """The turn tag of every agent turn, in order (:data:`TURN_TAGS`; untagged steps are act)."""
    return [label for step in trajectory.steps if is_agent_turn(step)
            for label in step_labels(step.meta)]


def is_stop_only(text: str | None) -> bool:
    """The agent's bare end-of-conversation token (not a message the user must read)."""
    return (text or "").strip() == AGENT_STOP
