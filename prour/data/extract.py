"""Step-level instance extraction (paper A.2.1): trajectories → routed state–mode instances.

1. Split trajectories into train/validation *by trajectory* (or by task) before anything else.
2. Keep each trajectory's first ``max_decisions`` agent decisions. The fixed greeting, the task's
   prior history and the teacher's questions are not agent decisions. The state history x_t is
   what the agent saw right before deciding: user turns, its own tool calls and results, earlier
   teacher exchanges; never the instruction, G* or reference actions. The agent's system prompt
   (the domain policy) is left out: the query-generator, decomposer and belief prompts never show
   it, and the verifier reads the policy of the row's domain itself.
3. Route every state with the decomposer (decisions cached in JSONL, resumable); drop act.
4. Targets: G* for clarify; for verify (``verify_target``), the canonical JSON
   ``{"tool","arguments"}`` of the decision's first tool call (``agent``, the default), or of the
   task's next reference action a_t* (paper A.2.1) by one of two rules. ``reference`` matches the
   agent's tool calls before the decision against the task's reference actions of requestor
   ``assistant`` (telecom's user-side actions left out) as tau2's action check does: order-free,
   a reference action is done once some call compares equal to it (``compare_with_tool_call``),
   extra calls allowed. The target is the earliest reference action, in reference order, not yet
   done. A WRITE call (tau2 ``ToolType.WRITE`` of the domain's agent tools) that matches no
   reference action takes the trajectory off the path: every later state of it is dropped
   (``verify_off_reference``); extra READ/GENERIC calls are fine. Several calls in one turn: they
   all count for the *next* decision; the turn's own state gets the earliest reference action not
   done before the turn (so the state deciding the stray write keeps that target: its history is
   still on the path). ``gold`` (older, stricter): the calls so far must be the first reference
   actions in order; other states are dropped. When the next action is a text reply to the user
   (``agent``: the decision is a reply; ``reference``/``gold``: the reference actions are all
   done), ``verify_on_reply`` says whether the state is dropped (default: the target is defined
   as a *tool call*) or gets the decomposer's ``respond`` action. Malformed tool calls give no
   target and are dropped. ``prour extract`` counts per domain how many verify states got a
   target and why the others were dropped (the card's "Verify targets" line).
5. Left-truncate the history to the prompt budget measured with the policy tokenizer, keeping the
   newest user message and what follows it (:mod:`prour.data.truncate`); a state that cannot fit
   even so is dropped and counted (``over_budget``).
6. Keep the untruncated tool traffic before the decision (every tool call and its result, the
   agent's and the user's) and the DB hash of the environment it leads to: the verifier's
   environment is rebuilt from it and checked against that hash (:mod:`prour.data.schema`).

What is left out is counted in the extraction summary, which the dataset card and ``prour
extract`` report (:func:`prour.data.card.drop_lines`): duplicate records (one trajectory per key
domain/task/seed/agent, the seed being the trial, so trials are distinct; a repeated key is named),
invalid input lines, errored episodes, trajectories of calibration-reserve tasks, and states per
reason (``over_budget``, ``verify_off_reference`` …). Trajectories carry the ``prompts_hash`` of
the agent's and user's prompts they were collected with ("unknown" in older files); the summary
counts them per hash and :func:`prompts_warning` says when they differ from each other or from
this code's.
"""

from __future__ import annotations

import json
import logging
import random
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path
from typing import Any

from prour.config.data import DataConfig
from prour.data.card import EXTRACT_SUMMARY, write_card
from prour.data.collect import stable_seed, trajectory_id
from prour.data.dataset import SPLITS, split_path, write_rows
from prour.data.decisions import DecisionCache, decision_key, decomposer_calls
from prour.data.normalize import Goal
from prour.data.schema import Instance, tool_traffic_hashes
from prour.data.truncate import OverBudget, PolicyTokens, truncate_history
from prour.env.trajectory import Trajectory, agent_view
from prour.files import write_atomic
from prour.llm.base import Message
from prour.rollout.query import PROMPTS_VERSION, query_prompt
from prour.router.candidates import RESPOND, canonical_json
from prour.router.decomposer import Decomposer
from prour.router.routing import route
from prour.router.uncertainty import Uncertainty

