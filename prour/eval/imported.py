"""Imported runs (``prour import tau2`` folders) in ``prour report``.

An imported run folder holds ``trajectories.jsonl`` (trajectories whose ``meta["tau2_import"]``
names their source) and no ``results.jsonl``. :func:`imported_lines` turns each trajectory into a
result line as ``prour eval`` writes them: the system is the tau2 agent implementation and its
model; its turns are all Act in the Act/Clarify/Verify split (no router took them, as for prour's
``base``); their inferred tags (:mod:`prour.eval.tags`) go to ``inferred_turns``, shown in their
own table; model calls are not recorded by tau2 (None). :func:`imported_header` names the sources
and the tau2 split(s) and evaluation protocols (:data:`prour.config.eval.PROTOCOLS`) the task ids
fall in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prour.env.tau2_import import TRAJECTORIES_FILE


def is_imported_run(run_dir: str | Path) -> bool:
    """The folder holds imported trajectories and no eval results."""
    from prour.env.trajectory import read_jsonl
    from prour.eval.harness import RESULTS_FILE

    folder = Path(run_dir)
    path = folder / TRAJECTORIES_FILE
    if (folder / RESULTS_FILE).exists() or not path.is_file():
        return False
    records = read_jsonl(path, on_error="skip")
    return bool(records) and "tau2_import" in (records[0].get("meta") or {})


def system_name(trajectory: Any) -> str:
    """``tau2:llm_agent (gpt-4.1)``: the tau2 agent implementation and its model."""
    return f"{trajectory.agent} ({trajectory.agent_model})" if trajectory.agent_model \
        else trajectory.agent


def imported_lines(run_dir: str | Path) -> list[dict[str, Any]]:
    """One result line per imported trajectory (see the module docstring)."""
    from prour.env.trajectory import read_trajectories, tau2_steps
    from prour.eval.agent import turn_labels
    from prour.eval.metrics import is_success, paper_split
    from prour.eval.results import RESULT_SCHEMA
    from prour.eval.tags import turn_tags

    lines = []
    for traj in read_trajectories(Path(run_dir) / TRAJECTORIES_FILE):
        labels = turn_labels(traj)
        score = traj.reward if traj.reward is not None else 0.0
        lines.append({
            "schema": RESULT_SCHEMA, "key": list(traj.key), "method": system_name(traj),
            "variant": None, "domain": traj.domain, "task_id": traj.task_id, "seed": traj.seed,
            "reward": traj.reward, "score": score, "success": is_success(score),
            "termination": traj.termination, "error": traj.termination == "error",
            "timeout": False, "unscored": traj.reward is None, "errors": traj.errors[:3],
            "steps": paper_split(labels), "turns": labels, "inferred_turns": turn_tags(traj),
            "tau2_steps": tau2_steps(traj.steps), "records": len(traj.steps),
            "model_calls": {}, "model_calls_total": None, "seconds": traj.seconds,
            "decisions": [], "router": None, "episode_started_at": traj.started_at,
            "generator": None, "question_writer": traj.agent_model, "checkpoint": None,
            "sweep": None, "attention": None, "imported": traj.meta["tau2_import"],
            "user_model": traj.user_model})
    return lines


def imported_header(run_dir: str | Path, lines: list[dict[str, Any]]) -> list[str]:
    """The report's header lines of one imported run: each source file and its provenance,
    then the splits and protocols its task ids fall in."""
    sources: dict[str, dict[str, Any]] = {}
    for line in lines:
        record = sources.setdefault(line["imported"]["sha256"], {**line["imported"], "n": 0,
                                    "agent_model": line["question_writer"],
                                    "user_model": line["user_model"]})
        record["n"] += 1
    out = [f"- imported run `{run_dir}` (`prour import tau2`):"]
    for sha, record in sources.items():
        out.append(
            f"  - source `{record['source']}` (sha256 {sha[:12]}, {record['n']} simulations): "
            f"tau2 commit {record.get('tau2_commit') or 'unknown'}, tau2 version "
            f"{record.get('tau2_version') or 'unknown'}; agent {record['agent_implementation']} "
            f"({record['agent_model'] or 'model unknown'}), user {record['user_implementation']} "
            f"({record['user_model'] or 'model unknown'})")
    out.append(f"  - {split_line(lines)}")
    return out


def split_line(lines: list[dict[str, Any]]) -> str:
    """``task ids in: retail test (1 of 40), ...; protocols: tau2-test (3 of 120 tasks)``:
    per domain the smallest tau2 split holding all its ids, and every evaluation protocol whose
    domains and split hold them all, with how much of it the run covers."""
    from prour.config.eval import PROTOCOLS
    from prour.env.domains import DOMAINS, domain_spec, split_task_ids

    ids: dict[str, set[str]] = {}
    for line in lines:
        ids.setdefault(line["domain"], set()).add(line["task_id"])
    domains = [d for d in DOMAINS if d in ids] + sorted(set(ids) - set(DOMAINS))
    parts = []
    for domain in domains:
        holding = sorted((len(split_task_ids(domain, s)), s) for s in domain_spec(domain).splits
                         if ids[domain] <= set(split_task_ids(domain, s)))
        parts.append(f"{domain} {holding[0][1]} ({len(ids[domain])} of {holding[0][0]})"
                     if holding else f"{domain} no single split ({len(ids[domain])} tasks)")
    protocols = []
    for name, preset in PROTOCOLS.items():
        if not set(ids) <= set(preset["domains"]):
            continue
        if all(ids[d] <= set(split_task_ids(d, preset["split"])) for d in ids):
            size = sum(len(split_task_ids(d, preset["split"])) for d in preset["domains"])
            protocols.append(f"{name} ({sum(map(len, ids.values()))} of {size} tasks)")
    return (f"task ids in: {', '.join(parts)}; protocols holding them: "
            f"{', '.join(protocols) or 'none'}")
