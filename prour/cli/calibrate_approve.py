"""``prour calibrate approve``: the reviewed labels approved for the threshold search."""

from __future__ import annotations

import typer

from prour.cli.recipe import RecipeOpt, SetOpt


def approve(recipe: str = RecipeOpt, overrides: list[str] | None = SetOpt) -> None:
    """Approve the annotator's labels (after reviewing them) so the threshold search may read
    them; prints the labels per class of each split."""
    from prour.cli.recipe import recipe_errors
    from prour.recipes import load_recipe
    from prour.router.review import approval_path, approve, describe_counts, labels_files

    with recipe_errors():
        loaded = load_recipe(recipe, overrides)
    try:
        counts = approve(loaded, "prour calibrate approve")
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    files = labels_files(loaded)
    for split, count in counts.items():
        typer.echo(f"{files[split]}: {describe_counts(count)}")
    typer.echo(f"approved -> {approval_path(loaded)}")


def register(calibrate_app: typer.Typer) -> None:
    """Add ``approve`` to the ``prour calibrate`` group (after ``states``)."""
    calibrate_app.command("approve")(approve)
