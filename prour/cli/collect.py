"""``prour collect``: task agent, teacher and user episodes on the data split, resumable."""

from __future__ import annotations

from pathlib import Path

import typer

from prour.cli.data import ProgressOpt, data_recipe, split_tasks, stage_builder
from prour.cli.recipe import RecipeOpt, SetOpt


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

    loaded = data_recipe(recipe, overrides)
    cfg, env = loaded.data, loaded.env
    preflight_or_exit(loaded, "collect")
    builder = stage_builder(loaded, "collect", "agent", "user", *(["teacher"] if cfg.teacher else []))
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
        trajs = collect_trajectories(split_tasks(loaded), factories, cfg, out, progress=progress,
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


def register(app: typer.Typer) -> None:
    app.command("collect")(collect)
