"""``prour collect | normalize | extract | data stats``: the data stage from tau2 tasks to parquet."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from prour.cli.recipe import RecipeOpt, SetOpt

if TYPE_CHECKING:  # pragma: no cover
    from prour.build import Builder
    from prour.config import Recipe

data_app = typer.Typer(help="Inspect training datasets.", no_args_is_help=True)

BadLineOpt = typer.Option(
    None, "--on-bad-line",
    help="Corrupt JSONL input lines: 'error' refuses the file, 'skip' reports and skips them "
         "(default: data.on_bad_line).",
)
ProgressOpt = typer.Option(True, "--progress/--no-progress", help="Show progress bars.")


def _recipe(path: str, overrides: list[str] | None, on_bad_line: str | None = None) -> Recipe:
    """The resolved recipe, ``--on-bad-line`` being ``data.on_bad_line``."""
    from prour.cli.recipe import recipe_errors
    from prour.recipes import load_recipe

    with recipe_errors():
        return load_recipe(path, overrides, flags={"data.on_bad_line": on_bad_line},
                           endpoints=True)


def _builder(recipe: Recipe, command: str, *roles: str) -> Builder:
    """The recipe's builder, or exit naming the roles the command needs and lacks."""
    from prour.build import Builder, missing_roles

    for line in missing_roles(recipe.models, {f"`prour {command}`": roles}):
        typer.echo(f"error: {line}", err=True)
        raise typer.Exit(2)
    return Builder(recipe)


def _tasks(recipe: Recipe) -> list[Any]:
    from prour.data.reserve import data_tasks

    return data_tasks(recipe.data)


def _report_skipped(path: Path, skipped: list[int]) -> None:
    if skipped:
        lines = ", ".join(f"{path}:{n}" for n in skipped)
        typer.echo(f"warning: skipped {len(skipped)} corrupt line(s): {lines}", err=True)


def _saved_trajectories(out: Path) -> str:
    """``N trajectories saved in <out>`` counted by episode key (a retry not yet compacted into
    the file is one), with the errored ones the rerun runs again."""
    from prour.data.collect import stored_episodes

    episodes, errored = stored_episodes(out)
    again = f" ({errored} errored: the rerun runs them again)" if errored else ""
    return f"{episodes} trajectories saved in {out}{again}"


def collect(recipe: str = RecipeOpt, overrides: list[str] | None = SetOpt,
            progress: bool = ProgressOpt) -> None:
    """Run task agent + teacher + user episodes on the data split; resumable (reruns skip done
    episodes and retry errored ones). Exits 1 when more than data.max_error_fraction of the
    episodes ended in an error."""
    from prour.cli.recipe import hold_run_folder, preflight_or_exit, resumable
    from prour.data.collect import (
        EpisodeFactories,
        check_collection,
        collect_trajectories,
        teacher_exchanges,
    )
    from prour.data.pipeline import record_provenance
    from prour.env.runner import TooManyErrors

    loaded = _recipe(recipe, overrides)
    cfg, env = loaded.data, loaded.env
    preflight_or_exit(loaded, "collect")
    builder = _builder(loaded, "collect", "agent", "user", *(["teacher"] if cfg.teacher else []))
    factories = EpisodeFactories(
        make_agent=builder.task_agent, make_user=builder.user_simulator,
        teacher=builder.llm("teacher") if cfg.teacher else None, cfg=cfg)
    out = Path(cfg.trajectories)
    from prour.data.collect import stored_episodes
    from prour.llm.openai import retried_requests

    errored_before, retried_before = stored_episodes(out)[1], retried_requests()
    saved = lambda: (f"{_saved_trajectories(out)}; rerun `prour collect` with the same recipe to "
                     "collect only the missing ones")
    with hold_run_folder(out.parent), resumable(saved):  # one collector per trajectories folder
        record_provenance(loaded, "collect", output=out)
        trajs = collect_trajectories(_tasks(loaded), factories, cfg, out, progress=progress,
                                     limits=env, notify=lambda line: typer.echo(line, err=True))
    rewards = [t.reward for t in trajs if t.reward is not None]
    errored = sum(t.termination == "error" for t in trajs)
    asked = sum(len(teacher_exchanges(t)) for t in trajs)
    mean = sum(rewards) / len(rewards) if rewards else float("nan")
    retried = retried_requests() - retried_before
    typer.echo(f"{len(trajs)} trajectories in {out}: mean reward {mean:.3f}, {errored} errored, "
               f"{asked} teacher question(s); retried: {errored_before} errored episode(s) of "
               f"an earlier run, {retried} request(s) after a transient backend error")
    try:
        check_collection(trajs, cfg)
    except TooManyErrors as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


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

    loaded = _recipe(recipe, overrides, on_bad_line)
    cfg = loaded.data
    preflight_or_exit(loaded, "normalize")
    builder = _builder(loaded, "normalize", "normalizer")
    path = Path(cfg.goals)
    record_provenance(loaded, "normalize")
    saved = lambda: (f"{saved_lines(path, 'goals')}; rerun `prour normalize` with the same "
                     "recipe to normalize only the missing ones")
    if from_trajectories is None:
        by_domain = {cfg.domain: _tasks(loaded)}
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


