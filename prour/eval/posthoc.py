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
    """Whether a method's episodes carry no AU/EU of their own (no decomposer router); a system
    outside prour's methods (an imported tau2 run's agent) records none."""
    from prour.eval.methods import METHODS

    return method not in METHODS or METHODS.get(method).router != "decomposer"


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


def _measured(run_dir: Path) -> set[tuple[str, Any, int]]:
    """(result key, episode start, step) of every post-hoc record the run folder holds."""
    path = run_dir / POSTHOC_FILE
    if not path.is_file():
        return set()
    return {(row["key"], row["episode_started_at"], row["step"])
            for row in read_jsonl(path, on_error="skip")}


def posthoc_pending(run_dir: str | Path, max_steps: int = MAX_STEPS) -> int:
    """Decisions the pass has still to measure in ``run_dir`` (0: done; an eval folder without
    episodes has none)."""
    run_dir = Path(run_dir)
    if not (run_dir / EPISODES_FILE).is_file():
        return 0
    episodes, _ = _episodes(run_dir)
    done = _measured(run_dir)
    return sum(1 for trajectory, _ in episodes
               for index, _ in enumerate(decision_views(trajectory, max_steps))
               if (result_key(trajectory.key), trajectory.started_at, index) not in done)


def posthoc_uncertainty(run_dir: str | Path, recipe: Recipe | None = None,
                        builder: Builder | None = None, max_steps: int = MAX_STEPS,
                        concurrency: int | None = None,
                        progress: bool = False) -> dict[str, list[dict[str, Any]]]:
    """Measure AU/EU of every episode of a method without the decomposer at its first
    ``max_steps`` decisions (resumable; see the module docstring); returns
    :func:`load_posthoc`. ``recipe``: the run's ``recipe.resolved.yaml`` when None.
    ``concurrency`` decisions at a time (default ``eval.concurrency``); each line is appended as
    its decision ends, so the order of the file is not the order of the episodes."""
    run_dir = Path(run_dir)
    episodes, routes = _episodes(run_dir)
    if recipe is None:
        recipe = _saved_recipe(run_dir, routes)
    done = _measured(run_dir)
    todo = [(trajectory, method, index, view) for trajectory, method in episodes
            for index, view in enumerate(decision_views(trajectory, max_steps))
            if (result_key(trajectory.key), trajectory.started_at, index) not in done]
    if not todo:
        return load_posthoc(run_dir)
    own = builder is None
    builder = builder or Builder(recipe)
    builder.require("the post-hoc decomposer pass", ("decomposer",))
    decomposers = {domain: builder.decomposer(domain, need_thresholds=routes)
                   for domain in sorted({t.domain for t, *_ in todo})}

    def measure(job: tuple[Trajectory, str, int, list[dict]]) -> None:
        trajectory, method, index, view = job
        decision = decomposers[trajectory.domain].decide(
            view, seed=trajectory.seed * 1000 + index)  # as a live decision's seed
        append_jsonl(run_dir / POSTHOC_FILE, {
            "key": result_key(trajectory.key), "method": method, "domain": trajectory.domain,
            "episode_started_at": trajectory.started_at, "step": index,
            "au": decision.au, "eu": decision.eu, "total": decision.total,
            "route": decision.route if routes else None})

    from concurrent.futures import ThreadPoolExecutor

    from prour.data.routing import DecomposerBar

    workers = concurrency or recipe.eval.concurrency
    logger.info("post-hoc pass: %d decision(s) to measure, %d at a time", len(todo), workers)
    try:
        with ThreadPoolExecutor(max_workers=workers) as pool, \
                DecomposerBar(len(todo), progress) as bar:
            for _ in pool.map(measure, todo):
                bar(1)
    finally:
        if own:
            builder.close()
    return load_posthoc(run_dir)


def _saved_recipe(run_dir: Path, routes: bool) -> Recipe:
    """The eval run's own ``recipe.resolved.yaml`` (an imported run has none: a ValueError)."""
    from prour.provenance import RECIPE_FILE
    from prour.recipes import load_recipe

    if routes and not (run_dir / RECIPE_FILE).is_file():
        raise ValueError(f"{run_dir} is an imported run without {RECIPE_FILE}: pass the "
                         "recipe whose models.decomposer and router thresholds route it "
                         "(--posthoc-recipe R)")
    return load_recipe(run_dir / RECIPE_FILE, endpoints=True)
