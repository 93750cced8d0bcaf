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
counts them per hash and :func:`~prour.data.extract_summary.prompts_warning` says when they
differ from each other or from this code's.

The steps live beside this module: the usable trajectories, their split and the summary in
:mod:`prour.data.extract_summary` (1), the decision states, their targets and instances in
:mod:`prour.data.decision_states` (2, 4 to 6), the routing in :mod:`prour.data.routing` (3);
this module runs them in order and writes the dataset.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prour.config.data import DataConfig
from prour.data.card import EXTRACT_SUMMARY, write_card
from prour.data.dataset import SPLITS, split_path, write_rows
from prour.data.decision_states import (
    DecisionState,
    Routed,
    build_instance,
    decision_hashes,
    decision_states,
    target_of,
)
from prour.data.decisions import DecisionCache
from prour.data.extract_summary import ExtractSummary, usable_split
from prour.data.normalize import Goal
from prour.data.routing import Router, route_states
from prour.data.schema import Instance
from prour.data.truncate import OverBudget, PolicyTokens
from prour.env.trajectory import Trajectory
from prour.files import write_atomic


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
    summary, trajectories, splits = usable_split(trajectories, cfg)
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
    summary, trajectories, splits = usable_split(trajectories, cfg)
    kept = []
    for state in (s for t in trajectories for s in decision_states(t, cfg)):
        _count(summary, UNROUTED)
        target, why = target_of(state, "clarify", goals, cfg)
        if target is None:
            summary.dropped[why or "unknown"] += 1
            continue
        kept.append((state, UNROUTED, target))
    return _assemble(kept, splits, tokens, cfg, summary), summary


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
