"""``prour calibrate --recipe R [--stage label|search|evaluate|all]``: fit (τ_AU, τ_EU) for the
recipe's decomposer model and report routing F1 on a held-out set (paper A.2.2).

``prour calibrate states --recipe R --split dev|test --from TRAJECTORIES.jsonl``: sample the
decision states those stages read (:mod:`prour.data.calibration_states`). ``prour calibrate
approve`` is :mod:`prour.cli.calibrate_approve`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from prour.cli.data import BadLineOpt
from prour.cli.recipe import RecipeOpt, RecipeOrNoneOpt, SetOpt
from prour.stages import command_options

if TYPE_CHECKING:  # pragma: no cover
    from prour.build import Builder
    from prour.config import Recipe
    from prour.router.calibration import RoutingScores

# `--stage` values: the calibrate stage's steps (prour.stages), or all of them in turn
STAGES = (*command_options("calibrate", "--stage"), "all")


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


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


def _print_mix(recipe: Recipe, console, lacking: bool, prefix: str = "") -> None:
    """The dev labels' mix against router.calibration.dev_mix (and what it lacks: candidates
    that ran out, or a walk a review reopened that ``short_mix: continue`` leaves short)."""
    from prour.router.pipeline import dev_mix, goes_on_short, labels_path, mix_path

    labelled = recipe.router.calibration.dev_states and labels_path(recipe, "dev").is_file()
    mix = dev_mix(recipe) if labelled else None
    if mix is None:
        return
    console.print(f"{prefix}{mix.line()} -> {mix_path(recipe)}", soft_wrap=True)
    if not (lacking and mix.short()):
        return
    wanted = ", ".join(f"{n} {name}" for name, n in mix.short().items())
    if goes_on_short(recipe, mix):
        console.print(f"lacking: {wanted} dev states: a review's corrections left the mix short "
                      f"with candidates unlabelled from candidate {mix.pending + 1} on, and "
                      "router.calibration.short_mix is continue: the search fits on the short "
                      "mix (short_mix: annotate labels more)", soft_wrap=True)
    elif mix.pending is None:
        console.print(f"lacking: {wanted} dev states: {mix.walked} candidates labelled, "
                      f"{len(mix.unusable)} without a usable label (collect more with "
                      "router.calibration.dev_episodes)", soft_wrap=True)


def _stage_label(builder: Builder, console) -> None:
    from prour.router.pipeline import label_split, labels_path

    recipe = builder.recipe
    for split in ("dev", "test"):
        if getattr(recipe.router.calibration, f"{split}_states"):
            new = label_split(builder, split)
            console.print(f"labelled {len(new)} new {split} states -> "
                          f"{labels_path(recipe, split)}")
            if split == "dev":
                _print_mix(recipe, console, lacking=True)
                _print_top_up(recipe, console, len(new))


def _print_top_up(recipe: Recipe, console, new: int) -> None:
    """Say when this labelling topped up a mix that a review's corrections left short."""
    from prour.router.pipeline import read_mix

    after = int(read_mix(recipe).get("labelled_after_review", 0))
    if new and after:
        console.print(f"the dev mix was short after the review: {after} more dev states were "
                      "labelled; review them before the search", soft_wrap=True)


def _measure(builder: Builder, split: str, console) -> None:
    from rich.progress import track

    from prour.router.pipeline import cache_path, measure_split

    count = measure_split(
        builder, split, progress=lambda xs: track(xs, description=f"decomposer ({split})")
    )
    console.print(f"decomposer ran on {count} new {split} states -> "
                  f"{cache_path(builder.recipe, split)}")


def _stage_search(builder: Builder, console) -> None:
    from prour.router.calibration import RoutingScores
    from prour.router.pipeline import labels_path, search_thresholds
    from prour.router.thresholds import thresholds_path

    _print_mix(builder.recipe, console, lacking=True, prefix="the search fits on the ")
    _measure(builder, "dev", console)
    result, stored, joined = search_thresholds(builder)
    scores = RoutingScores(result.macro_f1, result.per_class_f1, result.confusion)
    if result.n_states:
        console.print(scores_table(f"dev ({result.n_states} states)", scores))
    if joined.empty:
        console.print(f"{len(joined.empty)} dev states had no valid candidate (left out)")
    for line in joined.lacking("dev", labels_path(builder.recipe, "dev")):
        console.print(f"lacking: {line}", soft_wrap=True)
    if not result.n_states:
        console.print("lacking: no dev state has both a usable label and AU/EU (a valid "
                      "candidate action): the pair below is the grid's first, not fitted",
                      soft_wrap=True)
    console.print(
        f"τ_AU = {stored.tau_au:.2f}, τ_EU = {stored.tau_eu:.2f} ({result.n_ties} tied pairs) "
        f"stored for {stored.model_id} in {thresholds_path(builder.recipe)}"
    )


