"""The checks a stage makes on the recipe's values against each other, in one registry, so that
``prour validate``, every stage's preflight and ``prour run`` make them before anything starts.

A recipe loads when each key is valid on its own (:mod:`prour.config`); some values only fail
together, or against the task lists tau2 ships: ``data.num_trajectories`` against the tasks the
split leaves times ``data.trial_seeds``, ``data.calibration_reserve`` against the split's size.
Each stage raised such a problem only when it met it, after its models had loaded (``prour
collect`` with ``--set data.max_tasks=2`` on the smoke recipe: a ``ValueError`` traceback),
while ``prour validate`` said ``ok``.

Each :class:`RecipeCheck` names the stages whose commands make it and calls the very function
the stage calls (the stage raises what it returns): the message is the stage's own. Nothing
here loads a model or reaches a server; a check reads the recipe and tau2's task lists.

- :func:`recipe_problems` checks a recipe as one command runs it (a stage's preflight);
- :func:`run_problems` checks a whole run: each step of the stages on the recipe as that step
  runs it (its own ``--set`` items laid over: the chain's collect-dev collects the reserve's
  tasks, collect-airline airline's), naming the step (``prour validate``, ``prour run``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe
    from prour.step import Step


@dataclass(frozen=True)
class RecipeCheck:
    """One cross-field check: ``problem(recipe)`` is the line the stage raises (None: passes)."""

    name: str  # the recipe key it is about
    stages: tuple[str, ...]  # the stages whose commands make it
    problem: Callable[[Recipe], str | None]


def _reserve(recipe: Recipe) -> str | None:
    from prour.data.reserve import reserve_problem

    return reserve_problem(recipe.data)


def _tasks(recipe: Recipe) -> str | None:
    from prour.data.reserve import tasks_problem

    return tasks_problem(recipe.data)


def _episodes(recipe: Recipe) -> str | None:
    from prour.data.collect import episodes_problem
    from prour.data.reserve import data_task_ids, reserve_problem, tasks_problem

    if reserve_problem(recipe.data) or tasks_problem(recipe.data):
        return None  # no task list to count: those checks name why
    return episodes_problem(len(data_task_ids(recipe.data)), recipe.data)


def _in_flight(recipe: Recipe) -> str | None:
    from prour.eval.queue import check_limits

    try:
        check_limits(recipe)
    except ValueError as exc:
        return str(exc)
    return None


def _attention(recipe: Recipe) -> str | None:
    from prour.eval.kit import attention_problem

    for method in recipe.eval.methods:
        for attention in recipe.eval.variants():
            problem = attention_problem(method, attention)
            if problem:
                return problem
    return None


CHECKS: tuple[RecipeCheck, ...] = (
    RecipeCheck("data.calibration_reserve", ("collect", "normalize", "calibrate", "extract"),
                _reserve),
    RecipeCheck("data.tasks", ("collect", "normalize"), _tasks),
    RecipeCheck("data.num_trajectories", ("collect",), _episodes),
    RecipeCheck("eval.max_in_flight", ("eval",), _in_flight),
    RecipeCheck("eval.attention", ("eval",), _attention),
)


def checks_of(stage: str) -> tuple[RecipeCheck, ...]:
    """The checks ``stage``'s command makes (``stage/step`` counts as its stage)."""
    name = stage.partition("/")[0]
    return tuple(check for check in CHECKS if name in check.stages)


def _run(check: RecipeCheck, recipe: Recipe) -> str | None:
    """The check's line; a recipe it cannot even read (an unknown split) is named as the stage
    would name it."""
    try:
        return check.problem(recipe)
    except (ValueError, LookupError) as exc:
        return str(exc)


def recipe_problems(recipe: Recipe, stages: Iterable[str]) -> list[str]:
    """The lines of the checks ``stages`` make, on ``recipe`` as it is (once each)."""
    seen: dict[str, None] = {}
    for stage in stages:
        for check in checks_of(stage):
            line = _run(check, recipe)
            if line:
                seen.setdefault(line)
    return list(seen)


def step_recipe(recipe: Recipe, step: Step) -> Recipe:
    """``recipe`` as ``step``'s command runs it: with the ``--set`` items of its command laid
    over (they follow the run's own on its command line)."""
    from prour.recipes import with_settings

    argv = step.argv(recipe, "{recipe}")
    items = [argv[at + 1] for at, word in enumerate(argv[:-1]) if word == "--set"]
    return with_settings(recipe, items, f"the --set items of step {step.name}") if items \
        else recipe


def run_problems(recipe: Recipe, stages: Iterable[str],
                 names: Iterable[str] | None = None) -> list[str]:
    """The lines of the checks ``stages`` make, each step of them (of ``names`` when given) on
    its own recipe, as ``<step>: <the stage's line>``; a problem several steps share is named
    once, by the first. Steps the recipe leaves out are not checked."""
    from prour.stages import get_stage

    wanted = set(names) if names is not None else None
    seen: dict[str, str] = {}
    for stage_name in stages:
        stage = get_stage(stage_name)
        if stage.skip(recipe) is not None:
            continue
        checks = checks_of(stage_name)
        for step in stage.steps:
            if step.is_gate or (wanted is not None and step.name not in wanted) or (
                    step.skip is not None and step.skip(recipe) is not None):
                continue
            mine = step_recipe(recipe, step) if checks else recipe
            for check in checks:
                line = _run(check, mine)
                if line and line not in seen:
                    seen[line] = step.name
    return [f"{step}: {line}" for line, step in seen.items()]
