"""A study (:mod:`prour.config.study`) as episodes in ``<run_dir>/study``: its cells, the episodes
each grid plans and the evaluation that runs one cell's.

The study's **cells** are the combinations of axis values its grids take; a cell's recipe is
the run's recipe with each of its values' partial recipes laid over it (a value's
``models.<role>`` replaces the role's model; ``env`` and ``router`` keys are merged). A cell
runs every episode its grids plan for it (method, attention variant, domain, task, seed), each
once however many grids plan it. Every result line records its cell (``axes``) and its attention
variant's label; each grid's lines are the projection :func:`grid_lines` makes for the report.

Running the cells, group by group with the servers each group needs, is
:mod:`prour.cluster.study`'s; the judge pass is :mod:`prour.eval.study_judge`'s.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prour.config.attention import variant_of
from prour.config.study import STUDY_FOLDER, StudyConfig
from prour.eval.arms import Arm
from prour.eval.harness import Evaluation, load_result_lines, result_key, wanted_tasks

if TYPE_CHECKING:  # pragma: no cover
    from prour.build import Builder
    from prour.config import Recipe

logger = logging.getLogger(__name__)

RESULTS_FILE = "results.jsonl"


class StudyError(ValueError):
    """A study that cannot run as the recipe gives it (a missing key, no grid, no cell)."""


# ---- cells and their recipes -------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """One combination of axis values: ((axis, value), ...) in the study's axis order."""

    values: tuple[tuple[str, str], ...]

    @property
    def axes(self) -> dict[str, str]:
        return dict(self.values)

    @property
    def label(self) -> str:
        return " ".join(f"{axis}={value}" for axis, value in self.values) or "(no axis)"


def study_of(recipe: Recipe) -> StudyConfig:
    """The recipe's study section; a StudyError when it has none."""
    if recipe.study is None:
        raise StudyError(f"recipe {recipe.name!r} has no `study` section (see "
                         "recipes/ask-less.yaml for one)")
    return recipe.study


def study_dir(recipe: Recipe) -> Path:
    """The study's evaluation folder: ``<run_dir>/study``."""
    return recipe.resolved_run_dir() / STUDY_FOLDER


def grid_cells(study: StudyConfig, grid: str) -> list[Cell]:
    """The cells of one grid: every combination of the axis values it takes."""
    values = study.grid_values(grid)
    return [Cell(tuple(zip(values, combo))) for combo in itertools.product(*values.values())]


def lay(data: dict[str, Any], layer: dict[str, Any]) -> dict[str, Any]:
    """``layer`` (an axis value's ``set``) laid over recipe data: a model or a server it names
    replaces the recipe's whole; ``env`` and ``router`` keys are merged."""
    from prour.config import merge_recipe

    out = dict(data)
    for section, part in layer.items():
        if section == "models":
            out["models"] = {**out.get("models", {}), **part}
        elif section == "serve":
            serve = dict(out.get("serve", {}))
            serve["models"] = {**serve.get("models", {}), **part.get("models", {})}
            out["serve"] = serve
        else:
            out[section] = merge_recipe(out.get(section, {}), part)
    return out


def cell_recipe(recipe: Recipe, cell: Cell) -> Recipe:
    """The recipe one cell runs on: its values laid over ``recipe``; the episodes do not judge
    (the judge pass is a step of its own)."""
    from prour.recipes import with_data
    from prour.step import ig_clarifier_model

    study = study_of(recipe)

    def laid(data: dict[str, Any]) -> dict[str, Any]:
        for axis, value in cell.values:
            data = lay(data, study.axes[axis][value].set)
        data.setdefault("eval", {})["judge"] = False
        clarifier = ig_clarifier_model(recipe)  # the run trains the IG-Clarifier baseline
        if clarifier is not None and "ig_clarifier" not in data.get("models", {}):
            data["models"]["ig_clarifier"] = clarifier
        return data

    made = with_data(recipe, laid, f"{recipe.name} with study.axes {cell.label}")
    if any(study.axes[axis][value].trained for axis, value in cell.values):
        made = with_trained_generator(made)
    return made