log = logging.getLogger(__name__)

DECISION_KINDS = ("agent_message", "agent_tool_call")


# ---------------------------------------------------------------- split


def split_keys(keys: Iterable[str], val_ratio: float, seed: int) -> dict[str, str]:
    """Assign each distinct key to train or validation: a seeded shuffle of the sorted keys, the
    first round(n·ratio) go to validation (at least one of each when n >= 2 and 0 < ratio)."""
    unique = sorted(set(keys))
    random.Random(seed).shuffle(unique)
    n_val = round(len(unique) * val_ratio)
    if val_ratio > 0 and len(unique) >= 2:
        n_val = min(max(n_val, 1), len(unique) - 1)
    return {key: ("validation" if i < n_val else "train") for i, key in enumerate(unique)}


def split_trajectories(trajectories: Sequence[Trajectory], cfg: DataConfig) -> dict[str, str]:
    """trajectory id → split, grouping by trajectory or by task as ``cfg.split_by`` says."""
    group = (lambda t: trajectory_id(t)) if cfg.split_by == "trajectory" else (
        lambda t: f"{t.domain}/{t.task_id}")
    assignment = split_keys((group(t) for t in trajectories), cfg.val_ratio, cfg.split_seed)
    return {trajectory_id(t): assignment[group(t)] for t in trajectories}


# ---------------------------------------------------------------- decision states


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


# ---------------------------------------------------------------- routing


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


def resolve(record: dict[str, Any], thresholds: tuple[float, float], empty_route: str) -> Routed:
    """Route a cached decision with the current thresholds (empty decisions: ``empty_route``)."""
    decision = record["decision"]
    calls, requests = decomposer_calls(decision.get("model_calls") or {})
    if decision.get("empty") or decision.get("au") is None:
        return Routed(empty_route, 0.0, 0.0, 0.0, True, calls, requests)
    unc = Uncertainty(float(decision["au"]), float(decision["eu"]), float(decision["total"]))
    return Routed(route(unc, *thresholds), unc.au, unc.eu, unc.total, False, calls, requests)


@dataclass
class Router:
    """The decomposer side of extraction: one decomposer per domain, its id and settings."""

    decomposer_for: Callable[[str], Decomposer]
    model_id: str
    fingerprint: dict[str, Any]
    thresholds: tuple[float, float]
    empty_route: str = "act"

    def decide(self, state: DecisionState) -> dict[str, Any]:
        """Run the decomposer on one state (no caching here)."""
        decision = self.decomposer_for(state.domain).decide(state.history, seed=state.seed)
        return {"model": self.model_id, "trajectory_id": state.trajectory_id, "step": state.step,
                "decision": decision.to_dict()}


def route_states(states: Sequence[DecisionState], router: Router, cache: DecisionCache,
                 concurrency: int, progress: bool = True) -> list[Routed]:
    """Route every state, computing (in parallel) and caching only the decisions not cached."""
    for state in states:
        state.key = decision_key(router.model_id, router.fingerprint, state.history, state.seed)
    todo = list({s.key: s for s in states if cache.get(s.key) is None}.values())
    log.info("routing %d state(s): %d cached, %d to decompose", len(states),
             len(states) - len(todo), len(todo))
    with ThreadPoolExecutor(max_workers=concurrency) as pool, \
            DecomposerBar(len(todo), progress) as bar:
        for state, record in zip(todo, pool.map(router.decide, todo)):
            cache.put(state.key, record)
            bar(1)
    return [resolve(cache.records[s.key], router.thresholds, router.empty_route) for s in states]


