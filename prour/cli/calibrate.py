"""``prour calibrate --recipe R [--stage label|search|evaluate|all]``: fit (τ_AU, τ_EU) for the
recipe's decomposer model and report routing F1 on a held-out set (paper A.2.2)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe
    from prour.router.calibration import RoutingScores
    from prour.router.config import RouterConfig

STAGES = ("label", "search", "evaluate", "all")


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def load_router_recipe(path: str) -> tuple[Recipe, RouterConfig]:
    """The recipe and its ``router`` section."""
    from prour.cluster.endpoints import load_run_recipe

    recipe = load_run_recipe(path)
    return recipe, recipe.router


def scores_table(title: str, scores: RoutingScores):
    """Per-class F1 and the confusion matrix (rows: label, columns: predicted route)."""
    from rich.table import Table

    table = Table(title=f"{title}: macro-F1 {scores.macro_f1:.3f}")
    table.add_column("label \\ predicted")
    for name in scores.labels:
        table.add_column(name, justify="right")
    table.add_column("F1", justify="right")
    for name, row in zip(scores.labels, scores.confusion):
        table.add_row(name, *map(str, row), f"{scores.per_class_f1[name]:.3f}")
    return table


def _stage_label(run, console) -> None:
    from prour.router.pipeline import label_split

    for split in ("dev", "test"):
        if getattr(run.router.calibration, f"{split}_states"):
            new = label_split(run, split)
            console.print(f"labelled {len(new)} new {split} states -> {run.labels_path(split)}")


def _measure(run, split: str, console) -> None:
    from rich.progress import track

    from prour.router.pipeline import measure_split

    count = measure_split(
        run, split, progress=lambda xs: track(xs, description=f"decomposer ({split})")
    )
    console.print(f"decomposer ran on {count} new {split} states -> {run.cache_path(split)}")


def _stage_search(run, console) -> None:
    from prour.router.calibration import RoutingScores
    from prour.router.pipeline import search_thresholds

    _measure(run, "dev", console)
    result, stored, joined = search_thresholds(run)
    scores = RoutingScores(result.macro_f1, result.per_class_f1, result.confusion)
    console.print(scores_table(f"dev ({result.n_states} states)", scores))
    if joined.empty:
        console.print(f"{len(joined.empty)} dev states had no valid candidate (left out)")
    console.print(
        f"τ_AU = {stored.tau_au:.2f}, τ_EU = {stored.tau_eu:.2f} ({result.n_ties} tied pairs) "
        f"stored for {stored.model_id} in {run.thresholds_path}"
    )


def _stage_evaluate(run, console) -> None:
    from prour.router.pipeline import evaluate_llm_router, evaluate_split

    _measure(run, "test", console)
    scores, stored = evaluate_split(run, "test")
    title = f"held-out, τ_AU={stored.tau_au:.2f} τ_EU={stored.tau_eu:.2f}"
    console.print(scores_table(title, scores))
    if "router" in run.recipe.models:
        llm_scores, invalid = evaluate_llm_router(run, "test")
        console.print(scores_table(f"held-out, LLM router ({invalid} invalid replies)", llm_scores))


def calibrate(
    recipe: str = typer.Option(..., "--recipe", "-r", help="Path to a YAML recipe."),
    stage: str = typer.Option("all", help="label, search, evaluate or all."),
) -> None:
    """Label decision states, grid-search (τ_AU, τ_EU) for the decomposer, evaluate held-out."""
    from rich.console import Console

    from prour.config import ConfigError
    from prour.router.pipeline import CalibrationRun

    if stage not in STAGES:
        _fail(f"--stage must be one of {', '.join(STAGES)}; got {stage!r}")
    try:
        loaded, router = load_router_recipe(recipe)
    except ConfigError as exc:
        _fail(str(exc))
    run = CalibrationRun(loaded, router)
    console = Console()
    steps = {"label": _stage_label, "search": _stage_search, "evaluate": _stage_evaluate}
    try:
        for name in steps if stage == "all" else (stage,):
            steps[name](run, console)
    except (ValueError, LookupError) as exc:
        _fail(str(exc))
    finally:
        run.close()