def with_trained_generator(recipe: Recipe) -> Recipe:
    """The recipe with the run's exported final checkpoint as ``models.generator``: served by
    vLLM as the eval step serves it (``eval.generator_backend: vllm``), else loaded in process."""
    from prour.eval.arms import with_checkpoint
    from prour.step import eval_serving, exported

    if recipe.eval.generator_backend == "vllm":
        return eval_serving(recipe)
    return with_checkpoint(recipe, exported(recipe))


# ---- the episodes each grid plans ----------------------------------------------------------------


@dataclass(frozen=True)
class Planned:
    """One episode a grid plans for a cell."""

    method: str
    variant: str | None
    domain: str
    split: str
    task_id: str
    seed: int
    # the split again where it is not eval.split: part of the episode's key (a task id of
    # another task set names another task)
    keyed_split: str | None = None


def grid_scope(recipe: Recipe, grid: str) -> tuple[dict[str, list[str]], str, list[int]]:
    """(domain -> task ids, split, seeds) of a grid: its own keys, else the recipe's ``eval``."""
    from prour.env.domains import select_tasks

    spec, cfg = study_of(recipe).grids[grid], recipe.eval
    split = spec.split or cfg.split
    tasks = spec.tasks if spec.tasks is not None else cfg.tasks
    max_tasks = spec.max_tasks or cfg.max_tasks
    ids = {}
    for domain in spec.domains or cfg.domains:
        wanted = wanted_tasks(tasks, domain) if tasks is not None else None
        if wanted is not None and not wanted:
            continue  # the grid's tasks are all of other domains
        ids[domain] = [t.id for t in select_tasks(domain, split, wanted, max_tasks,
                                                  key=f"study.grids.{grid}.tasks")]
    return ids, split, list(spec.seeds or cfg.seeds)


def grid_plan(recipe: Recipe, grid: str) -> dict[Cell, list[Planned]]:
    """Cell -> the episodes grid ``grid`` plans for it, in method, variant, domain, task, seed
    order."""
    study = study_of(recipe)
    spec = study.grids[grid]
    ids, split, seeds = grid_scope(recipe, grid)
    variants: list[str | None] = list(spec.policies) or [None]
    keyed = split if split != recipe.eval.split else None
    episodes = [Planned(method, variant, domain, split, task_id, seed, keyed)
                for method in spec.methods for variant in variants
                for domain, tasks in ids.items() for task_id in tasks for seed in seeds]
    return {cell: episodes for cell in grid_cells(study, grid)}


def study_plan(recipe: Recipe) -> dict[Cell, list[Planned]]:
    """Every cell of the study with the union of what its grids plan (each episode once)."""
    plan: dict[Cell, dict[Planned, None]] = {}
    for grid in study_of(recipe).grids:
        for cell, episodes in grid_plan(recipe, grid).items():
            plan.setdefault(cell, {}).update(dict.fromkeys(episodes))
    return {cell: list(episodes) for cell, episodes in plan.items()}


def agent_key(planned: Planned, cell: Cell) -> str:
    """The episode's agent name (the last part of its key), as its arm names it."""
    return Arm(planned.method, None, label=planned.variant, axes=cell.values or None,
               split=planned.keyed_split).key


def episode_key(planned: Planned, cell: Cell) -> str:
    """The result key of a planned episode (:func:`prour.eval.harness.result_key`)."""
    return result_key((planned.domain, planned.task_id, planned.seed, agent_key(planned, cell)))