class DecomposerBar:
    """A rich progress bar of decomposer decisions as a context manager yielding
    ``advance(n)``; silent when disabled (extract's routing, the post-hoc pass)."""

    def __init__(self, total: int, enabled: bool):
        self.enabled = enabled and total > 0
        self.total = total

    def __enter__(self) -> Callable[[int], None]:
        if not self.enabled:
            return lambda n: None
        from rich.progress import Progress

        self.progress = Progress(transient=False)
        self.progress.start()
        task = self.progress.add_task("decomposer", total=self.total)
        return lambda n: self.progress.update(task, advance=n)

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.progress.stop()


# ---------------------------------------------------------------- targets and instances


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


@dataclass
class ExtractSummary:
    """What extraction saw, kept and dropped, and the prompts hashes of its trajectories;
    written next to the parquet files (the card reports it)."""

    trajectories: dict[str, int] = field(default_factory=dict)
    states: int = 0
    routes: Counter[str] = field(default_factory=Counter)
    empty_decisions: int = 0
    decomposer_calls: int = 0
    decomposer_requests: int = 0
    cache_hits: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    rows: dict[str, int] = field(default_factory=dict)
    # what never became a trajectory: records of a repeated key (trajectory id → records left
    # out) and the input file's invalid lines (1-based, data.on_bad_line: skip)
    duplicates: dict[str, int] = field(default_factory=dict)
    invalid_lines: list[int] = field(default_factory=list)
    # prompts_hash → trajectories collected with it ("unknown": not recorded), and this code's
    prompts_hashes: dict[str, int] = field(default_factory=dict)
    prompts_hash: str = ""
    # domain → verify-routed states: "target" (became a row) or the reason it was dropped
    verify_targets: dict[str, Counter[str]] = field(default_factory=dict)

    def count_verify(self, state: DecisionState, mode: str, outcome: str) -> None:
        """Count a verify state's outcome (``target`` or a drop reason) under its domain."""
        if mode == "verify":
            self.verify_targets.setdefault(state.domain, Counter())[outcome] += 1

    def to_dict(self, extra: dict[str, Any]) -> dict[str, Any]:
        per_state = lambda n: n / self.states if self.states else 0.0
        return {
            "trajectories": self.trajectories, "states": self.states, "routes": dict(self.routes),
            "empty_decisions": self.empty_decisions, "decomposer_calls": self.decomposer_calls,
            "decomposer_calls_per_state": per_state(self.decomposer_calls),
            "decomposer_requests": self.decomposer_requests,
            "decomposer_requests_per_state": per_state(self.decomposer_requests),
            "cache_hits": self.cache_hits, "dropped": dict(self.dropped), "rows": self.rows,
            "duplicates": self.duplicates, "invalid_lines": self.invalid_lines,
            "verify_targets": {d: dict(c) for d, c in sorted(self.verify_targets.items())},
            "prompts_hashes": self.prompts_hashes, "prompts_hash": self.prompts_hash,
            **extra,
        }


def usable(trajectories: Sequence[Trajectory], summary: ExtractSummary,
           cfg: DataConfig | None = None) -> list[Trajectory]:
    """Trajectories that ended without an error and are not of a calibration-reserve task
    (``cfg.calibration_reserve``: training never uses them); both kinds are counted and left
    out. The input's duplicate keys and invalid lines (when ``trajectories`` is what
    :func:`~prour.data.collect.load_trajectories` returned) are recorded in the summary."""
    summary.duplicates = dict(getattr(trajectories, "duplicate_keys", {}))
    summary.invalid_lines = list(getattr(trajectories, "skipped", []))
    kept = [t for t in trajectories if t.termination != "error"]
    summary.trajectories["errored"] = len(trajectories) - len(kept)
    if cfg is not None and cfg.calibration_reserve:
        from prour.data.reserve import reserve_task_ids

        reserve = set(reserve_task_ids(cfg))
        training = [t for t in kept if not (t.domain == cfg.domain and t.task_id in reserve)]
        summary.trajectories["reserve_task"] = len(kept) - len(training)
        kept = training
    return kept


