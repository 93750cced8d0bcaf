"""``prour run --recipe R``: the recipe's whole chain on one node (:mod:`prour.runner`), and
``prour status RUN_DIR``: the same table of steps for any run folder."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from prour.cli.recipe import RecipeOpt, SetOpt

if TYPE_CHECKING:  # pragma: no cover
    from prour.runner import RunOptions


FromOpt = typer.Option(
    None, "--from", help="Start at this stage or step (earlier ones are left alone).")
ToOpt = typer.Option(None, "--to", help="Stop after this stage or step.")
OnlyOpt = typer.Option(
    None, "--only", help="Only these stages or steps (comma-separated or repeated).")
DryRunOpt = typer.Option(
    False, "--dry-run", help="Print each step's state, the command it would run and the servers "
    "it needs; run nothing. Exits 2 when it finds problems on this node.")
RerunStaleOpt = typer.Option(
    False, "--rerun-stale", help="Rerun the steps made with other recipe values (their outputs "
    "are moved aside, not deleted).")
ApproveOpt = typer.Option(
    None, "--approve-labels", help="Approve the annotator's labels at the review gate and go on "
    "(router.calibration.approve_labels=true for this run).")
RunDirArg = typer.Argument(..., help="A run folder (of `prour run` or `prour slurm submit`).")


def run(
    recipe: str = RecipeOpt,
    overrides: list[str] | None = SetOpt,
    first: str | None = FromOpt,
    last: str | None = ToOpt,
    only: list[str] | None = OnlyOpt,
    dry_run: bool = DryRunOpt,
    rerun_stale: bool = RerunStaleOpt,
    approve_labels: bool | None = ApproveOpt,
) -> None:
    """Run the recipe's chain in order: skip what is done, resume what is partial, serve what each
    step calls; stop at the first failure or at the review gate."""
    from prour.runner import RunError, RunOptions, select

    try:
        names = select(first, last, only) if (first or last or only) else None
    except RunError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    options = RunOptions(recipe_path=recipe, overrides=list(overrides or []), names=names,
                         dry_run=dry_run, rerun_stale=rerun_stale,
                         approve_labels=bool(approve_labels))
    raise typer.Exit(run_chain(options))


def run_chain(options: RunOptions) -> int:
    """Load the recipe and walk its chain; the exit code (0 done or at the gate, 1 a step failed
    or is stale, 2 a setup error, the run folder or a step's folder in use by another command, a
    step that refused its setup, or a ``--dry-run`` that printed ``problem:`` lines, 130
    interrupted: SIGINT or SIGTERM, passed on to the running step, whose report says what it
    saved; the servers are stopped). Before anything is loaded, served or written, the run is
    checked (:meth:`~prour.runner.Runner.refusals`) and takes its run folder's lock (a dry run
    writes nothing and takes none). ``prour demo`` calls this."""
    from contextlib import nullcontext

    from prour import interrupt
    from prour.cli.recipe import hold_run_folder, recipe_errors
    from prour.recipes import load_recipe
    from prour.runner import Runner

    with recipe_errors():
        loaded = load_recipe(options.recipe_path, options.overrides, cluster=True, flags={
            "router.calibration.approve_labels": True if options.approve_labels else None})
    runner = Runner(loaded, options)  # loads, serves and writes nothing until run()
    if not options.dry_run:  # (a dry run lists these among its problems)
        refused = runner.refusals()
        for line in refused:
            typer.echo(f"error: {line}", err=True)
        if refused:
            return 2
    lock = nullcontext() if options.dry_run else hold_run_folder(loaded.resolved_run_dir())
    with lock, interrupt.interruptible(runner.saved), \
            interrupt.on_stop("the vLLM servers of this run", runner.servers.stop_all):
        return runner.run()


def status(
    run_dir: Path = RunDirArg,
) -> None:
    """Print each step's state for a run folder (from its stamps and outputs); with
    slurm_jobs.json, also each Slurm job's state."""
    from prour.cli.recipe import recipe_errors
    from prour.recipes import load_recipe
    from prour.run_status import status_recipe
    from prour.runner import RunError, table, table_text

    try:
        recipe, overrides = status_recipe(run_dir.resolve())
    except RunError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    with recipe_errors():
        loaded = load_recipe(recipe, overrides)
    typer.echo(f"run {loaded.resolved_run_dir()} (recipe {recipe})")
    typer.echo(table_text(table(loaded)))
    if (run_dir / "slurm_jobs.json").is_file():
        _slurm_states(run_dir)


def _slurm_states(run_dir: Path) -> None:
    """The Slurm state of each submitted job (what `prour slurm status` reads)."""
    from prour.cluster.jobs import load_manifest, summarize

    report = summarize(load_manifest(run_dir))
    typer.echo(f"slurm jobs (states from {report.source}):")
    for unit in report.units:
        code = "-" if unit.exit_code is None else str(unit.exit_code)
        typer.echo(f"  {unit.label:<28} job {unit.job:<10} {unit.state:<12} exit {code:<4} "
                   f"{unit.log}")


def register(app: typer.Typer) -> None:
    """Add ``run`` and ``status`` to the ``prour`` app."""
    app.command("run")(run)
    app.command("status")(status)
