"""prour episodes out as tau2 results files (what ``tau2 run`` writes), for ``tau2 view`` and for
comparison with other tau2 runs; :mod:`prour.env.tau2_import` reads them back.

tau2's ``Results`` holds one domain and one agent, so a run folder gets one file per (domain,
agent name) under ``tau2_results/``. Each episode becomes one ``SimulationRun``: its messages are
those tau2's evaluator was given when prour scored it (:func:`prour.env.scoring.to_tau2_messages`:
no system prompt, no agent notes, no malformed calls, every tool message under the id of its
call); its ``trial`` is the seed's position among the file's seeds. ``reward_info`` carries the
reward prour recorded with the checks behind it: an episode that ended early (an error, the turn
cap) gets reward 0 with a note, as tau2 scores those; an episode whose task needs an LLM judge
(reward not scored) gets none. The file embeds the installed tau2's definition of every task.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from prour.env.trajectory import NORMAL_ENDINGS, Trajectory

EXPORT_DIR = "tau2_results"
_TERMINATIONS = {"user_stop": "user_stop", "agent_stop": "agent_stop", "max_steps": "max_steps",
                 "too_many_errors": "too_many_errors", "error": "agent_error"}


def export_name(domain: str, agent: str) -> str:
    """The file name of one (domain, agent) group: ``<domain>__<agent, safe characters>.json``."""
    return f"{domain}__{re.sub(r'[^A-Za-z0-9._-]+', '-', agent).strip('-') or 'agent'}.json"


def export_episodes(trajectories: list[Trajectory], out_dir: str | Path, *, max_steps: int,
                    max_errors: int, git_commit: str | None) -> list[Path]:
    """Write ``trajectories`` as tau2 results files in ``out_dir`` (one per domain and agent,
    each replaced whole); returns their paths. ``max_steps``/``max_errors``: the run's ``env``
    limits; ``git_commit``: prour's commit that ran it (tau2's ``info.git_commit``)."""
    from prour.files import write_atomic

    groups: dict[tuple[str, str], list[Trajectory]] = defaultdict(list)
    for traj in trajectories:
        groups[traj.domain, traj.agent].append(traj)
    names: dict[str, tuple[str, str]] = {}
    written = []
    for (domain, agent), group in sorted(groups.items()):
        name = export_name(domain, agent)
        if name in names:
            raise ValueError(f"agents {names[name][1]!r} and {agent!r} of {domain} would share "
                             f"the tau2 results file {name}; rename one of them")
        names[name] = (domain, agent)
        results = tau2_results(domain, group, max_steps=max_steps, max_errors=max_errors,
                               git_commit=git_commit)
        path = Path(out_dir) / name
        write_atomic(path, results.model_dump_json(indent=2) + "\n")
        written.append(path)
    return written


def tau2_results(domain: str, group: list[Trajectory], *, max_steps: int, max_errors: int,
                 git_commit: str | None) -> Any:
    """tau2's ``Results`` of one domain's episodes by one agent (sorted by task and seed)."""
    from tau2.data_model.simulation import AgentInfo, Info, Results, UserInfo
    from tau2.environment.environment import EnvironmentInfo

    from prour.env.domains import domain_policy, get_task

    group = sorted(group, key=lambda t: (_task_order(t.task_id), t.seed))
    seeds = sorted({t.seed for t in group})
    first = group[0]
    info = Info(git_commit=git_commit or "unknown", num_trials=len(seeds), max_steps=max_steps,
                max_errors=max_errors,
                user_info=UserInfo(implementation=first.user, llm=first.user_model),
                agent_info=AgentInfo(implementation=first.agent, llm=first.agent_model),
                environment_info=EnvironmentInfo(domain_name=domain, policy=domain_policy(domain)))
    task_ids = list(dict.fromkeys(t.task_id for t in group))
    splits = {t.task_id: t.split for t in group}  # the version of each task the episodes ran
    simulations = [simulation_run(t, seeds.index(t.seed)) for t in group]
    # the file's time is its last episode's end, so that exporting a run again gives the same file
    return Results(timestamp=max(s.end_time for s in simulations), info=info,
                   tasks=[get_task(domain, tid, splits[tid]) for tid in task_ids],
                   simulations=simulations)


def _task_order(task_id: str) -> tuple[int, int | str]:
    return (0, int(task_id)) if task_id.isdigit() else (1, task_id)


def simulation_run(traj: Trajectory, trial: int) -> Any:
    """One episode as tau2's ``SimulationRun`` (see the module docstring)."""
    from tau2.data_model.simulation import SimulationRun, TerminationReason

    from prour.env.scoring import tau2_message_steps

    start, end = _times(traj)
    messages = []
    for step, message in tau2_message_steps(traj):
        message.timestamp = _at(traj, step.started_s)  # when the step began, not the export
        messages.append(message)
    return SimulationRun(
        id=f"{traj.domain}/{traj.task_id}/s{traj.seed}/{traj.agent}", task_id=traj.task_id,
        timestamp=start, start_time=start, end_time=end, duration=traj.seconds,
        termination_reason=TerminationReason(_TERMINATIONS[traj.termination or "error"]),
        reward_info=reward_info(traj), messages=messages, trial=trial,
        seed=traj.seed)