UNKNOWN_PROMPTS = "unknown"
"""The prompts hash of a trajectory recorded before trajectories carried one."""


def prompts_hashes(trajectories: Iterable[Trajectory]) -> dict[str, int]:
    """prompts_hash → number of trajectories collected with it (most first)."""
    counts = Counter(t.prompts_hash or UNKNOWN_PROMPTS for t in trajectories)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def prompts_warning(hashes: dict[str, int], current: str) -> str | None:
    """One line naming the trajectories per prompts hash when they differ from each other or
    from this code's (``current``: :func:`prour.env.prompts.prompts_hash`); None when every
    trajectory has this code's."""
    if not hashes or set(hashes) == {current}:
        return None

    def named(digest: str, n: int) -> str:
        if digest == UNKNOWN_PROMPTS:
            return f"{n} with unknown prompts (collected before trajectories recorded them)"
        return f"{n} with prompts_hash {digest}" + (" (this code's)" if digest == current else "")

    counts = ", ".join(named(h, n) for h, n in hashes.items())
    if len(hashes) > 1:
        return (f"the trajectories were collected with {len(hashes)} different agent/user prompt "
                f"sets: {counts}; this code's is prompts_hash {current} (the rows mix prompt "
                "sets; re-collect to train on one)")
    return (f"the trajectories were collected with agent/user prompts other than this code's "
            f"(prompts_hash {current}): {counts} (re-collect to train on this code's prompts)")


def extract_instances(
    trajectories: Sequence[Trajectory],
    goals: dict[tuple[str, str], Goal],
    router: Router,
    cache: DecisionCache,
    tokens: PolicyTokens,
    cfg: DataConfig,
    progress: bool = True,
) -> tuple[dict[str, list[Instance]], ExtractSummary]:
    """Split, build states, route, and assemble the instances of both splits."""
    summary, trajectories, splits = _usable_split(trajectories, cfg)
    states = [s for t in trajectories for s in decision_states(t, cfg)]
    hits_before = cache.hits
    routed = route_states(states, router, cache, cfg.concurrency, progress)
    summary.cache_hits = cache.hits - hits_before
    kept = []
    for state, r in zip(states, routed):
        _count(summary, r)
        if r.route == "act":
            continue
        target, why = target_of(state, r.route, goals, cfg)
        if target is None:
            summary.dropped[why or "unknown"] += 1
            summary.count_verify(state, r.route, why or "unknown")
            continue
        kept.append((state, r, target))
    return _assemble(kept, splits, tokens, cfg, summary), summary


UNROUTED = Routed("clarify", None, None, None, False, 0, 0)
"""The route of a ``data.states: every`` row: clarify by construction, no decomposer call, so
no AU/EU (null in the parquet, never a measured 0)."""


def every_state_instances(
    trajectories: Sequence[Trajectory],
    goals: dict[tuple[str, str], Goal],
    tokens: PolicyTokens,
    cfg: DataConfig,
) -> tuple[dict[str, list[Instance]], ExtractSummary]:
    """IG-Clarifier's own training set (``data.states: every``): every decision state of the
    usable trajectories is a clarify row whose target is the normalized goal G*, on the same
    train/validation split and prompt budget as prour's data, with no decomposer involved (its
    uncertainty columns are 0 and it made no decomposer call). Every decision is a point where
    the agent could ask a question instead, so no state is left out for its route; states whose
    task has an empty goal (``clarify_empty_goal``) or that cannot fit the budget
    (``over_budget``) are dropped and counted, as in :func:`extract_instances`."""
    summary, trajectories, splits = _usable_split(trajectories, cfg)
    kept = []
    for state in (s for t in trajectories for s in decision_states(t, cfg)):
        _count(summary, UNROUTED)
        target, why = target_of(state, "clarify", goals, cfg)
        if target is None:
            summary.dropped[why or "unknown"] += 1
            continue
        kept.append((state, UNROUTED, target))
    return _assemble(kept, splits, tokens, cfg, summary), summary


