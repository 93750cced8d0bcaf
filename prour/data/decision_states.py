"""A trajectory's decision states (steps 2 and 6 of :mod:`prour.data.extract`): the history the
agent saw before each of its first decisions, what it then did, the task's next reference action
and the tool traffic that led there; then each routed state's target (step 4) and the instance
built from it, its history truncated to the prompt budget (step 5)."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any

from prour.config.data import DataConfig
from prour.data.collect import stable_seed, trajectory_id
from prour.data.normalize import Goal
from prour.data.schema import Instance, tool_traffic_hashes
from prour.data.truncate import PolicyTokens, truncate_history
from prour.env.trajectory import Trajectory, agent_view
from prour.llm.base import Message
from prour.rollout.query import PROMPTS_VERSION, query_prompt
from prour.router.candidates import RESPOND, canonical_json

DECISION_KINDS = ("agent_message", "agent_tool_call")


@dataclass
class DecisionState:
    """One agent decision point: the history the agent saw and what it then did."""

    trajectory_id: str
    domain: str
    task_id: str
    step: int  # index of the decision among the agent's decisions, from 0
    history: list[Message]
    action: str | None  # canonical JSON of the first tool call; None for a reply or bad call
    is_reply: bool
    successful: bool
    key: str = ""
    seed: int = 0
    env_history: list[Message] = field(default_factory=list)  # tool traffic before the decision
    gold: GoldNext | None = None  # the reference's next action (verify_target gold/reference)


def is_agent_decision(step: Any) -> bool:
    """An agent message or tool call that the task agent itself produced during the episode."""
    return (step.kind in DECISION_KINDS and not step.initial and not step.meta.get("greeting")
            and "teacher_query" not in step.meta)


def call_action(message: Message) -> str | None:
    """Canonical ``{"tool","arguments"}`` JSON of a message's first tool call (None if malformed)."""
    fn = (message.get("tool_calls") or [{}])[0].get("function") or {}
    try:
        arguments = json.loads(fn.get("arguments") or "{}")
    except (TypeError, json.JSONDecodeError):
        return None
    if not fn.get("name") or not isinstance(arguments, dict):
        return None
    return canonical_json({"tool": fn["name"], "arguments": arguments})


@dataclass(frozen=True)
class GoldNext:
    """The task's next reference action at a decision: its canonical JSON (None once every
    reference action is done), or ``on_reference`` False when the agent's calls left the path."""

    action: str | None
    on_reference: bool = True


def reference_actions(domain: str, task_id: str) -> list[Any]:
    """The task's reference actions the agent must take (tau2 ``Action``, requestor assistant)."""
    from prour.env.domains import get_task

    criteria = get_task(domain, task_id).evaluation_criteria
    return [a for a in (criteria.actions or []) if a.requestor == "assistant"] if criteria else []


def agent_calls(traj: Trajectory, before: int) -> list[dict[str, Any]]:
    """The agent's tool calls (``function`` dicts) in the episode before message ``before``: the
    task's initial history and the user's own calls are not the agent's."""
    return [call.get("function") or {} for s in traj.steps
            if s.kind == "agent_tool_call" and not s.initial and s.message_index < before
            for call in traj.messages[s.message_index].get("tool_calls") or []]


def matches(action: Any, function: dict[str, Any]) -> bool:
    """Whether a tool call is the reference action, by tau2's own comparison (its compare_args)."""
    from tau2.data_model.message import ToolCall

    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except (TypeError, json.JSONDecodeError):
        return False
    if not isinstance(arguments, dict) or not function.get("name"):
        return False
    return action.compare_with_tool_call(
        ToolCall(id="gold", name=function["name"], arguments=arguments))


def gold_next(reference: Sequence[Any], calls: Sequence[dict[str, Any]]) -> GoldNext:
    """The reference's next action after ``calls`` when they are its first actions, in order."""
    if len(calls) > len(reference) or not all(map(matches, reference, calls)):
        return GoldNext(None, on_reference=False)
    if len(calls) == len(reference):
        return GoldNext(None)
    action = reference[len(calls)]
    return GoldNext(canonical_json({"tool": action.name, "arguments": action.arguments}))


def reference_next(reference: Sequence[Any], calls: Sequence[dict[str, Any]],
                   write_tools: Collection[str]) -> GoldNext:
    """The earliest reference action no call in ``calls`` matches (tau2's order-free action
    check; extra calls allowed), or off the path once a call to one of ``write_tools`` matches
    no reference action. None once every reference action is matched."""
    for call in calls:
        if call.get("name") in write_tools and not any(matches(a, call) for a in reference):
            return GoldNext(None, on_reference=False)
    for action in reference:
        if not any(matches(action, call) for call in calls):
            return GoldNext(canonical_json({"tool": action.name, "arguments": action.arguments}))
    return GoldNext(None)


def agent_write_tools(domain: str) -> set[str]:
    """The domain's agent tools tau2 marks ``ToolType.WRITE``."""
    from prour.env.environment import tool_types

    return {name for name, kind in tool_types(domain).items() if kind == "write"}


