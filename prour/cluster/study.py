"""A study run on one node (:mod:`prour.eval.study` plans it): the cells whose endpoint keys
are missing named or left out, the serving groups run one after another, each group's servers
started and its cells' episodes sent through one queue, an endpoint that is down named by its
axis value before its cells start; and the study as the dry run shows it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prour.cluster.study_servers import Group, StudyServers, group_plans, serving_groups
from prour.eval.study import (
    Cell,
    Planned,
    StudyError,
    StudyEvaluation,
    cell_recipe,
    cell_roles,
    grid_cells,
    grid_plan,
    grid_scope,
    planned_count,
    study_dir,
    study_of,
    study_plan,
    study_settings,
)

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe


# ---- endpoints and their keys ----------------------------------------------------------------------


def missing_keys(recipe: Recipe, plan: dict[Cell, list[Planned]]) -> dict[Cell, list[str]]:
    """Cell -> one line per endpoint its episodes call whose key variable is unset: a model with
    its own ``base_url`` and an ``api_key_env`` the recipe (or the cell's axis value) names."""
    from prour.eval.study import cell_roles

    study = study_of(recipe)
    out: dict[Cell, list[str]] = {}
    for cell, planned in plan.items():
        given = {role: (dict(model), f"{axis}={value} (models.{role})")
                 for axis, value in cell.values
                 for role, model in study.axes[axis][value].set.get("models", {}).items()}
        for role in cell_roles(cell_recipe(recipe, cell), planned):
            model, who = given.get(role, (None, f"models.{role}"))
            if model is None and role in recipe.models \
                    and "api_key_env" in recipe.models[role].model_fields_set:
                model = recipe.models[role].model_dump()
            line = _unset_key(model, who) if model is not None else None
            if line:
                out.setdefault(cell, []).append(line)
    return out


def _unset_key(model: dict[str, Any], who: str) -> str | None:
    variable = model.get("api_key_env")
    if not model.get("base_url") or not variable or model.get("api_key_file"):
        return None
    if os.environ.get(variable):
        return None
    return (f"{who}: the endpoint {model['base_url']} takes its key from ${variable}, which is "
            "not set")


def runnable_cells(recipe: Recipe, say: Callable[[str], None]) -> dict[Cell, list[Planned]]:
    """The study plan less the cells whose endpoint keys are missing under
    ``study.missing_key: skip`` (one line each); under ``error`` a StudyError names them all."""
    plan = study_plan(recipe)
    missing = missing_keys(recipe, plan)
    if not missing:
        return plan
    lines = sorted({line for found in missing.values() for line in found})
    if study_of(recipe).missing_key == "error":
        raise StudyError("; ".join(lines) + " (export the variable, or set study.missing_key: "
                         "skip to leave those cells out)")
    for cell in missing:
        say(f"study: skipping {cell.label}: {'; '.join(missing[cell])}")
    return {cell: episodes for cell, episodes in plan.items() if cell not in missing}


# ---- running the study ------------------------------------------------------------------------


def cell_parts(recipe: Recipe, plan: dict[Cell, list[Planned]],
               ) -> tuple[dict[Cell, Recipe], dict[Cell, tuple[str, ...]], list[Group]]:
    """Each cell's recipe and roles, and the serving groups of the cells in ``plan``."""
    recipes = {cell: cell_recipe(recipe, cell) for cell in plan}
    roles = {cell: cell_roles(recipes[cell], plan[cell]) for cell in plan}
    return recipes, roles, serving_groups(recipe, recipes, roles)


def study_groups(recipe: Recipe) -> tuple[dict[Cell, list[Planned]], list[Group]]:
    """The whole study's plan (every cell, keys or not) and its serving groups."""
    plan = study_plan(recipe)
    return plan, cell_parts(recipe, plan)[2]


def run_study(recipe: Recipe, progress: bool = True,
              say: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Run every planned episode missing from the study folder, group by group; the result
    lines of every episode run or found. StudyError/ServeError for a setup that cannot run."""
    from prour.build import Builder
    from prour.cluster.endpoints import apply_endpoints
    from prour.eval.harness import run_evaluations
    from prour.eval.kit import attention_caches
    from prour.eval.methods import check_method
    from prour.router.recalibrate import recalibrate

    if recipe.eval.attention is None and any(s.policies for s in study_of(recipe).grids.values()):
        raise StudyError("the study's grids list attention variants: the recipe needs an "
                         "eval.attention section (their other settings)")
    plan = runnable_cells(recipe, say)
    if not plan:
        raise StudyError("no cell of the study can run (every one was skipped)")
    folder = study_dir(recipe)
    recipes, roles, groups = cell_parts(recipe, plan)
    settings = study_settings(recipe)
    caches = attention_caches(folder / "attention")
    write_study_provenance(recipe, folder, plan, groups)
    servers = StudyServers(recipe, say)
    root = Builder(recipe)
    results: list[dict[str, Any]] = []
    try:
        for number, group in enumerate(groups, 1):
            say(f"study: group {number} of {len(groups)}: {group.label}")
            record = servers.ensure(group_plans(recipes, roles, group))
            served = {cell: apply_endpoints(recipes[cell], record) for cell in group.cells}
            check_reachable(served, roles)
            builders = {cell: root.sibling(served[cell]) for cell in group.cells}
            for cell in group.cells:
                if any(check_method(p.method).router == "decomposer" for p in plan[cell]):
                    recalibrate(builders[cell], say)
            evaluations = [StudyEvaluation(served[cell], folder, cell, plan[cell], settings,
                                           builders[cell], caches, progress)
                           for cell in group.cells]
            found = run_evaluations(evaluations, progress)
            check_cells(evaluations, found, recipe.eval.max_error_fraction)
            results += found
    finally:
        servers.stop_all()
        root.close()
    return results


def check_reachable(recipes: dict[Cell, Recipe], roles: dict[Cell, tuple[str, ...]]) -> None:
    """A StudyError naming the cell and role of every model server (an API endpoint, a served
    backbone) that does not answer its model list, before any episode of the group starts."""
    from prour.cluster.endpoints import probe_endpoint
    from prour.llm.openai import request_key

    seen: dict[tuple[str, str | None], str | None] = {}
    down = []
    for cell, cell_recipe_ in recipes.items():
        for role in roles[cell]:
            cfg = cell_recipe_.models.get(role)
            if cfg is None or cfg.backend != "openai" or not cfg.base_url:
                continue
            where = (cfg.base_url, cfg.model)
            if where not in seen:
                seen[where] = probe_endpoint(cfg.base_url, cfg.model,
                                             request_key(cfg.api_key_env, cfg.api_key_file))
            if seen[where]:
                down.append(f"{cell.label} (models.{role}, {cfg.model}): {seen[where]}")
    if down:
        raise StudyError("; ".join(down) + " — nothing of this group ran; a rerun resumes")


def check_cells(evaluations: list[StudyEvaluation], results: list[dict[str, Any]],
                max_fraction: float) -> None:
    """TooManyErrors naming the cell when more than ``max_fraction`` of one cell's episodes
    errored (a backbone that went down mid-run); the episodes run so far are kept."""
    from prour.eval.harness import TooManyErrors, check_errors

    at = 0
    for evaluation in evaluations:
        lines = results[at:at + len(evaluation.planned)]
        at += len(evaluation.planned)
        try:
            check_errors(lines, max_fraction)
        except TooManyErrors as exc:
            raise TooManyErrors(f"{evaluation.cell.label}: {exc}") from None


def write_study_provenance(recipe: Recipe, folder: Path, plan: dict[Cell, list[Planned]],
                           groups: list[Group]) -> None:
    """The study folder's resolved recipe and provenance: cells, groups, episodes per grid."""
    from prour.provenance import write_provenance

    write_provenance(folder, recipe, extra={
        "study": {
            "cells": [cell.label for cell in plan],
            "groups": [[cell.label for cell in group.cells] for group in groups],
            "group_servers": [sorted(group.servers) for group in groups],
            "episodes": {grid: sum(len(e) for e in grid_plan(recipe, grid).values())
                         for grid in study_of(recipe).grids},
            "planned": sum(len(e) for e in plan.values()),
        }})


# ---- what the dry run says ------------------------------------------------------------------------


def describe_study(recipe: Recipe) -> list[str]:
    """The study as the dry run shows it: each grid's episodes, the serving groups with the
    servers each starts (and its GPU plan), how each cell reaches the models its axis values
    set, the models every cell shares, and the endpoint keys that are missing."""
    from prour.cluster.gpu_plan import gpu_plan

    study = study_of(recipe)
    lines = [_grid_line(recipe, grid) for grid in study.grids]
    plan = study_plan(recipe)
    lines.append(f"study: {planned_count(recipe):,} episodes in all (an episode several grids "
                 f"plan runs once), {len(plan)} cell(s)")
    recipes, roles, groups = cell_parts(recipe, plan)
    own = {cell: {role for axis, value in cell.values
                  for role in [*study.axes[axis][value].set.get("models", {}),
                               *(["generator"] if study.axes[axis][value].trained else [])]}
           for cell in plan}
    for number, group in enumerate(groups, 1):
        served = ", ".join(f"{m} ({_gpus(spec.gpus)})" for m, spec in group.servers.items())
        lines.append(f"serving group {number}: serves {served or 'nothing'}")
        if group.servers:
            lines += [f"  {line}" for line in
                      gpu_plan(recipe, "serve", group.servers).text().splitlines()]
        for cell in group.cells:
            mine = [r for r in roles[cell] if r in own[cell]]
            lines.append(f"  {cell.label}: "
                         + ("; ".join(_reaches(recipes[cell], mine)) or "the recipe's models"))
    shared = sorted({r for cell in plan for r in roles[cell]}
                    - {r for cell in plan for r in own[cell]})  # no cell changes them
    if plan:
        first = next(iter(plan))
        lines.append("every cell: " + "; ".join(_reaches(recipes[first], shared)))
    missing = sorted({line for found in missing_keys(recipe, plan).values() for line in found})
    lines += [f"missing key: {line}" for line in missing]
    return lines


def _grid_line(recipe: Recipe, grid: str) -> str:
    """One grid's episodes: cells x methods x variants x tasks x seeds."""
    spec = study_of(recipe).grids[grid]
    ids, split, seeds = grid_scope(recipe, grid)
    cells = grid_cells(study_of(recipe), grid)
    tasks = ", ".join(f"{d} {len(t)}" for d, t in ids.items())
    variants = len(spec.policies) or 1
    total = len(cells) * len(spec.methods) * variants * sum(map(len, ids.values())) * len(seeds)
    return (f"grid {grid}: {len(cells)} cell(s) x {len(spec.methods)} method(s) x {variants} "
            f"variant(s) x tasks ({split}: {tasks}) x {len(seeds)} seed(s) = {total:,} episodes")


def _gpus(ids: list[int] | None) -> str:
    if ids is None:
        return "the job's GPUs"
    return f"GPU {','.join(map(str, ids))}" if ids else "CPU"


def _reaches(recipe: Recipe, roles: Iterable[str]) -> list[str]:
    """How each role a cell calls is reached: its server, an endpoint, in process."""
    from prour.cluster.recipe import served_roles

    served = {role: model_id for model_id, users in served_roles(recipe).items()
              for role in users}
    out = []
    for role in roles:
        cfg = recipe.models.get(role)
        if cfg is None:
            out.append(f"{role}: not in the recipe")
        elif role in served:
            out.append(f"{role}: {served[role]} served")
        elif cfg.backend == "openai":
            out.append(f"{role}: {cfg.model} at {cfg.base_url or 'the endpoints file'} "
                       f"(key ${cfg.api_key_env})")
        else:
            out.append(f"{role}: {cfg.path or cfg.script} {cfg.backend} in process")
    return out


def study_estimate(recipe: Recipe, episode_s: float | None,
                   source: str | None) -> tuple[list[str], float | None]:
    """The study's episodes, serving group after serving group, each group's through one queue
    at ``eval.concurrency``: (lines, total seconds; None without a rate). Seconds per episode:
    the median of the study folder's finished episodes of the same cell when it has some, else
    ``episode_s`` (``source`` says where it comes from)."""
    import statistics

    from prour.eval.harness import load_result_lines

    plan, groups = study_groups(recipe)
    conc = recipe.eval.concurrency
    path = study_dir(recipe) / "results.jsonl"
    seconds: dict[str, list[float]] = {}
    for row in (load_result_lines(path).values() if path.is_file() else ()):
        if isinstance(row.get("seconds"), (int, float)) and not row.get("error") \
                and row.get("axes"):
            label = " ".join(f"{axis}={value}" for axis, value in row["axes"].items())
            seconds.setdefault(label, []).append(float(row["seconds"]))
    lines = [(f"estimate (study): {sum(map(len, plan.values())):,} episodes in {len(groups)} "
              "serving group(s), one group after another, each through one queue at "
              f"eval.concurrency {conc}")]
    total, sources = 0.0, set()
    for number, group in enumerate(groups, 1):
        count = sum(len(plan[cell]) for cell in group.cells)
        work = 0.0
        for cell in group.cells:
            measured = seconds.get(cell.label)
            if measured:
                work += len(plan[cell]) * statistics.median(measured)
                sources.add(f"measured: median of the cell's finished episodes in {path}")
            elif episode_s is not None:
                work += len(plan[cell]) * episode_s
                sources.add(source or "a recorded rate")
            else:
                lines += [f"  group {number}: {count:,} episodes, no episode rate recorded",
                          "  total: none (no episode rate)"]
                return lines, None
        total += work / conc
        lines.append(f"  group {number} ({len(group.cells)} cell(s), serves "
                     f"{', '.join(group.servers) or 'nothing'}): {count:,} episodes = "
                     f"{work / conc / 3600:,.1f} h")
    lines.append(f"  total: {total / 3600:,.1f} h of episodes; the judge pass (one judge call "
                 "per delivered request) and the report are not estimated")
    lines += [f"  episode seconds {s}" for s in sorted(sources)]
    lines.append("  assumes: an episode takes the seconds above at any number in flight up to "
                 "eval.concurrency (the servers and endpoints keep up)")
    return lines, total
