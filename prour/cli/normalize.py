"""``prour normalize``: each task's instruction rewritten into the first-person goal G*."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from prour.cli.data import BadLineOpt, data_recipe, split_tasks, stage_builder
from prour.cli.recipe import RecipeOpt, SetOpt

FromTrajectoriesOpt = typer.Option(
    None, "--from",
    help="Normalize the tasks of these trajectories (e.g. DIR/trajectories.jsonl of `prour "
         "import tau2`), any domain, instead of data.split's.",
)


def _tasks_of_trajectories(path: str, on_bad_line: str) -> dict[str, list[Any]]:
    """The installed tau2 tasks the trajectories of ``path`` ran on, by domain, in file order."""
    from prour.data.collect import load_trajectories
    from prour.env.domains import get_task

    ids: dict[str, list[str]] = {}
    for traj in load_trajectories(path, on_bad_line):
        if traj.task_id not in ids.setdefault(traj.domain, []):
            ids[traj.domain].append(traj.task_id)
    return {domain: [get_task(domain, task_id) for task_id in task_ids]
            for domain, task_ids in ids.items()}


def normalize(recipe: str = RecipeOpt, overrides: list[str] | None = SetOpt,
              on_bad_line: str | None = BadLineOpt,
              from_trajectories: str | None = FromTrajectoriesOpt) -> None:
    """Rewrite each task's instruction into the first-person goal G*; flags lost values."""
    from prour.cli.failures import backend_failures
    from prour.cli.recipe import hold_run_folder, preflight_or_exit, resumable, saved_lines
    from prour.data.normalize import normalize_tasks
    from prour.data.pipeline import record_provenance
    from prour.router.thresholds import decomposer_model_id

    loaded = data_recipe(recipe, overrides, on_bad_line)
    cfg = loaded.data
    preflight_or_exit(loaded, "normalize")
    builder = stage_builder(loaded, "normalize", "normalizer")
    path = Path(cfg.goals)
    record_provenance(loaded, "normalize")
    saved = lambda: (f"{saved_lines(path, 'goals')}; rerun `prour normalize` with the same "
                     "recipe to normalize only the missing ones")
    if from_trajectories is None:
        by_domain = {cfg.domain: split_tasks(loaded)}
    else:
        try:
            by_domain = _tasks_of_trajectories(from_trajectories, cfg.on_bad_line)
        except (FileNotFoundError, ValueError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
    goals = []
    # one writer per goals folder: two normalizers would both append a missing goal
    with hold_run_folder(path.parent), resumable(saved), backend_failures(loaded, "normalize"):
        for domain, tasks in by_domain.items():
            goals += normalize_tasks(tasks, domain, builder.llm("normalizer"), path,
                                     decomposer_model_id(loaded.models["normalizer"]), cfg)
    flagged = [g for g in goals if g.flagged]
    for goal in flagged:
        lost = ", ".join(f"{m['kind']} {m['text']!r}" for m in goal.missing) or "empty goal"
        typer.echo(f"flag {goal.domain}/{goal.task_id}: missing {lost}")
    typer.echo(f"{len(goals)} goals in {path}; {len(flagged)} flagged")


def register(app: typer.Typer) -> None:
    app.command("normalize")(normalize)
