"""``prour study``: the recipe's study (its ``study`` section) — the episodes of every grid, the
judge pass, the second judge's sample and the report; ``prour run`` runs them as the study
stage's steps."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, NoReturn

import typer

from prour.cli.recipe import RecipeOpt, SetOpt

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe

study_app = typer.Typer(
    help="The study of a recipe's `study` section (the ask-less paper's evaluation): episodes, "
         "judge pass, second judge, report.", no_args_is_help=True)

ProgressOpt = typer.Option(True, "--progress/--no-progress", help="Show a progress bar.")
BootOpt = typer.Option(2000, "--n-boot", min=1, help="Bootstrap draws of the intervals.")


def _fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _load(recipe: str, overrides: list[str] | None) -> Recipe:
    from prour.cli.recipe import recipe_errors
    from prour.recipes import load_recipe

    with recipe_errors():
        loaded = load_recipe(recipe, overrides, endpoints=True)
    if loaded.study is None:
        _fail(f"{recipe}: the recipe has no `study` section (recipes/ask-less.yaml has one)")
    return loaded


@contextmanager
def _study_errors() -> Iterator[None]:
    """A study that cannot run, a server that cannot start, a model role missing: one line,
    exit 2; too many errored episodes or unscored requests: one line, exit 1."""
    from prour.cluster.serve import ServeError
    from prour.eval.harness import TooManyErrors
    from prour.eval.study import StudyError
    from prour.eval.study_judge import JudgeFailed

    try:
        yield
    except (TooManyErrors, JudgeFailed) as exc:
        _fail(str(exc), code=1)
    except (StudyError, ServeError, ValueError, OSError) as exc:
        _fail(str(exc))


@study_app.command("run")
def run_command(recipe: str = RecipeOpt, overrides: list[str] | None = SetOpt,
                progress: bool = ProgressOpt) -> None:
    """Run every episode the study's grids plan that its folder lacks, one serving group of
    cells after another (resumable: a rerun runs only what is missing). Exits 1 when more than
    eval.max_error_fraction of the episodes ended in an error."""
    from prour.cli.recipe import hold_run_folder, resumable, saved_lines
    from prour.cluster.study import run_study
    from prour.eval.harness import EPISODES_FILE
    from prour.eval.study import study_dir

    loaded = _load(recipe, overrides)
    folder = study_dir(loaded)
    folder.mkdir(parents=True, exist_ok=True)
    saved = lambda: (f"{saved_lines(folder / EPISODES_FILE, 'episodes')}; rerun `prour study "
                     "run` on the same recipe to run only the missing ones")
    with _study_errors(), hold_run_folder(folder), resumable(saved):
        results = run_study(loaded, progress, typer.echo)
    errored = sum(bool(line["error"]) for line in results)
    typer.echo(f"study: {len(results)} episode(s) in {folder} ({errored} errored)")


@study_app.command("judge")
def judge_command(recipe: str = RecipeOpt, overrides: list[str] | None = SetOpt) -> None:
    """Score every delivered request of the study's episodes with models.judge (resumable:
    verdicts are cached and a rerun asks only for the unscored ones). Exits 1 when more than
    study.max_judge_failures of the requests stay unscored."""
    from prour.cli.recipe import hold_run_folder, resumable
    from prour.eval.study import study_dir
    from prour.eval.study_judge import judge_study

    loaded = _load(recipe, overrides)
    folder = study_dir(loaded)
    if not (folder / "results.jsonl").is_file():
        _fail(f"{folder} holds no results.jsonl: run `prour study run` on this recipe first")
    saved = lambda: (f"the judged result lines appended to {folder / 'results.jsonl'} and the "
                     "verdicts cached in attention/judge_cache.jsonl are kept; rerun `prour "
                     "study judge` to go on")
    with _study_errors(), hold_run_folder(folder), resumable(saved):
        judge_study(loaded, typer.echo)


@study_app.command("second-judge")
def second_judge_command(recipe: str = RecipeOpt, overrides: list[str] | None = SetOpt) -> None:
    """Re-score a fixed, seeded sample of study.second_judge_sample delivered questions with
    models.second_judge, the same prompts as the judge (the ask-less paper's Table 12);
    resumable."""
    from prour.cli.recipe import hold_run_folder, resumable
    from prour.eval.study import study_dir
    from prour.eval.study_second_judge import second_judge_pass

    loaded = _load(recipe, overrides)
    folder = study_dir(loaded)
    saved = lambda: (f"the scored questions in {folder / 'second_judge.jsonl'} are kept; rerun "
                     "`prour study second-judge` to go on")
    with _study_errors(), hold_run_folder(folder), resumable(saved):
        second_judge_pass(loaded, typer.echo)


@study_app.command("report")
def report_command(recipe: str = RecipeOpt, overrides: list[str] | None = SetOpt,
                   n_boot: int = BootOpt) -> None:
    """The study's tables and figures beside the paper's numbers: terminal text and
    <run_dir>/study/report/ask-less/index.html with its PNGs."""
    from prour.eval.study_report_data import write_study_report

    loaded = _load(recipe, overrides)
    with _study_errors():
        lines, index = write_study_report(loaded, n_boot)
    for line in lines:
        typer.echo(line)
    typer.echo(f"report: {index}")


def register(app: typer.Typer) -> None:
    app.add_typer(study_app, name="study")
