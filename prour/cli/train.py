"""``prour train --recipe R [--backend local|verl] [--dry-run] [--resume]``, and the local
backend's run; the verl backend's is :mod:`prour.cli.train_verl`, ``train export`` and ``train
report`` have modules of their own."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from prour.build import recipe_reward
from prour.cli.recipe import RecipeOrNoneOpt, SetOpt
from prour.cli.train_run import fsdp_checkpoints, saved_checkpoint, train_recipe

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe
    from prour.config.train import TrainConfig

train_app = typer.Typer(help="DAPO training of the query generator (paper A.2.1).")


def _logging() -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )


@train_app.callback(invoke_without_command=True)
def train(
    ctx: typer.Context,
    recipe: str | None = RecipeOrNoneOpt,
    backend: str = typer.Option(
        None, "--backend", help="local (one process) or verl (Ray, FSDP, vLLM)."
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the plan (verl: the full command) and stop."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue from the newest finished checkpoint."
    ),
    overrides: list[str] = SetOpt,
) -> None:
    """Train ``models.generator`` with the recipe's ``train`` section."""
    if ctx.invoked_subcommand is not None:
        return
    from prour.cli.recipe import (
        hold_run_folder,
        preflight_or_exit,
        preflight_problems,
        resumable,
    )

    loaded, cfg = train_recipe(recipe, overrides, backend)
    _logging()
    if cfg.backend == "verl":
        from prour.cli.train_verl import run_verl as run
    else:
        run = _run_local
    if dry_run:  # the plan, its run-time estimate, then what this node lacks for it
        run(loaded, cfg, dry_run, resume)
        _estimate(loaded, cfg)
        if preflight_problems(loaded, "train/train"):
            raise typer.Exit(2)
        return
    preflight_or_exit(loaded, "train/train")
    out = Path(cfg.output_dir)
    layout = "verl" if fsdp_checkpoints(cfg) else "local"
    with hold_run_folder(out), resumable(lambda: saved_checkpoint(out, layout)):
        run(loaded, cfg, dry_run, resume)  # one trainer per output_dir


def _estimate(loaded: Recipe, cfg: TrainConfig) -> None:
    """Print the dry-run's run-time estimate (:mod:`prour.estimate`); a broken rates file is
    named and skipped, never a reason to stop the dry-run."""
    from prour.train.estimate import train_estimate

    try:
        lines = train_estimate(loaded, cfg)
    except ValueError as exc:
        lines = [f"estimate (train): none ({exc})"]
    typer.echo("\n".join(lines))


def _run_local(recipe: Recipe, cfg: TrainConfig, dry_run: bool, resume: bool) -> None:

    out = Path(cfg.output_dir)
    if dry_run:
        typer.echo(
            f"local backend: {cfg.total_steps} steps x {cfg.states_per_step} states x "
            f"{cfg.rollout.n} samples (keep {cfg.rollout.keep}); checkpoints every "
            f"{cfg.save_every} steps in {out}"
        )
        return
    from prour.train.local import LocalTrainer
    from prour.train.metrics import FailedAsksError

    try:
        trainer = LocalTrainer(recipe, reward_factory=recipe_reward(recipe))
        last = trainer.run(resume=resume)
    except (FileExistsError, FileNotFoundError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except FailedAsksError as exc:  # the responders are down: the step was not trained on
        typer.echo(f"error: {exc}; {saved_checkpoint(out, 'local')}", err=True)
        raise typer.Exit(1) from None
    if trainer.untrained:
        typer.echo(f"lacking: {cfg.train_file} holds no training state (extract routed none to "
                   f"clarify or verify): no update was made; {last} is the initial policy, "
                   "untrained, so that export and eval still run")
        return
    typer.echo(f"checkpoint: {last}\nmetrics: {out / 'metrics.jsonl'}\n"
               f"training curves: prour train report {out}")


def register(app: typer.Typer) -> None:
    app.add_typer(train_app, name="train")
