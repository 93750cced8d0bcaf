"""``prour posthoc RUN --recipe R``: the decomposer's AU/EU over a run's episodes that record none
of their own (Figure 6's baselines)."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import typer

from prour.cli.eval import ProgressOpt
from prour.cli.recipe import RecipeOpt, SetOpt


def _fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def posthoc_command(
    run: str = typer.Argument(..., metavar="RUN", help="An eval run folder (`prour eval`'s)."),
    recipe: str = RecipeOpt,
    overrides: list[str] | None = SetOpt,
    progress: bool = ProgressOpt,
) -> None:
    """Figure 6 for the baselines: the recipe's decomposer measures AU/EU at the first 16
    decisions of each episode of RUN whose method records none of its own, appended to
    RUN/posthoc_uncertainty.jsonl (a rerun measures only what is missing; `prour report RUN`
    draws the curves)."""
    from prour.cli.failures import backend_failures
    from prour.cli.recipe import hold_run_folder, recipe_errors, resumable, saved_lines
    from prour.config import ConfigError
    from prour.eval.posthoc import POSTHOC_FILE, posthoc_uncertainty
    from prour.recipes import load_recipe

    if not (Path(run) / "episodes.jsonl").is_file():
        _fail(f"{run} holds no episodes.jsonl: run `prour eval` into it first")
    with recipe_errors():
        loaded = load_recipe(recipe, overrides, endpoints=True)
    path = Path(run) / POSTHOC_FILE
    saved = lambda: (f"{saved_lines(path, 'post-hoc decisions')}; rerun the same command to "
                     "measure only the missing ones")
    with hold_run_folder(run), resumable(saved), backend_failures(loaded, "posthoc", run):
        try:
            measured = posthoc_uncertainty(run, loaded, progress=progress)
        except (OSError, ValueError, LookupError, ConfigError) as exc:
            _fail(f"posthoc on {run}: {exc}")
    typer.echo(f"post-hoc AU/EU: {len(measured)} episode(s) in {path}")


def register(app: typer.Typer) -> None:
    """Add ``posthoc`` to the ``prour`` app."""
    app.command("posthoc")(posthoc_command)
