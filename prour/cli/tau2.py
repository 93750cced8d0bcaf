"""``prour import tau2`` (tau2 results files into prour trajectories), ``prour export tau2`` (an
eval run folder's episodes as tau2 results files), ``prour score`` (re-score stored episodes
offline with tau2's evaluators and compare with the recorded rewards) and ``prour
nl-assertions`` (judge the natural-language assertions that the offline scoring leaves out)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import NoReturn

import typer

from prour.cli.recipe import RecipeOpt, SetOpt
from prour.env.tau2_import import TRAJECTORIES_FILE

import_app = typer.Typer(help="Bring runs of other tools into prour.", no_args_is_help=True)
export_app = typer.Typer(help="Write prour runs in other tools' formats.", no_args_is_help=True)
ResultsArg = typer.Argument(..., help="tau2 results JSON files (what `tau2 run` writes).")


def _fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


@import_app.command("tau2")
def import_tau2(
    results: list[str] = ResultsArg,
    run_dir: str = typer.Option(..., "--run-dir", help="Run folder; the trajectories go to "
                                f"DIR/{TRAJECTORIES_FILE} (appended; keys already there are "
                                "kept)."),
    skip_unknown_tasks: bool = typer.Option(
        False, "--skip-unknown-tasks",
        help="Skip the simulations of tasks the installed tau2 lacks or defines differently "
             "(default: refuse the files, naming those task ids)."),
) -> None:
    """Convert tau2 results files into prour trajectories (one per simulation, each trial its own
    key, with the source file's sha256, tau2 commit and models in meta.tau2_import); importing a
    file twice adds nothing."""
    from prour.env.tau2_import import import_results

    out = Path(run_dir) / TRAJECTORIES_FILE
    try:
        summary = import_results(results, out, skip_unknown_tasks=skip_unknown_tasks)
    except (OSError, ValueError) as exc:
        _fail(str(exc))
    for path, ids in summary.skipped_tasks.items():
        typer.echo(f"skipped {len(ids)} task(s) of {path}: {', '.join(ids)}", err=True)
    typer.echo(f"{summary.added} trajectories added to {out} ({summary.already} already there)")


@export_app.command("tau2")
def export_tau2(
    run_dir: str = typer.Argument(..., metavar="RUN_DIR", help="An eval run folder (written by "
                                  "`prour eval`: episodes.jsonl, recipe.resolved.yaml)."),
) -> None:
    """Write the run's episodes in tau2's results format to RUN_DIR/tau2_results/ (one file per
    domain and agent name; `prour eval` writes them too), for `tau2 view --dir` and
    `prour import tau2`."""
    from prour.env.tau2_export import EXPORT_DIR, export_run
    from prour.eval.harness import EPISODES_FILE
    from prour.provenance import RECIPE_FILE
    from prour.recipes import load_recipe

    folder = Path(run_dir)
    episodes, recipe_file = folder / EPISODES_FILE, folder / RECIPE_FILE
    for needed in (episodes, recipe_file):
        if not needed.is_file():
            _fail(f"{needed}: missing; RUN_DIR must be a folder `prour eval` wrote")
    try:
        env = load_recipe(recipe_file).env
        written = export_run(folder, episodes, max_steps=env.max_steps,
                             max_errors=env.max_errors)
    except (OSError, ValueError) as exc:  # a ConfigError is a ValueError
        _fail(str(exc))
    typer.echo(f"{len(written)} tau2 results file(s) in {folder / EXPORT_DIR}: "
               f"{', '.join(p.name for p in written)}")


def score_command(
    target: str = typer.Argument(..., help=f"Run folder (its {TRAJECTORIES_FILE}) or a "
                                 "trajectories JSONL."),
) -> None:
    """Re-score every episode with tau2's offline evaluators (as `prour eval` does) and report
    agreement with the recorded rewards per domain; exits 1 on any disagreement. Tasks scored on
    NL assertions need an LLM judge and are reported as not scored."""
    from prour.env.domains import get_task
    from prour.env.scoring import score_episode
    from prour.env.trajectory import read_trajectories

    path = Path(target)
    if path.is_dir():
        path = path / TRAJECTORIES_FILE
    if not path.is_file():
        _fail(f"{path}: no such trajectories file")
    try:
        trajs = read_trajectories(path)
    except ValueError as exc:
        _fail(str(exc))
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    lines = []
    for traj in trajs:
        tally = counts[traj.domain]
        tally["episodes"] += 1
        name = f"{traj.domain}/{traj.task_id} seed {traj.seed} ({traj.agent})"
        try:
            task = get_task(traj.domain, traj.task_id, traj.split)  # the version it ran
            reward, breakdown = score_episode(traj.domain, task, traj)
        except Exception as exc:  # noqa: BLE001 - one bad episode is reported, the rest scored
            tally["failed"] += 1
            lines.append(f"  {name}: scoring failed: {exc}")
            continue
        if reward is None:
            tally["not scored"] += 1
            continue
        if traj.reward is None:
            tally["no recorded reward"] += 1
            continue
        if abs(reward - traj.reward) <= 1e-6:
            tally["agree"] += 1
            continue
        tally["disagree"] += 1
        cause = "; ".join(breakdown.get("failed") or []) or breakdown.get("note") or \
            f"checks {breakdown.get('checks')}"
        lines.append(f"  {name}: recorded {traj.reward:g}, re-scored {reward:g}: {cause}")
    for domain, tally in sorted(counts.items()):
        parts = ", ".join(f"{tally[k]} {k}" for k in
                          ("agree", "disagree", "not scored", "no recorded reward", "failed")
                          if tally[k])
        typer.echo(f"{domain}: {tally['episodes']} episodes: {parts}")
        if tally["not scored"]:
            typer.echo(f"  {tally['not scored']} not scored: their tasks' reward basis includes "
                       "NL assertions, which need an LLM judge (`prour nl-assertions RUN "
                       "--recipe R`)")
    for line in lines:
        typer.echo(line)
    if any(t["disagree"] or t["failed"] for t in counts.values()):
        raise typer.Exit(1)


def nl_assertions_command(
    run: str = typer.Argument(..., metavar="RUN", help="An eval run folder or a study folder "
                              "(<run_dir>/study): its results.jsonl and episodes.jsonl."),
    recipe: str = RecipeOpt,
    overrides: list[str] | None = SetOpt,
) -> None:
    """Score the episodes of RUN left unscored by tau2's natural-language assertions: the
    recipe's models.nl_judge (else models.judge) grades them with tau2's own prompt, and each
    line is appended again with the reward (the product of its checks, as tau2 multiplies them),
    the judge and every verdict. A task without assertions scores the check 1 with no model, as
    tau2 does. Resumable (verdicts cached in RUN/nl_assertions_cache.jsonl); exits 1 when the
    judge left a line unscored."""
    from prour.cli.failures import backend_failures
    from prour.cli.recipe import hold_run_folder, recipe_errors, resumable, saved_lines
    from prour.eval.nl_judge import judge_nl_assertions
    from prour.recipes import load_recipe

    results = Path(run) / "results.jsonl"
    if not results.is_file():
        _fail(f"{run} holds no results.jsonl: run `prour eval` (or `prour study run`) into it "
              "first")
    with recipe_errors():
        loaded = load_recipe(recipe, overrides, endpoints=True)
    saved = lambda: (f"{saved_lines(results, 'result lines')}; rerun the same command to judge "
                     "only the rest")
    with hold_run_folder(run), resumable(saved), backend_failures(loaded, "nl-assertions", run):
        try:
            tally = judge_nl_assertions(run, loaded, say=typer.echo)
        except (OSError, ValueError, LookupError) as exc:
            _fail(f"nl-assertions on {run}: {exc}")
    if tally.failed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add the ``import`` and ``export`` groups, ``score`` and ``nl-assertions``."""
    app.add_typer(import_app, name="import")
    app.add_typer(export_app, name="export")
    app.command("score")(score_command)
    app.command("nl-assertions")(nl_assertions_command)
