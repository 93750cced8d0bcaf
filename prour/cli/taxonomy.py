"""``prour taxonomy --recipe R``: the annotator's uncertainty label of every decision step of the
collected retail and airline trajectories (paper A.1; :mod:`prour.data.taxonomy`), into
``<run_dir>/taxonomy/labels.jsonl``; ``--approve`` records the reviewed labels as approved (what
the chain's ``taxonomy-review`` gate and the report's Table 5 and Figure 2 read)."""

from __future__ import annotations

import typer

from prour.cli.data import BadLineOpt
from prour.cli.recipe import RecipeOpt, SetOpt

ApproveOpt = typer.Option(
    False, "--approve", help="Approve the labels file as it is now (after reviewing it: set a "
    "wrong line's `corrected` to a source or none) instead of annotating.")


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def taxonomy(recipe: str = RecipeOpt, overrides: list[str] | None = SetOpt,
             on_bad_line: str | None = BadLineOpt, approve: bool = ApproveOpt) -> None:
    """Label every decision step of the collected trajectories with where its missing
    information lives (world or user side, and which source); resumable. With --approve, approve
    the reviewed labels."""
    from prour.cli.data import data_recipe
    from prour.data.taxonomy_labels import labels_path, taxonomy_dir

    loaded = data_recipe(recipe, overrides, on_bad_line)
    folder = taxonomy_dir(loaded)
    if approve:
        _approve(folder)
        return
    _annotate(loaded, labels_path(folder))


def _approve(folder) -> None:
    from prour.data.taxonomy_labels import APPROVAL_FILE, approve, describe

    try:
        counts = approve(folder, "prour taxonomy --approve")
    except ValueError as exc:
        _fail(str(exc))
    typer.echo(f"{folder / 'labels.jsonl'}: {describe(counts)}")
    typer.echo(f"approved -> {folder / APPROVAL_FILE}")


def _annotate(loaded, path) -> None:
    from prour.cli.data import stage_builder
    from prour.cli.failures import backend_failures
    from prour.cli.recipe import hold_run_folder, preflight_or_exit, resumable, saved_lines
    from prour.data.steps import no_taxonomy, taxonomy_sources
    from prour.data.taxonomy import annotate, recipe_decisions
    from prour.data.taxonomy_labels import count_labels, describe, read_labels

    if no_taxonomy(loaded):
        typer.echo(f"note: {no_taxonomy(loaded)}: `prour run` leaves the taxonomy out; "
                   "annotating as asked")
    preflight_or_exit(loaded, "taxonomy")
    try:
        decisions, lacking = recipe_decisions(loaded, taxonomy_sources(loaded))
    except (ValueError, FileNotFoundError) as exc:
        _fail(str(exc))
    builder = stage_builder(loaded, "taxonomy", "annotator")
    saved = lambda: (f"{saved_lines(path, 'decision step labels')}; rerun `prour taxonomy` with "
                     "the same recipe to annotate only the missing ones")
    try:
        with hold_run_folder(path.parent), resumable(saved), \
                backend_failures(loaded, "taxonomy"):
            new = annotate(builder.llm("annotator"), decisions, loaded.taxonomy, path)
    finally:
        builder.close()
    typer.echo(f"{len(decisions)} decision steps, {len(new)} newly annotated -> {path}")
    for line in lacking:
        typer.echo(f"lacking: {line}")
    failed = sum(record["annotation"] is None for record in new)
    if failed:
        typer.echo(f"lacking: {failed} of {len(new)} decision steps annotated now have no usable "
                   "label (the annotator's reply never validated in "
                   f"{loaded.taxonomy.annotator_attempts} attempt(s)): set their `corrected` "
                   f"field in {path} when reviewing")
    if path.is_file():
        try:
            counts = count_labels(read_labels(path))
        except ValueError as exc:
            _fail(str(exc), 1)
        shares = counts.shares()
        typer.echo(describe(counts))
        typer.echo("world/user share of the events: " + (
            f"{shares['world']:.1f} % / {shares['user']:.1f} %" if shares else
            "– (no decision step with uncertainty)") + " (before review; the paper: 89.1 % / "
            "10.9 % of 19,022)")


def register(app: typer.Typer) -> None:
    app.command("taxonomy")(taxonomy)