def extract(recipe: str = RecipeOpt, overrides: list[str] | None = SetOpt,
            on_bad_line: str | None = BadLineOpt, progress: bool = ProgressOpt) -> None:
    """Split, route every state with the decomposer, and write train/validation parquet + card
    (with data.states=every: every decision state as a clarify row, no decomposer)."""
    from prour.cli.failures import backend_failures, complete_hints
    from prour.cli.recipe import hold_run_folder, preflight_or_exit, resumable, saved_lines
    from prour.data.card import drop_lines
    from prour.data.extract_summary import prompts_warning
    from prour.data.pipeline import run_extract

    loaded = _recipe(recipe, overrides, on_bad_line)
    preflight_or_exit(loaded, "extract")
    tokenizer_role = [] if loaded.data.tokenizer else ["generator"]
    routed = loaded.data.states == "routed"
    builder = _builder(loaded, "extract", "decomposer", *tokenizer_role) if routed else None
    decisions = Path(loaded.data.decisions)
    saved = lambda: (f"{saved_lines(decisions, 'decomposer decisions')} (the parquet splits are "
                     "written at the end); rerun `prour extract` with the same recipe: it reuses "
                     "them") if routed else ("nothing (the parquet splits are written at the "
                                             "end); rerun `prour extract` with the same recipe")
    try:
        with hold_run_folder(decisions.parent), resumable(saved), \
                backend_failures(loaded, "extract"):
            result = run_extract(loaded, builder, progress=progress)
    except (FileNotFoundError, KeyError, ValueError) as exc:
        text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        typer.echo(f"error: {complete_hints(str(text), loaded)}", err=True)
        raise typer.Exit(1) from None
    _report_skipped(result.trajectories_path, result.skipped_lines)
    if result.errors:
        typer.echo("schema check failed:\n" + "\n".join(result.errors[:20]), err=True)
        raise typer.Exit(1)
    extraction = result.card["extraction"]
    warning = prompts_warning(extraction["prompts_hashes"], extraction["prompts_hash"])
    if warning is not None:
        typer.echo(f"warning: {warning}", err=True)
    rows = extraction["rows"]
    typer.echo(f"train {rows['train']} rows, validation {rows['validation']} rows in "
               f"{result.dataset_dir}")
    for line in drop_lines(extraction):
        typer.echo(line)
    if not any(rows.values()):
        from prour.data.extract_summary import empty_reason

        check = ("check the thresholds and the decomposer model" if routed else
                 "every decision state was dropped: see the counts above")
        typer.echo(f"lacking: {empty_reason(result.card['extraction'])}; the dataset is empty, "
                   f"so `prour train` saves the initial policy as its final step, untrained "
                   f"({check})")


@data_app.command("stats")
def stats(dataset_dir: str = typer.Argument(..., help="Folder with train/validation .parquet.")
          ) -> None:
    """Print the dataset card and write card.md and card.json next to the parquet files."""
    from prour.cli.failures import complete_from_records
    from prour.data.card import card_markdown, write_card

    try:
        card, json_path, md_path = write_card(dataset_dir)
    except (FileNotFoundError, ValueError) as exc:
        typer.echo(f"error: {complete_from_records(str(exc), dataset_dir)}", err=True)
        raise typer.Exit(1) from None
    typer.echo(card_markdown(card))
    typer.echo(f"written: {md_path}, {json_path}")


def register(app: typer.Typer) -> None:
    """Add ``collect``, ``normalize``, ``extract`` and the ``data`` group to the main app."""
    app.command("collect")(collect)
    app.command("normalize")(normalize)
    app.command("extract")(extract)
    app.add_typer(data_app, name="data")
