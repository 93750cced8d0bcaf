"""Run any evaluation method end to end on 2 retail + 2 airline tasks with scripted models.

:func:`run_method` runs the real harness (``Evaluation``: tau2 environments, runner, result
lines) and the real report on the tasks of ``eval_world.TASKS`` (retail 5, 65; airline 2, 26),
one seed, with every role scripted (``eval_world.scripted_llms``, any role replaced through
``llms``). The returned :class:`MethodRun` reads the trajectories back from ``episodes.jsonl``
so tests can assert a method's decisions turn by turn, and :func:`check_report` recomputes the
report's turn-tag and per-role call tables from the trajectories' step metas, independently of
the result lines the report is built from.

Typical baseline test::

    run = run_method("my-baseline", tmp_path, llms={"agent": my_agent_llm()})
    assert run.turns("retail", "65") == ["clarify", "act", "act", "act"]
    assert run.calls("retail", "65")["clarification_predictor.chat"] == 3
    check_report(run)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from eval_world import TASKS, recipe, scripted_llms

from prour.build import Builder
from prour.config import ModelConfig, Recipe
from prour.env.trajectory import Trajectory, read_jsonl, read_trajectories
from prour.eval.agent import TURN_TAGS, is_agent_turn, turn_labels
from prour.eval.harness import EPISODES_FILE, RESULTS_FILE, Evaluation
from prour.eval.report import write_report
from prour.llm.base import LLM

DOMAINS = ("retail", "airline")


@dataclass
class MethodRun:
    """One method's finished run: result lines, trajectories and the written report."""

    method: str
    run_dir: Path
    lines: list[dict[str, Any]]
    trajectories: list[Trajectory]
    report: dict[str, Any]
    markdown: str
    label: str = field(default="")

    def episode(self, domain: str, task_id: str) -> Trajectory:
        [traj] = [t for t in self.trajectories if (t.domain, t.task_id) == (domain, task_id)]
        return traj

    def line(self, domain: str, task_id: str) -> dict[str, Any]:
        [line] = [x for x in self.lines if (x["domain"], x["task_id"]) == (domain, task_id)]
        return line

    def turns(self, domain: str, task_id: str) -> list[str]:
        """Turn tags of the episode's agent turns, read from the trajectory."""
        return turn_labels(self.episode(domain, task_id))

    def agent_steps(self, domain: str, task_id: str) -> list[Any]:
        return [s for s in self.episode(domain, task_id).steps if is_agent_turn(s)]

    def calls(self, domain: str, task_id: str) -> dict[str, int]:
        """Model calls of the episode by ``role.kind``, summed from the trajectory's steps."""
        total: dict[str, int] = {}
        for step in self.episode(domain, task_id).steps:
            for key, n in (step.meta.get("model_calls") or {}).items():
                total[key] = total.get(key, 0) + n
        return total

    def system(self) -> dict[str, Any]:
        """The method's entry in ``report.json``."""
        [system] = [s for s in self.report["systems"] if s["label"] == self.label]
        return system


def run_method(method: str, tmp_path: Path, llms: dict[str, LLM] | None = None,
               models: dict[str, dict[str, Any]] | None = None,
               default_generator: ModelConfig | None = None, **eval_section: Any) -> MethodRun:
    """Evaluate ``method`` on ``eval_world.TASKS`` (seed 0; ``tasks=[...]`` picks others) and
    write its report.

    ``llms`` replaces scripted backends by role; ``models`` replaces recipe model entries (e.g.
    a swapped generator) and ``default_generator`` is then the recipe's own one."""
    data = recipe(str(tmp_path), methods=[method], **{"tasks": TASKS, **eval_section})
    data["models"].update(models or {})
    loaded = Recipe.model_validate(data)
    backends = {**scripted_llms(), **(llms or {})}
    run_dir, out = tmp_path / "run", tmp_path / "report"
    evaluation = Evaluation(loaded, run_dir, progress=False, builder=Builder(loaded, backends),
                            default_generator=default_generator)
    try:
        evaluation.run()
    finally:
        evaluation.close()
    write_report([run_dir], out, n_boot=50)
    lines = list(read_jsonl(run_dir / RESULTS_FILE))
    report = json.loads((out / "report.json").read_text())
    [label] = [s["label"] for s in report["systems"]]
    return MethodRun(method, run_dir, lines, read_trajectories(run_dir / EPISODES_FILE), report,
                     (out / "report.md").read_text(), label)


def _domain_mean(run: MethodRun, value: Any) -> float:
    per_domain = []
    for domain in [d for d in DOMAINS if any(t.domain == d for t in run.trajectories)]:
        values = [value(t) for t in run.trajectories if t.domain == domain]
        per_domain.append(sum(values) / len(values))
    return sum(per_domain) / len(per_domain)


def check_report(run: MethodRun) -> None:
    """The report's turn tags and calls by role equal the trajectories' (domain mean of the
    per-episode counts), and every result line's ``turns`` equals its trajectory's tags."""
    assert len(run.trajectories) == len(run.lines) > 0
    for traj in run.trajectories:
        assert run.line(traj.domain, traj.task_id)["turns"] == turn_labels(traj)
    system = run.system()
    for tag in TURN_TAGS:
        expected = _domain_mean(run, lambda t, g=tag: turn_labels(t).count(g))
        assert system["turns"][tag] == pytest.approx(expected, abs=1e-12), tag
    roles = {key.rsplit(".", 1)[0] for t in run.trajectories
             for key in run.calls(t.domain, t.task_id)}
    assert set(system["calls_by_role"]) == roles
    for role in roles:
        expected = _domain_mean(run, lambda t, r=role: sum(
            n for k, n in run.calls(t.domain, t.task_id).items() if k.rsplit(".", 1)[0] == r))
        assert system["calls_by_role"][role] == pytest.approx(expected, abs=1e-12), role
    assert "## Model calls per episode by role" in run.markdown
    assert "## Agent turns per episode by tag" in run.markdown