def _usable_split(trajectories: Sequence[Trajectory],
                  cfg: DataConfig) -> tuple[ExtractSummary, list[Trajectory], dict[str, str]]:
    """A new summary (prompt sets counted, a mixed set logged), the usable trajectories and
    their train/validation assignment: what both kinds of extraction start from."""
    from prour.env.prompts import prompts_hash

    summary = ExtractSummary(prompts_hash=prompts_hash())
    summary.prompts_hashes = prompts_hashes(trajectories)
    if (warning := prompts_warning(summary.prompts_hashes, summary.prompts_hash)) is not None:
        log.info("%s", warning)  # `prour extract` prints it
    kept = usable(trajectories, summary, cfg)
    return summary, kept, split_trajectories(kept, cfg)


def _assemble(kept: Sequence[tuple[DecisionState, Routed, str]], splits: dict[str, str],
              tokens: PolicyTokens, cfg: DataConfig,
              summary: ExtractSummary) -> dict[str, list[Instance]]:
    """The instances of the kept (state, route, target) triples, by split, in trajectory and
    step order; states over the prompt budget dropped and counted."""
    out: dict[str, list[Instance]] = {split: [] for split in SPLITS}
    hashes = decision_hashes([state for state, _, _ in kept])
    for (state, r, target), db_hash in zip(kept, hashes):
        try:
            instance = build_instance(state, r, target, tokens, cfg.max_prompt_tokens, db_hash)
        except OverBudget:  # the newest user message and what follows it cannot fit
            summary.dropped["over_budget"] += 1
            summary.count_verify(state, r.route, "over_budget")
            continue
        summary.count_verify(state, r.route, "target")
        out[splits[state.trajectory_id]].append(instance)
    for split in SPLITS:
        summary.trajectories[split] = sum(1 for v in splits.values() if v == split)
        out[split].sort(key=lambda i: (i.trajectory_id, i.step))
    return out


def _count(summary: ExtractSummary, r: Routed) -> None:
    summary.states += 1
    summary.routes[r.route] += 1
    summary.empty_decisions += r.empty
    summary.decomposer_calls += r.calls
    summary.decomposer_requests += r.requests


def write_dataset(instances: dict[str, list[Instance]], summary: ExtractSummary,
                  out_dir: str | Path, extra: dict[str, Any]) -> dict[str, Any]:
    """Write both parquet splits, the extraction summary and the dataset card."""
    out_dir = Path(out_dir)
    for split in SPLITS:
        rows = [inst.to_row(index) for index, inst in enumerate(instances[split])]
        write_rows(rows, split_path(out_dir, split))
        summary.rows[split] = len(rows)
    write_atomic(out_dir / EXTRACT_SUMMARY,
                 json.dumps(summary.to_dict(extra), indent=2, sort_keys=True) + "\n")
    if not any(summary.rows.values()):  # nothing to describe: the summary says what was dropped
        return {"dataset_dir": str(out_dir), "splits": {split: {"rows": 0} for split in SPLITS},
                "extraction": summary.to_dict(extra)}
    card, _, _ = write_card(out_dir)
    return card


def empty_reason(extraction: dict[str, Any]) -> str:
    """Why a dataset holds no row, from its extraction summary: the routes and drops counted."""
    dropped = ", ".join(f"{n} {why}" for why, n in sorted(extraction["dropped"].items()))
    if extraction.get("states_rule") == "every":  # no route: every state was a candidate row
        return (f"no row among {extraction['states']} decision states (every one a clarify "
                f"candidate; dropped: {dropped or 'none'})")
    routes = ", ".join(f"{n} {route}" for route, n in sorted(extraction["routes"].items()))
    return (f"no clarify or verify state among {extraction['states']} decision states "
            f"(routes: {routes or 'none'}; {extraction['empty_decisions']} decisions had no "
            f"valid candidate; dropped: {dropped or 'none'})")