def grid_lines(recipe: Recipe, folder: Path | None = None) -> dict[str, list[dict[str, Any]]]:
    """Grid -> the result lines (latest per key) of the episodes it plans that have one."""
    folder = folder or study_dir(recipe)
    path = folder / RESULTS_FILE
    lines = load_result_lines(path) if path.is_file() else {}
    out = {}
    for grid in study_of(recipe).grids:
        keys = [episode_key(p, cell) for cell, planned in grid_plan(recipe, grid).items()
                for p in planned]
        out[grid] = [lines[k] for k in keys if k in lines]
    return out


def planned_count(recipe: Recipe) -> int:
    """The episodes the whole study runs (shared ones once)."""
    return sum(len(episodes) for episodes in study_plan(recipe).values())


# ---- running the study ----------------------------------------------------------------------------


def cell_roles(recipe: Recipe, episodes: Iterable[Planned]) -> tuple[str, ...]:
    """The roles a cell's episodes call (its methods under their attention variants)."""
    from prour.eval.methods import method_roles

    cfg = recipe.eval
    base = cfg.attention
    roles: dict[str, None] = {}
    for method, variant in dict.fromkeys((p.method, p.variant) for p in episodes):
        attention = None if variant is None or base is None else \
            base.model_copy(update=variant_of(variant).settings())
        roles.update(dict.fromkeys(method_roles(cfg, method, attention)))
    return tuple(roles)


class StudyEvaluation(Evaluation):
    """One cell's episodes in the study folder: the arms are its (method, variant) pairs, the
    jobs exactly the planned episodes; settings and provenance are the study's."""

    def __init__(self, recipe: Recipe, run_dir: Path, cell: Cell, planned: list[Planned],
                 settings: dict[str, Any], builder: Builder, caches: dict[str, Any],
                 progress: bool = True):
        super().__init__(recipe, run_dir, progress, builder=builder)
        self.kit.caches = caches
        self.cell, self.planned, self._settings = cell, planned, settings
        base = recipe.eval.attention
        self.arm_by: dict[tuple[str, str | None, str | None], Arm] = {}
        for method, variant, split in dict.fromkeys((p.method, p.variant, p.keyed_split)
                                                    for p in planned):
            attention = None if variant is None else \
                base.model_copy(update=variant_of(variant).settings())
            self.arm_by[method, variant, split] = Arm(method, attention, label=variant,
                                                      axes=cell.values or None, split=split)
        self.arms = list(self.arm_by.values())
        self.arm_of = {arm.key: arm for arm in self.arms}

    def settings(self) -> dict[str, Any]:
        return self._settings

    def write_provenance(self) -> None:
        """The study writes one provenance for all its cells (:func:`run_study`)."""

    def jobs(self) -> list[tuple[Arm, Any]]:
        from prour.env.domains import get_task
        from prour.env.runner import EpisodeJob

        factories: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        out = []
        for p in self.planned:
            arm = self.arm_by[p.method, p.variant, p.keyed_split]
            made = factories.get((arm.key, p.domain, p.seed))
            if made is None:
                made = (self.kit.agent_factory(arm.method, p.domain, arm.attention,
                                               self.recipe.router, seed=p.seed),
                        self.kit.user_factory(arm.method, seed=p.seed))
                factories[arm.key, p.domain, p.seed] = made
            out.append((arm, EpisodeJob(p.domain, get_task(p.domain, p.task_id, p.split),
                                        arm.key, made[0], made[1], p.seed, p.split)))
        return out

    def _judge(self) -> Any:
        return None  # the judge pass is a step of its own


def study_settings(recipe: Recipe) -> dict[str, Any]:
    """What must match for two runs' study results to sit in one folder: the base recipe's eval
    settings and the axes' definitions (a changed axis value is another study)."""
    from prour.eval.components import generator_rollout
    from prour.eval.run_record import run_settings

    base = recipe.model_copy(update={"eval": recipe.eval.model_copy(update={"judge": False})})
    settings = run_settings(base, generator_rollout(base))
    settings["study"] = {axis: {name: value.model_dump(mode="json") for name, value in values.items()}
                         for axis, values in study_of(recipe).axes.items()}
    return settings