def _times(traj: Trajectory) -> tuple[str, str]:
    """(start, end) ISO times of the episode."""
    return traj.started_at, _at(traj, traj.seconds)


def _at(traj: Trajectory, seconds: float) -> str:
    """The ISO time ``seconds`` after the episode began (its start as stored if that does not
    parse)."""
    try:
        began = datetime.fromisoformat(traj.started_at)
    except ValueError:
        return traj.started_at
    return (began + timedelta(seconds=seconds)).isoformat()


def reward_info(traj: Trajectory) -> Any:
    """tau2's ``RewardInfo`` of the recorded reward: tau2's own record for an imported episode,
    else the checks prour's scoring recorded (None when the episode was not scored)."""
    from tau2.data_model.simulation import DBCheck, RewardInfo

    breakdown = traj.reward_breakdown or {}
    if isinstance(breakdown.get("tau2"), dict):  # an imported episode: tau2's record as it was
        return RewardInfo.model_validate(breakdown["tau2"])
    if traj.termination not in NORMAL_ENDINGS:
        return RewardInfo(reward=0.0, reward_basis=None, info={
            "note": f"the episode ended early ({traj.termination}); tau2 scores that 0",
            "errors": traj.errors[:3]})
    if traj.reward is None:
        return None
    checks = {kind: float(value) for kind, value in (breakdown.get("checks") or {}).items()}
    db = DBCheck(db_match=checks["DB"] == 1.0, db_reward=checks["DB"]) if "DB" in checks else None
    note = {k: breakdown[k] for k in ("failed", "note") if breakdown.get(k)}
    return RewardInfo(reward=traj.reward, db_check=db, reward_basis=breakdown.get("basis"),
                      reward_breakdown=checks or None,
                      info={"scored_by": "prour with tau2's offline evaluators", **note})


def export_run(run_dir: str | Path, episodes: str | Path, *, max_steps: int,
               max_errors: int) -> list[Path]:
    """Export the episodes JSONL of a run folder into ``run_dir/tau2_results`` (a key stored
    twice, an errored episode and its rerun, keeps its last record); prour's commit is read from
    the folder's ``provenance.json`` (absent: ``unknown``)."""
    from prour.env.trajectory import read_trajectories
    from prour.provenance import PROVENANCE_FILE

    run_dir = Path(run_dir)
    latest = {t.key: t for t in read_trajectories(episodes, on_error="skip")}
    commit = None
    provenance = run_dir / PROVENANCE_FILE
    if provenance.is_file():
        commit = (json.loads(provenance.read_text()).get("git") or {}).get("commit")
    return export_episodes(list(latest.values()), run_dir / EXPORT_DIR, max_steps=max_steps,
                           max_errors=max_errors, git_commit=commit)
