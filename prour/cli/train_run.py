"""What the ``prour train`` commands share about a training run: its recipe and train section,
the layout its checkpoints are saved in, and what an interrupted run kept."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe
    from prour.config.train import TrainConfig


def train_recipe(recipe: str | None, overrides: list[str] | None,
                 backend: str | None) -> tuple[Recipe, TrainConfig]:
    """Recipe (``--backend`` is ``train.backend``) and its train section; exit 2 naming the key,
    or naming checkpoints of this run found where an older prour put them."""
    from prour.cli.recipe import recipe_errors
    from prour.recipes import load_recipe
    from prour.train.checkpoint import old_checkpoints
    from prour.train.recipe import train_section

    if recipe is None:
        typer.echo("error: --recipe is required", err=True)
        raise typer.Exit(2)

    with recipe_errors():
        loaded = load_recipe(recipe, overrides, flags={"train.backend": backend}, endpoints=True)
        cfg = train_section(loaded)
    moved = old_checkpoints(cfg.output_dir, loaded.run_dir, loaded.name)
    if moved:
        typer.echo(f"error: {moved}", err=True)
        raise typer.Exit(2)
    return loaded, cfg


def fsdp_checkpoints(cfg: TrainConfig) -> bool:
    """Whether training saves verl's ``global_step_N`` FSDP shards (else ``step_N`` Hugging Face
    folders: the local trainer, and verl's CPU rehearsal)."""
    return cfg.backend == "verl" and cfg.verl.engine != "cpu_rehearsal"


def saved_checkpoint(out: Path, backend: str) -> str:
    """What an interrupted training kept: its newest checkpoint and how a rerun resumes."""
    from prour.train.checkpoint import latest_checkpoint, latest_verl_step

    step = latest_verl_step(out) if backend == "verl" else latest_checkpoint(out)
    if step is None:
        return f"no checkpoint saved yet in {out} (train.save_every); a rerun starts over"
    name = f"global_step_{step}" if backend == "verl" else Path(step).name
    return (f"newest checkpoint {out / name}, metrics in {out / 'metrics.jsonl'}; rerun with "
            "--resume to continue from it")
