"""``prour train`` with ``train.backend: verl``: the launch of verl's trainer (Ray, FSDP, vLLM),
its CPU rehearsal, and the untrained final step when the train file holds no state."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from prour.cli.train_run import saved_checkpoint

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe
    from prour.config.train import TrainConfig


def run_verl(recipe: Recipe, cfg: TrainConfig, dry_run: bool, resume: bool) -> None:
    """Launch verl for the recipe (with ``dry_run``, print its command and memory plan only)."""
    from prour.cluster.gpu_plan import gpu_plan
    from prour.train.checkpoint import latest_verl_step
    from prour.train.verl_backend import launch, no_training_state, prepare_verl_run

    lacking = no_training_state(cfg)
    if lacking is not None:  # verl cannot read it: do what the local trainer does
        _save_untrained_verl(recipe, cfg, lacking, dry_run)
        return
    if cfg.verl.engine == "cpu_rehearsal":
        _rehearse(recipe, cfg, dry_run)
        return
    memory = gpu_plan(recipe, "train")  # trainer + its responders on this node (GPU memory)
    run = prepare_verl_run(recipe, cfg, write=not dry_run, resume=resume)
    if dry_run or not memory.fits:
        typer.echo(run.shell() if dry_run else "", nl=dry_run)
        typer.echo(memory.text(), err=not memory.fits)
        if not memory.fits:
            raise typer.Exit(2)
        return
    if not resume and latest_verl_step(run.output_dir) is not None:
        typer.echo(
            f"error: {run.output_dir} already holds verl checkpoints; pass --resume or use a new "
            "train.output_dir",
            err=True,
        )
        raise typer.Exit(2)
    raise typer.Exit(launch(run))


def _save_untrained_verl(recipe: Recipe, cfg: TrainConfig, lacking: str, dry_run: bool) -> None:
    """An empty train file under the verl backend: the initial policy becomes the final step
    (as the local trainer saves it), verl is not launched, and the run says what it lacked."""
    from prour.train.checkpoint import step_dir
    from prour.train.verl_backend import save_untrained

    if dry_run:
        typer.echo(f"verl backend: {lacking} (extract routed none to clarify or verify): `prour "
                   f"train` would save the initial policy as "
                   f"{step_dir(cfg.output_dir, cfg.total_steps)}, untrained, without launching "
                   "verl")
        return
    try:
        last = save_untrained(recipe, cfg, lacking)
    except (FileNotFoundError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"lacking: {lacking} (extract routed none to clarify or verify): no update was "
               f"made and verl was not launched; {last} is the initial policy, untrained, so "
               "that export and eval still run")


def _rehearse(recipe: Recipe, cfg: TrainConfig, dry_run: bool) -> None:
    """``train.verl.engine: cpu_rehearsal``: verl's trainer code on CPU, one policy rank per
    Ray node, resuming from the newest ``step_N`` (:func:`prour.train.verl_ext.rehearsal.
    rehearse`)."""
    from prour.config.train import actor_dp_size

    out = Path(cfg.output_dir)
    if dry_run:
        typer.echo(f"verl CPU rehearsal: {cfg.total_steps} steps, {actor_dp_size(cfg.verl)} policy "
                   f"rank(s) on Ray (one per node), checkpoints step_N in {out}")
        return
    from prour.train.metrics import FailedAsksError
    from prour.train.verl_ext.rehearsal import RankLostError, rehearse

    try:
        last = rehearse(recipe, cfg)
    except RankLostError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    except FailedAsksError as exc:  # the responders are down: verl's sampler stopped the step
        typer.echo(f"error: {exc}; {saved_checkpoint(out, 'local')}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"checkpoint: {last}\nmetrics: {out / 'metrics.jsonl'}")
