"""The post-hoc decomposer pass (the prour paper's Figure 6 for baselines).

Methods that route with the decomposer record AU, EU and total at each decision they take;
the others (``base`` and the baselines, the LLM router) record none. :func:`posthoc_uncertainty`
runs the recipe's decomposer over each such episode's agent-view history (what the task agent
saw: system prompt, its own turns and tool results, the user's text) at its first
``max_steps`` agent decisions, seeded as a live decision at that step would be, and appends one
line per (episode, step) to ``posthoc_uncertainty.jsonl`` in the run folder. A rerun measures
only what is missing (a re-run episode, told by its start time, is measured again); the report
draws these curves beside the recorded ones, labelled ``(post-hoc)``.

An imported run (:mod:`prour.eval.imported`: no router took any of its turns) is measured the
same way and also *routed*: its decomposer has the recipe's thresholds (``router.tau_au`` /
``router.tau_eu`` or calibrated ones), each line records the route (act / clarify / verify), and
the report counts them per episode beside the inferred tags. Such a run has no saved recipe: the
caller passes one (``prour report RUN --posthoc-uncertainty --posthoc-recipe R``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from prour.build import Builder
from prour.config import Recipe
from prour.env.trajectory import Trajectory, agent_view, read_jsonl, read_trajectories
from prour.eval.harness import EPISODES_FILE, result_key
from prour.files import append_jsonl

logger = logging.getLogger(__name__)

POSTHOC_FILE = "posthoc_uncertainty.jsonl"
MAX_STEPS = 16  # Figure 6: the first 16 steps


def needs_posthoc(method: str) -> bool:
    """Whether a method's episodes carry no AU/EU of their own (no decomposer router)."""
    from prour.eval.methods import check_method

    return check_method(method).router != "decomposer"


def _method(trajectory: Trajectory) -> str:
    """The method of an episode (its agent name without variant, sweep point or step)."""
    return trajectory.agent.split("/")[0].split(" [")[0]


def decision_views(trajectory: Trajectory, max_steps: int = MAX_STEPS) -> list[list[dict]]:
    """The agent's view before each of its first ``max_steps`` decisions, in order."""
    from prour.eval.agent import is_agent_turn

    views = []
    for step in [s for s in trajectory.steps if is_agent_turn(s)][:max_steps]:
        before = [s for s in trajectory.steps if s.message_index < step.message_index]
        views.append(agent_view(trajectory.messages[: step.message_index], before))
    return views


def load_posthoc(run_dir: str | Path) -> dict[str, list[dict[str, Any]]]:
    """Result key → the post-hoc decision records (step, au, eu, total, route: None unless the
    run was imported) of its latest episode."""
    path = Path(run_dir) / POSTHOC_FILE
    if not path.is_file():
        return {}
    started: dict[str, Any] = {}
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for row in read_jsonl(path, on_error="skip"):
        key = row["key"]
        if started.get(key) != row["episode_started_at"]:  # a later episode replaces it
            started[key], out[key] = row["episode_started_at"], {}
        out[key][row["step"]] = {k: row.get(k) for k in ("step", "au", "eu", "total", "route")}
    return {key: [by_step[i] for i in sorted(by_step)] for key, by_step in out.items()}


def _episodes(run_dir: Path) -> tuple[list[tuple[Trajectory, str]], bool]:
    """(episode, method) pairs to measure, and whether they are routed too (an imported run)."""
    from prour.env.tau2_import import TRAJECTORIES_FILE
    from prour.eval.imported import is_imported_run, system_name

    if is_imported_run(run_dir):
        return [(t, system_name(t)) for t in read_trajectories(run_dir / TRAJECTORIES_FILE)
                if t.termination != "error"], True
    return [(t, _method(t)) for t in read_trajectories(run_dir / EPISODES_FILE)
            if needs_posthoc(_method(t)) and t.termination != "error"], False


def posthoc_uncertainty(run_dir: str | Path, recipe: Recipe | None = None,
                        builder: Builder | None = None,
                        max_steps: int = MAX_STEPS) -> dict[str, list[dict[str, Any]]]:
    """Measure AU/EU of every episode of a method without the decomposer at its first
    ``max_steps`` decisions (resumable; see the module docstring); returns
    :func:`load_posthoc`. ``recipe``: the run's ``recipe.resolved.yaml`` when None."""
    run_dir = Path(run_dir)
    episodes, routes = _episodes(run_dir)
    if recipe is None:
        from prour.provenance import RECIPE_FILE
        from prour.recipes import load_recipe

        if routes and not (run_dir / RECIPE_FILE).is_file():
            raise ValueError(f"{run_dir} is an imported run without {RECIPE_FILE}: pass the "
                             "recipe whose models.decomposer and router thresholds route it "
                             "(--posthoc-recipe R)")
        recipe = load_recipe(run_dir / RECIPE_FILE, endpoints=True)
    if not episodes:
        return load_posthoc(run_dir)
    own = builder is None
    builder = builder or Builder(recipe)
    builder.require("the post-hoc decomposer pass", ("decomposer",))
    done = {(row["key"], row["episode_started_at"], row["step"])
            for row in (read_jsonl(run_dir / POSTHOC_FILE, on_error="skip")
                        if (run_dir / POSTHOC_FILE).is_file() else [])}
    decomposers: dict[str, Any] = {}
    try:
        for trajectory, method in episodes:
            key = result_key(trajectory.key)
            for index, view in enumerate(decision_views(trajectory, max_steps)):
                if (key, trajectory.started_at, index) in done:
                    continue
                if trajectory.domain not in decomposers:
                    decomposers[trajectory.domain] = builder.decomposer(
                        trajectory.domain, need_thresholds=routes)
                decision = decomposers[trajectory.domain].decide(
                    view, seed=trajectory.seed * 1000 + index)  # as a live decision's seed
                append_jsonl(run_dir / POSTHOC_FILE, {
                    "key": key, "method": method, "domain": trajectory.domain,
                    "episode_started_at": trajectory.started_at, "step": index,
                    "au": decision.au, "eu": decision.eu, "total": decision.total,
                    "route": decision.route if routes else None})
    finally:
        if own:
            builder.close()
    return load_posthoc(run_dir)
