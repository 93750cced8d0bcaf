"""What extraction (:mod:`prour.data.extract`) starts from and what it counts: the usable
trajectories (no error, not of a calibration-reserve task), the prompt sets they were collected
with, their train/validation split (step 1), and the summary of what was kept and dropped."""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prour.config.data import DataConfig
from prour.data.collect import trajectory_id
from prour.data.decision_states import DecisionState
from prour.env.trajectory import Trajectory

log = logging.getLogger(__name__)


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


def usable_split(trajectories: Sequence[Trajectory],
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
