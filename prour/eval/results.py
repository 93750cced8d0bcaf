"""One episode's result line: the compact, report-ready record the harness appends to
``results.jsonl`` (reward, termination, turn split and tags, model calls and tokens by role,
decisions, router, generator and question writer, checkpoint, sweep point, attention costs),
and the appending of the lines that episodes lack."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prour.env.trajectory import Trajectory, tau2_steps
from prour.files import append_jsonl

if TYPE_CHECKING:  # pragma: no cover
    from prour.eval.arms import Arm

RESULT_SCHEMA = 1


def model_calls(trajectory: Trajectory) -> dict[str, int]:
    """Backend calls of the episode by ``role.kind`` (summed over the steps' meta)."""
    total: dict[str, int] = {}
    for step in trajectory.steps:
        for key, n in (step.meta.get("model_calls") or {}).items():
            total[key] = total.get(key, 0) + int(n)
    return dict(sorted(total.items()))


def model_tokens(trajectory: Trajectory) -> dict[str, int]:
    """Tokens of the episode's chat calls by ``role.kind`` (``requests``, ``prompt``: each
    request's prompt once, ``sequences``, ``completion``: every generated token), summed over
    the steps' meta; empty when its backends count none."""
    total: dict[str, int] = {}
    for step in trajectory.steps:
        for key, n in (step.meta.get("model_tokens") or {}).items():
            total[key] = total.get(key, 0) + int(n)
    return dict(sorted(total.items()))


@dataclass(frozen=True)
class RoleTokens:
    """One role's chat requests and tokens over a run's finished episodes."""

    episodes: int
    requests: int
    prompt: int
    sequences: int
    completion: int

    @property
    def context(self) -> float:
        """Mean tokens one request reaches: its prompt and one generated sequence."""
        return self.prompt / self.requests + self.completion / max(self.sequences, 1)

    @property
    def generated_per_episode(self) -> float:
        return self.completion / self.episodes


def role_tokens(lines: Iterable[Mapping[str, Any]]) -> dict[str, RoleTokens]:
    """Role -> its requests and tokens over the result lines that recorded any (errored
    episodes left out: they end early)."""
    sums: dict[str, Counter[str]] = {}
    episodes: Counter[str] = Counter()
    for line in lines:
        tokens = line.get("model_tokens")
        if line.get("error") or not isinstance(tokens, Mapping):
            continue
        roles = set()
        for key, n in tokens.items():
            role, _, kind = str(key).rpartition(".")
            if isinstance(n, (int, float)) and role:
                sums.setdefault(role, Counter())[kind] += int(n)
                roles.add(role)
        episodes.update(roles)
    return {role: RoleTokens(episodes[role], c["requests"], c["prompt"], c["sequences"],
                             c["completion"])
            for role, c in sorted(sums.items()) if c["requests"] > 0}


def decisions(trajectory: Trajectory) -> list[dict[str, Any]]:
    """Router decisions in agent-step order: step index, route, AU, EU, total (None if absent)."""
    from prour.eval.agent import is_agent_turn

    out = []
    for index, step in enumerate(s for s in trajectory.steps if is_agent_turn(s)):
        record = step.meta.get("decision")
        if isinstance(record, dict) and not record.get("skipped"):
            out.append({"step": index, "route": record.get("route"), "au": record.get("au"),
                        "eu": record.get("eu"), "total": record.get("total")})
    return out


def is_timeout(trajectory: Trajectory) -> bool:
    """The episode failed because a backend call timed out."""
    text = " ".join(trajectory.errors).lower()
    return trajectory.termination == "error" and ("timeout" in text or "timed out" in text)


def result_line(trajectory: Trajectory, arm: Arm, judge: Any = None,
                generator: str | None = None, writer: str | None = None) -> dict[str, Any]:
    """The compact, report-ready record of one episode; ``generator`` names a query generator
    swapped in for the recipe's default (None: the default, or a method without one);
    ``writer`` is the model that wrote its questions (None: no model writes them)."""
    from prour.eval.agent import turn_labels
    from prour.eval.metrics import is_success, paper_split

    labels = turn_labels(trajectory)
    score = trajectory.reward if trajectory.reward is not None else 0.0
    line: dict[str, Any] = {
        "schema": RESULT_SCHEMA,
        "key": list(trajectory.key),
        "method": arm.method,
        "variant": arm.variant,
        "domain": trajectory.domain,
        "task_id": trajectory.task_id,
        "split": trajectory.split,  # the task set the task was drawn from (tau3, base, ...)
        "seed": trajectory.seed,
        "reward": trajectory.reward,
        "score": score,
        "success": is_success(score),
        "termination": trajectory.termination,
        "error": trajectory.termination == "error",
        "timeout": is_timeout(trajectory),
        "unscored": trajectory.reward is None,
        # checks the offline scoring left for a judge (tau2's NL_ASSERTION; prour nl-assertions)
        "not_evaluated": list(trajectory.reward_breakdown.get("not_evaluated") or []),
        "errors": trajectory.errors[:3],
        "steps": paper_split(labels),  # the paper's Act / Clarify / Verify split
        "turns": labels,  # turn tag of every agent turn in order (prour.eval.agent.TURN_TAGS)
        "tau2_steps": tau2_steps(trajectory.steps),  # what env.max_steps caps
        "records": len(trajectory.steps),
        "model_calls": model_calls(trajectory),
        "model_tokens": model_tokens(trajectory),  # by role: requests, prompt, sequences, completion
        "seconds": trajectory.seconds,
        "decisions": decisions(trajectory),
        # router.budget / router.every_n of the episode and its router calls (None: no router)
        "router": trajectory.meta.get("router"),
        "episode_started_at": trajectory.started_at,
        "generator": generator,
        "question_writer": writer,  # the model (folder or served id) that wrote its questions
        "checkpoint": arm.checkpoint.record() if arm.checkpoint is not None else None,
        "sweep": arm.sweep,  # the eval.sweep point ({"router.budget": 2, ...}; None: none)
        "axes": dict(arm.axes) if arm.axes else None,  # a study's axis values ({"backbone": ...})
        "attention": None,
    }
    line["model_calls_total"] = sum(line["model_calls"].values())
    if arm.attention is not None:
        from prour.eval.attention.agent import attention_summary

        line["attention"] = attention_summary(trajectory, arm.attention, score, judge)
    return line


def record_lines(path: Path, arms: list[Arm], trajectories: list[Trajectory],
                 stored: list[dict[str, Any] | None], judge: Any,
                 generator_of: Callable[[Arm], str | None],
                 writer_of: Callable[[Arm], str | None]) -> list[dict[str, Any]]:
    """The result line of every episode, in order: its ``stored`` line (from ``path``) when that
    was made from this very episode, else a new one appended to ``path``; ``generator_of`` and
    ``writer_of`` name an arm's swapped generator and question writer (:func:`result_line`)."""
    out = []
    for arm, traj, line in zip(arms, trajectories, stored):
        if line is None or not _same_episode(line, traj):
            line = result_line(traj, arm, judge, generator_of(arm), writer_of(arm))
            append_jsonl(path, line)
        out.append(line)
    return out


def _same_episode(line: dict[str, Any], trajectory: Trajectory) -> bool:
    """Whether a stored result line was made from this very episode (not an earlier attempt)."""
    return (line.get("episode_started_at") == trajectory.started_at
            and line.get("seconds") == trajectory.seconds)
