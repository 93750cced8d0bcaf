"""Calibration decision states sampled from collected trajectories (paper A.2.2).

A decision state is what the task agent saw right before one of its own turns, built by
:func:`prour.data.decision_states.decision_states` (the extract stage's rule: the first
``data.max_decisions`` agent decisions; user text, the agent's own messages, tool calls and
results; never the system prompt, the task instruction, G* or reference actions), which is why
this sampler sits in the data stage and not with the router that reads its output. The
decomposer sees exactly this history, untruncated, during extract and calibration.

The dev split's candidates (:func:`dev_candidates`) are every decision state of trajectories of
the calibration reserve's tasks (:mod:`prour.data.reserve`), ordered the same way; annotation
keeps them in that order up to the label mix (:mod:`prour.router.dev_mix`). The test split's
states (:func:`sample_states`) are ``n`` of them.

Sampling is seeded and spread over trajectories: trajectories are shuffled, each one's decisions
are shuffled, then states are taken round-robin, one per trajectory per round, so every
trajectory contributes before any contributes twice. Asking for more states than the
trajectories hold is refused with the count (a short calibration set is better noticed than
silently written). The file is replaced atomically (temp file + rename); rerunning with the same
inputs and seed rewrites the same bytes.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prour.config.data import DataConfig
from prour.data.collect import load_trajectories
from prour.data.decision_states import decision_states
from prour.data.schema import decision_id_of
from prour.env.trajectory import Trajectory
from prour.files import write_atomic


def trajectory_states(traj: Trajectory, cfg: DataConfig, source: str) -> list[dict[str, Any]]:
    """One trajectory's decision states as calibration records (``id``, ``messages``, provenance)."""
    plain = cfg.model_copy(update={"verify_target": "agent"})  # no reference lookup needed here
    return [
        {"id": decision_id_of(s.trajectory_id, s.step), "domain": s.domain, "task_id": s.task_id,
         "trajectory_id": s.trajectory_id, "step": s.step, "source": source,
         "messages": s.history}
        for s in decision_states(traj, plain)
    ]


def spread_sample(groups: Sequence[list[dict[str, Any]]], n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` records taken round-robin over shuffled groups (each shuffled), seeded."""
    rng = random.Random(seed)
    queues = [rng.sample(group, len(group)) for group in groups if group]
    rng.shuffle(queues)
    picked: list[dict[str, Any]] = []
    while len(picked) < n and queues:
        for queue in queues:
            if len(picked) < n:
                picked.append(queue.pop())
        queues = [q for q in queues if q]
    return picked


def _usable(path: Path, cfg: DataConfig) -> list[Trajectory]:
    if not path.is_file():
        raise ValueError(f"trajectories file not found: {path}")
    # one record per episode (a rerun's retry wins); corrupt lines as data.on_bad_line says
    return [t for t in load_trajectories(path, cfg.on_bad_line) if t.termination != "error"]


def outside_reserve(trajectories: Sequence[Trajectory], cfg: DataConfig) -> list[str]:
    """Ids of trajectories that are not of a reserve task of ``data.domain`` (empty without a
    reserve: then the protocol guard says whether dev states may come from training)."""
    if not cfg.calibration_reserve:
        return []
    from prour.data.collect import trajectory_id
    from prour.data.reserve import reserve_task_ids

    reserve = set(reserve_task_ids(cfg))
    return [trajectory_id(t) for t in trajectories
            if t.domain != cfg.domain or str(t.task_id) not in reserve]


def dev_candidates(trajectories_path: str | Path, cfg: DataConfig, seed: int,
                   n: int | None = None) -> list[dict[str, Any]]:
    """Every decision state of the reserve-task trajectories (the first ``n`` when given), in a
    seeded order spread round-robin over the trajectories: the order annotation keeps them in
    (``router.calibration.dev_mix``). A trajectory of a task outside the reserve is refused."""
    path = Path(trajectories_path)
    trajectories = _usable(path, cfg)
    foreign = outside_reserve(trajectories, cfg)
    if foreign:
        raise ValueError(
            f"{path}: {len(foreign)} of {len(trajectories)} trajectories are not of the "
            f"{cfg.calibration_reserve} calibration-reserve tasks of {cfg.domain} {cfg.split} "
            f"(data.calibration_reserve), e.g. {foreign[:3]}: dev states never come from "
            "training tasks; collect them with `prour collect --set data.tasks=reserve` "
            "(the chain's collect-dev step)")
    groups = [trajectory_states(t, cfg, str(path)) for t in trajectories]
    total = sum(map(len, groups))
    return spread_sample(groups, total if n is None else min(n, total), seed)


def sample_states(trajectories_path: str | Path, cfg: DataConfig, n: int,
                  seed: int) -> list[dict[str, Any]]:
    """``n`` decision states from a trajectories JSONL, or a ValueError saying how many exist."""
    path = Path(trajectories_path)
    trajectories = _usable(path, cfg)
    groups = [trajectory_states(t, cfg, str(path)) for t in trajectories]
    available = sum(map(len, groups))
    if available < n:
        raise ValueError(
            f"{path}: {len(trajectories)} usable trajectories hold {available} decision states "
            f"(first data.max_decisions={cfg.max_decisions} of each); asked for --n {n}: "
            f"collect more trajectories or pass --n {available} "
            "(router.calibration.n_states)")
    return spread_sample(groups, n, seed)


def write_states(path: str | Path, records: Sequence[dict[str, Any]]) -> Path:
    """Write the records as JSONL, replacing ``path`` atomically (temp file + rename)."""
    lines = (json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n" for record in records)
    return write_atomic(path, "".join(lines), fsync=True)
