"""``prour data stats``, and what the data stage's commands share (``prour collect``,
``normalize``, ``extract``, each in its own module): the recipe with ``--on-bad-line``, the
builder of the roles a command needs, the tasks of the data split, the common options."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

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


def data_recipe(path: str, overrides: list[str] | None, on_bad_line: str | None = None) -> Recipe:
    """The resolved recipe, ``--on-bad-line`` being ``data.on_bad_line``."""
    from prour.cli.recipe import recipe_errors
    from prour.recipes import load_recipe

    with recipe_errors():
        return load_recipe(path, overrides, flags={"data.on_bad_line": on_bad_line},
                           endpoints=True)


def stage_builder(recipe: Recipe, command: str, *roles: str) -> Builder:
    """The recipe's builder, or exit naming the roles the command needs and lacks."""
    from prour.build import Builder, missing_roles

    for line in missing_roles(recipe.models, {f"`prour {command}`": roles}):
        typer.echo(f"error: {line}", err=True)
        raise typer.Exit(2)
    return Builder(recipe)


def split_tasks(recipe: Recipe) -> list[Any]:
    """The tau2 tasks of the recipe's data split."""
    from prour.data.reserve import data_tasks

    return data_tasks(recipe.data)


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
    """Add the ``data`` group to the main app."""
    app.add_typer(data_app, name="data")
