"""``prour validation``: the human and judge validation of an Ask-Less study (ask-less paper,
Tables 4, 10, 11, 12) on its study folder.

``export KIND STUDY_DIR`` writes what annotators see to ``STUDY_DIR/validation/KIND/``;
``score KIND STUDY_DIR --labels FILE ...`` checks and stores their answers and prints the table;
``judge STUDY_DIR --recipe R`` scores a fixed question sample with a second judge (the recipe's
``models.judge``) into ``second_judge.jsonl``, resumably; ``table12 STUDY_DIR`` prints Table 12.
"""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import typer

from prour.cli.recipe import RecipeOpt, SetOpt

validation_app = typer.Typer(
    help="Human and judge validation of an Ask-Less study (Tables 4, 10, 11, 12).",
    no_args_is_help=True)

KINDS_HELP = ("burden (Table 4: conversation pairs), requests (Table 10: request pairs for the "
              "judge), classification (Table 11: messages for the request classifier)")
KindArg = typer.Argument(..., metavar="KIND", help=KINDS_HELP)
StudyArg = typer.Argument(..., metavar="STUDY_DIR",
                          help="The study folder (results.jsonl, episodes.jsonl).")
CountOpt = typer.Option(
    None, "--pairs", "--cases", "-n", min=1, help="How many pairs per set (burden), per dimension "
    "(requests) or cases (classification); default the paper's 60, 80, 100.")
SeedOpt = typer.Option(0, "--seed", help="Seed of the sample (exports) or of the bootstrap.")
LabelsOpt = typer.Option(
    None, "--labels", help="An annotator's JSONL answers (repeat per annotator); checked, then "
    "kept in STUDY_DIR/validation/KIND/labels/. Without it, the labels kept there are scored.")
BootOpt = typer.Option(2000, "--n-boot", min=1, help="Bootstrap draws of the intervals (>= 1).")
QuestionsOpt = typer.Option(1989, "--questions", min=1,
                            help="Size of the fixed question sample.")


def _fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _policy(domain: str) -> str | None:
    """The domain policy annotators of the classification read (None where it is unknown)."""
    from prour.env.domains import domain_policy

    try:
        return domain_policy(domain)
    except (LookupError, ValueError, ImportError, OSError):
        return None


@validation_app.command("export")
def export_command(kind: str = KindArg, study_dir: Path = StudyArg, count: int | None = CountOpt,
                   sample_seed: int = SeedOpt) -> None:
    """Write the annotators' file, its instructions and the key kept from them; refused over
    a folder that already holds labels."""
    from prour.eval.attention.validation import export

    try:
        done = export(kind, study_dir, count, sample_seed,
                      _policy if kind == "classification" else None)
    except ValueError as exc:  # ValidationInputError included
        _fail(str(exc))
    folder = done["files"]["key"].parent
    if kind == "burden":
        got, pool = done["pairs"], done["candidates"]
        typer.echo(f"exported {got['equal']} equal-count pairs (of {pool['equal']} possible) "
                   f"and {got['different']} different-count pairs (of {pool['different']})")
    elif kind == "requests":
        typer.echo(f"exported {done['pairs']['readability']} readability and "
                   f"{done['pairs']['value']} value pairs from {done['tasks']} tasks")
    else:
        labels = ", ".join(f"{n} {label}" for label, n in done["by_label"].items())
        typer.echo(f"exported {done['cases']} cases ({labels} by the classifier)")
    typer.echo(f"for annotators: {folder / 'to_annotate.jsonl'}, {folder / 'instructions.md'}")
    typer.echo(f"kept from them: {folder / 'key.jsonl'}")


@validation_app.command("score")
def score_command(kind: str = KindArg, study_dir: Path = StudyArg,
                  labels: list[Path] | None = LabelsOpt, n_boot: int = BootOpt,
                  sample_seed: int = SeedOpt) -> None:
    """Check and keep the annotators' labels, then print the table (markdown)."""
    from prour.eval.attention import validation as v

    try:
        for path in v.store(kind, study_dir, labels or []):
            typer.echo(f"kept {path}")
    except ValueError as exc:  # ValidationInputError included
        _fail(str(exc))
    section = {"burden": v.table4_section, "requests": v.table10_section,
               "classification": v.table11_section}[kind]
    lines, data = section(study_dir, n_boot=n_boot, seed=sample_seed)
    if data["status"] == "error":
        _fail(data["error"])
    typer.echo("\n".join(lines))
    if data["status"] != "scored":
        raise typer.Exit(1)


@validation_app.command("judge")
def judge_command(study_dir: Path = StudyArg, recipe: str = RecipeOpt,
                  overrides: list[str] | None = SetOpt, questions: int = QuestionsOpt,
                  sample_seed: int = SeedOpt) -> None:
    """Score a fixed sample of the study's questions, and the requests of an exported Table 10,
    with the recipe's models.judge as the second judge (same prompts; resumable)."""
    from prour.cli.recipe import recipe_errors
    from prour.eval.attention import validation as v
    from prour.eval.study_second_judge import second_judge_pass
    from prour.recipes import load_recipe

    with recipe_errors():
        loaded = load_recipe(recipe, list(overrides or []), endpoints=True)
    try:
        second_judge_pass(loaded, typer.echo, role="judge", folder=v.study_folder(study_dir),
                          questions=questions, seed=sample_seed)
    except ValueError as exc:  # ValidationInputError included
        _fail(str(exc))


@validation_app.command("table12")
def table12_command(study_dir: Path = StudyArg, n_boot: int = BootOpt,
                    sample_seed: int = SeedOpt) -> None:
    """Print Table 12 from the study's second_judge.jsonl."""
    from prour.eval.attention import validation as v

    folder = v.study_folder(study_dir)
    lines, data = v.table12_section(v.read_rows(folder / v.SECOND_JUDGE), n_boot=n_boot,
                                    seed=sample_seed, study=folder)
    typer.echo("\n".join(lines))
    if data["status"] != "scored":
        raise typer.Exit(1)