def decision_states(traj: Trajectory, cfg: DataConfig) -> list[DecisionState]:
    """The first ``cfg.max_decisions`` decision states of a trajectory."""
    tid = trajectory_id(traj)
    ok = traj.reward is not None and traj.reward >= cfg.success_threshold
    decisions = [s for s in traj.steps if is_agent_decision(s)][: cfg.max_decisions]
    reference = reference_actions(traj.domain, traj.task_id) \
        if cfg.verify_target in ("gold", "reference") else None
    writes = agent_write_tools(traj.domain) if cfg.verify_target == "reference" else set()
    states = []
    for t, step in enumerate(decisions):
        before = [s for s in traj.steps if s.message_index < step.message_index]
        seen = agent_view(traj.messages[: step.message_index], before)
        history = [m for m in seen if m.get("role") != "system"]
        message = traj.messages[step.message_index]
        is_reply = step.kind == "agent_message"
        action = None if is_reply else call_action(message)
        states.append(DecisionState(tid, traj.domain, traj.task_id, t, history, action, is_reply,
                                    ok, seed=stable_seed(tid, t),
                                    env_history=tool_traffic(traj, step.message_index)))
        if reference is not None:
            calls = agent_calls(traj, step.message_index)
            states[-1].gold = reference_next(reference, calls, writes) \
                if cfg.verify_target == "reference" else gold_next(reference, calls)
    return states


def tool_traffic(traj: Trajectory, before: int) -> list[Message]:
    """Every tool call that reached the environment before message ``before`` and its result,
    verbatim and in order (agent's and user's). Left out: the task's initial history, which
    ``make_env`` applies itself, and malformed calls, which never reached tau2."""
    initial = {s.message_index for s in traj.steps if s.initial}
    unsent = {s.tool_call_id for s in traj.steps if s.kind == "tool_result" and not s.executed}
    traffic = []
    for i, message in enumerate(traj.messages[:before]):
        if i in initial:
            continue
        if message.get("role") == "tool" and message.get("tool_call_id") not in unsent:
            traffic.append(message)
        calls = [c for c in message.get("tool_calls") or [] if c.get("id") not in unsent]
        if calls:
            traffic.append({**message, "tool_calls": calls})
    return traffic


# ---- targets and instances ------------------------------------------------------------------


@dataclass
class Routed:
    """A state's route and uncertainty under the current thresholds, and its decomposer cost."""

    route: str
    au: float | None  # None: not measured (a data.states: every row; no decomposer ran)
    eu: float | None
    total: float | None
    empty: bool
    calls: int
    requests: int


def target_of(state: DecisionState, mode: str, goals: dict[tuple[str, str], Goal],
              cfg: DataConfig) -> tuple[str | None, str | None]:
    """(target, None), or (None, why the state is dropped)."""
    if mode == "clarify":
        goal = goals.get((state.domain, state.task_id))
        if goal is None:
            raise KeyError(f"no normalized goal for {state.domain}/{state.task_id}; "
                           "run `prour normalize` on these tasks first")
        return (goal.goal, None) if goal.goal else (None, "clarify_empty_goal")
    if cfg.only_successful and not state.successful:
        return None, "verify_unsuccessful"
    if cfg.verify_target in ("gold", "reference"):
        if state.gold is None:
            raise ValueError(f"trajectory {state.trajectory_id} decision {state.step}: no "
                             "reference next action (decision_states ran with another "
                             f"data.verify_target than {cfg.verify_target})")
        if not state.gold.on_reference:
            return None, "verify_off_reference"
        return (state.gold.action, None) if state.gold.action else reply_target(cfg)
    if state.is_reply:
        return reply_target(cfg)
    return (state.action, None) if state.action else (None, "verify_bad_call")


def reply_target(cfg: DataConfig) -> tuple[str | None, str | None]:
    """The verify target when the next action is a text reply: dropped, or ``respond``."""
    if cfg.verify_on_reply == "drop":
        return None, "verify_reply"
    return canonical_json({"tool": RESPOND, "arguments": {}}), None


def decision_hash(state: DecisionState) -> str:
    """DB hash of the environment at the state's decision (its tool traffic replayed)."""
    return decision_hashes([state])[0]


def decision_hashes(states: Sequence[DecisionState]) -> list[str]:
    """DB hash of the environment at each state's decision. Consecutive states of one trajectory
    share one replay of its tool traffic, advanced to each decision in turn; a replayed result
    that differs from the recorded one is an error naming the trajectory and decision."""
    hashes: list[str] = []
    for (_, domain, task_id), group in groupby(
            states, key=lambda s: (s.trajectory_id, s.domain, s.task_id)):
        trajectory = list(group)
        replayed = tool_traffic_hashes(domain, task_id, (s.env_history for s in trajectory))
        for state in trajectory:
            try:
                hashes.append(next(replayed))
            except ValueError as exc:
                raise ValueError(
                    f"trajectory {state.trajectory_id} decision {state.step}: {exc}") from exc
    return hashes


def build_instance(state: DecisionState, routed: Routed, target: str, tokens: PolicyTokens,
                   budget: int, db_hash: str) -> Instance:
    """Truncate the history to the budget and assemble the instance for the routed mode
    (``db_hash``: :func:`decision_hash` of the state); :class:`~prour.data.truncate.OverBudget`
    when the state cannot fit."""
    mode = routed.route
    cut = truncate_history(state.history, lambda h: tokens.chat(query_prompt(mode, h)), budget)
    return Instance(
        mode=mode, domain=state.domain, task_id=state.task_id, trajectory_id=state.trajectory_id,
        step=state.step, history=cut.messages, prompt=query_prompt(mode, cut.messages),
        target=target, au=routed.au, eu=routed.eu, total=routed.total, truncated=cut.truncated,
        dropped_messages=cut.dropped, prompt_tokens=cut.tokens,
        target_tokens=max(1, tokens.text(target)), decomposer_calls=routed.calls,
        prompts_version=PROMPTS_VERSION, env_history=state.env_history, db_hash=db_hash,
    )
