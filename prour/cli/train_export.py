"""``prour train export``: a saved checkpoint of the run as a Hugging Face folder."""

from __future__ import annotations

from pathlib import Path

import typer

from prour.cli.recipe import RecipeOrNoneOpt, SetOpt
from prour.cli.train_run import fsdp_checkpoints, train_recipe

TargetOpt = typer.Option(None, "--target", help="Output folder (default: <output_dir>/step_N).")


def export(
    recipe: str | None = RecipeOrNoneOpt,
    step: int = typer.Option(None, "--step", help="verl step to convert (default: the newest)."),
    target: Path = TargetOpt,
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the verl.model_merger command (or the local folder) only."
    ),
    overrides: list[str] = SetOpt,
) -> None:
    """Write a saved checkpoint of the run as a Hugging Face folder (what `prour eval` loads).

    verl (FSDP shards) is merged into ``<output_dir>/step_N``; a local ``step_N`` already is one,
    so it is checked (and copied to ``--target`` without the trainer state).
    """
    import shlex

    from prour.train.checkpoint import export_hf
    from prour.train.verl_backend import ExportError, export_checkpoint

    _recipe, cfg = train_recipe(recipe, overrides, None)
    out = Path(cfg.output_dir)
    try:
        if fsdp_checkpoints(cfg):
            command, folder = export_checkpoint(out, step, target, dry_run=dry_run)
        else:
            source = export_hf(out, step)
            folder = source if dry_run or target is None else export_hf(out, step, target)
            command = []
    except (FileNotFoundError, ExportError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if dry_run and command:
        typer.echo(shlex.join(command))
    elif dry_run:
        copy = f"; would copy it without the trainer state to {target}" if target else ""
        typer.echo(f"{folder} is a Hugging Face folder already{copy}")
    else:
        typer.echo(f"exported: {folder}")


def register(train_app: typer.Typer) -> None:
    """Add ``export`` to the ``prour train`` group."""
    train_app.command("export")(export)
