"""``prour tiny-model PATH``: build the tiny Qwen3 (and its warm start) into PATH.

The same model ``prour demo`` builds for the smoke recipe, as a command of its own, so that a
recipe that serves it (recipes/rehearsal.yaml) needs no hand-made file: a random-init Qwen3 with
a locally trained tokenizer and a position limit long enough for tau2's retail prompts, then a
short supervised pass on CPU so that its outputs parse (:mod:`prour.demo.warmstart`). A folder
already built with the same arguments is reused.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer

PathArg = typer.Argument(..., help="Folder to write the model into (reused when built with the "
                         "same arguments).")
WarmOpt = typer.Option(True, "--warm-start/--no-warm-start",
                       help="Warm-start the model so that its outputs parse.")
SeedOpt = typer.Option(0, "--seed", help="Seed of the weights and the warm start.")
StepsOpt = typer.Option(None, "--steps", min=0, help="Warm-start steps (default: the demo's).")


def tiny_model(
    path: Path = PathArg, warm: bool = WarmOpt, build_seed: int = SeedOpt,
    steps: int | None = StepsOpt,
) -> None:
    """Build the tiny Qwen3 the CPU recipes serve or load (smoke, rehearsal) into PATH."""
    from prour.demo.warmstart import DEFAULT_STEPS, prepare_tiny_model

    start = time.perf_counter()
    try:
        built = prepare_tiny_model(path, warm=warm, seed=build_seed,
                                   steps=DEFAULT_STEPS if steps is None else steps)
    except FileExistsError as exc:  # a file at PATH (or above it), or a folder of other files
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"tiny model ready in {time.perf_counter() - start:.0f} s: {built} "
               f"(warm start: {'yes' if warm else 'no'})")


def register(app: typer.Typer) -> None:
    """Add ``tiny-model`` to the ``prour`` app."""
    app.command("tiny-model")(tiny_model)