def _stage_evaluate(builder: Builder, console) -> None:
    """The thresholds (and the prompted router) on the held-out states, printed and saved with
    the dev scores and the dev mix as the router evidence (:mod:`prour.router.evidence`)."""
    from prour.router.evidence import router_evidence, save_evidence
    from prour.router.pipeline import evaluate_llm_router, evaluate_split, labels_path

    _measure(builder, "test", console)
    scores, stored, joined = evaluate_split(builder, "test")
    title = f"held-out, τ_AU={stored.tau_au:.2f} τ_EU={stored.tau_eu:.2f}"
    for line in joined.lacking("test", labels_path(builder.recipe, "test")):
        console.print(f"lacking: {line}", soft_wrap=True)
    llm = None
    if scores is None:
        console.print(f"lacking: no held-out state has a usable label: {title} is not scored",
                      soft_wrap=True)
    else:
        console.print(scores_table(title, scores))
    if scores is not None and "router" in builder.recipe.models:
        llm = evaluate_llm_router(builder, "test")
        if llm[0] is not None:
            console.print(scores_table(f"held-out, LLM router ({llm[1]} invalid replies)",
                                       llm[0]))
    record = router_evidence(builder, stored, (scores, joined), llm)
    path = save_evidence(builder.recipe, record)
    dev = record["dev"]
    on_dev = (f"dev macro-F1 {dev['macro_f1']:.3f} on {dev['states']} states" if "lacking" not in
              dev else f"dev: lacking ({dev['lacking']})")
    console.print(f"router evidence ({on_dev}) -> {path}", soft_wrap=True)


def _calibration_saved(recipe: Recipe, stage: str) -> str:
    """What an interrupted ``prour calibrate`` kept: the labels and decomposer decisions so far
    (both resumable caches), and the rerun that continues."""
    from prour.cli.recipe import saved_lines
    from prour.router.pipeline import cache_path, labels_path

    kept = [saved_lines(labels_path(recipe, split), f"{split} labels") for split in ("dev", "test")]
    kept += [saved_lines(cache_path(recipe, split), f"{split} decomposer decisions")
             for split in ("dev", "test")]
    return (f"{', '.join(kept)}; rerun `prour calibrate --stage {stage}` with the same recipe "
            "to do only the missing states")


calibrate_app = typer.Typer(
    invoke_without_command=True, no_args_is_help=False,
    help="Label decision states, grid-search (τ_AU, τ_EU) for the decomposer, evaluate held-out; "
    "`states` samples the decision states.")


@calibrate_app.command("states")
def states(
    recipe: str = RecipeOpt,
    split: str = typer.Option(..., "--split", help="dev or test."),
    trajectories: str = typer.Option(
        ..., "--from", help="Trajectories JSONL written by `prour collect`."),
    n: int | None = typer.Option(
        None, "--n", min=1, help="States to sample (test default: router.calibration.n_states; "
        "dev default: every candidate)."),
    seed: int | None = typer.Option(None, "--seed", help="Sampling seed (default: the recipe's)."),
    out: str | None = typer.Option(
        None, "--out", help="Output JSONL (default: router.calibration.<split>_states)."),
    on_bad_line: str | None = BadLineOpt,
    overrides: list[str] | None = SetOpt,
) -> None:
    """Write the decision states (the agent's view before one of its turns) that `prour
    calibrate` labels. test: --n sampled, refused with the count when there are fewer. dev: the
    candidates, every state of --from (trajectories of the calibration reserve's tasks only) in
    a seeded order that annotation walks up to router.calibration.dev_mix. Corrupt lines of
    --from follow data.on_bad_line (--on-bad-line)."""
    from prour.cli.recipe import recipe_errors
    from prour.data.calibration_states import dev_candidates, sample_states, write_states
    from prour.recipes import load_recipe
    from prour.router.pipeline import SPLITS, states_path

    if split not in SPLITS:
        _fail(f"--split must be one of {', '.join(SPLITS)}; got {split!r}")
    with recipe_errors():
        loaded = load_recipe(recipe, overrides, flags={"data.on_bad_line": on_bad_line},
                             endpoints=True)
    try:
        path = Path(out) if out else states_path(loaded, split)
        seed = loaded.seed if seed is None else seed
        records = (dev_candidates(trajectories, loaded.data, seed, n) if split == "dev" else
                   sample_states(trajectories, loaded.data,
                                 loaded.router.calibration.n_states if n is None else n, seed))
    except (ValueError, FileNotFoundError) as exc:
        _fail(str(exc))
    write_states(path, records)
    spread = len({r["trajectory_id"] for r in records})
    what = "candidate " if split == "dev" else ""
    typer.echo(f"{len(records)} {split} {what}decision states from {spread} trajectories -> "
               f"{path}")


@calibrate_app.callback()
def calibrate(
    ctx: typer.Context,
    recipe: str | None = RecipeOrNoneOpt,
    stage: str = typer.Option("all", help="label, search, evaluate or all."),
    overrides: list[str] | None = SetOpt,
) -> None:
    """Label decision states, grid-search (τ_AU, τ_EU) for the decomposer, evaluate held-out."""
    if ctx.invoked_subcommand:
        return
    if recipe is None:
        _fail("--recipe is required")
    from rich.console import Console

    from prour.build import Builder
    from prour.cli.failures import backend_failures, complete_hints
    from prour.cli.recipe import hold_run_folder, preflight_or_exit, recipe_errors, resumable
    from prour.recipes import load_recipe
    from prour.router.pipeline import labels_path

    if stage not in STAGES:
        _fail(f"--stage must be one of {', '.join(STAGES)}; got {stage!r}")
    with recipe_errors():
        loaded = load_recipe(recipe, overrides, endpoints=True)
    preflight_or_exit(loaded, "calibrate")
    builder = Builder(loaded)
    console = Console()
    steps = {"label": _stage_label, "search": _stage_search, "evaluate": _stage_evaluate}
    try:
        with hold_run_folder(labels_path(loaded, "dev").parent), \
                resumable(lambda: _calibration_saved(loaded, stage)), \
                backend_failures(loaded, "calibrate", "--stage", stage):
            for name in steps if stage == "all" else (stage,):
                steps[name](builder, console)
    except (ValueError, LookupError) as exc:
        _fail(complete_hints(str(exc), loaded))
    finally:
        builder.close()
