"""``prour extract``: routed training states written as train/validation parquet and a card."""

from __future__ import annotations

from pathlib import Path

import typer

from prour.cli.data import BadLineOpt, ProgressOpt, data_recipe, stage_builder
from prour.cli.recipe import RecipeOpt, SetOpt


def _report_skipped(path: Path, skipped: list[int]) -> None:
    if skipped:
        lines = ", ".join(f"{path}:{n}" for n in skipped)
        typer.echo(f"warning: skipped {len(skipped)} corrupt line(s): {lines}", err=True)


def extract(recipe: str = RecipeOpt, overrides: list[str] | None = SetOpt,
            on_bad_line: str | None = BadLineOpt, progress: bool = ProgressOpt) -> None:
    """Split, route every state with the decomposer, and write train/validation parquet + card
    (with data.states=every: every decision state as a clarify row, no decomposer)."""
    from prour.cli.failures import backend_failures, complete_hints
    from prour.cli.recipe import hold_run_folder, preflight_or_exit, resumable, saved_lines
    from prour.data.card import drop_lines
    from prour.data.extract_summary import prompts_warning
    from prour.data.pipeline import run_extract

    loaded = data_recipe(recipe, overrides, on_bad_line)
    preflight_or_exit(loaded, "extract")
    tokenizer_role = [] if loaded.data.tokenizer else ["generator"]
    routed = loaded.data.states == "routed"
    builder = stage_builder(loaded, "extract", "decomposer", *tokenizer_role) if routed else None
    decisions = Path(loaded.data.decisions)
    saved = lambda: (f"{saved_lines(decisions, 'decomposer decisions')} (the parquet splits are "
                     "written at the end); rerun `prour extract` with the same recipe: it reuses "
                     "them") if routed else ("nothing (the parquet splits are written at the "
                                             "end); rerun `prour extract` with the same recipe")
    try:
        with hold_run_folder(decisions.parent), resumable(saved), \
                backend_failures(loaded, "extract"):
            result = run_extract(loaded, builder, progress=progress)
    except (FileNotFoundError, KeyError, ValueError) as exc:
        text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        typer.echo(f"error: {complete_hints(str(text), loaded)}", err=True)
        raise typer.Exit(1) from None
    _report_skipped(result.trajectories_path, result.skipped_lines)
    if result.errors:
        typer.echo("schema check failed:\n" + "\n".join(result.errors[:20]), err=True)
        raise typer.Exit(1)
    extraction = result.card["extraction"]
    warning = prompts_warning(extraction["prompts_hashes"], extraction["prompts_hash"])
    if warning is not None:
        typer.echo(f"warning: {warning}", err=True)
    rows = extraction["rows"]
    typer.echo(f"train {rows['train']} rows, validation {rows['validation']} rows in "
               f"{result.dataset_dir}")
    for line in drop_lines(extraction):
        typer.echo(line)
    if not any(rows.values()):
        from prour.data.extract_summary import empty_reason

        check = ("check the thresholds and the decomposer model" if routed else
                 "every decision state was dropped: see the counts above")
        typer.echo(f"lacking: {empty_reason(result.card['extraction'])}; the dataset is empty, "
                   f"so `prour train` saves the initial policy as its final step, untrained "
                   f"({check})")


def register(app: typer.Typer) -> None:
    app.command("extract")(extract)
