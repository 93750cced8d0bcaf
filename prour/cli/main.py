"""The ``prour`` command. Each subcommand lives in its own module and imports heavy code lazily."""

from __future__ import annotations

from prour import interrupt

interrupt.install_for_command()  # before the imports below: Ctrl-C from here on is one line

import typer

from prour.cli.recipe import SetOpt

app = typer.Typer(
    name="prour",
    help="Train and evaluate the query generator of proactive tool-using agents on tau2-bench.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command()
def validate(
    recipe: str = typer.Argument(..., help="Path to a YAML recipe."),
    overrides: list[str] | None = SetOpt,
    preflight: bool = typer.Option(
        False, "--preflight", help="Also check this node for the whole run: local weights, "
        "endpoints, extras, input files, thresholds, GPUs (one line per problem)."),
) -> None:
    """Check a recipe without loading any model: each key, then the checks every stage of the
    run makes of the values together (as each step runs it); one line per problem."""
    from prour.cli.recipe import preflight_problems, recipe_errors
    from prour.preflight import protocol_note_lines
    from prour.recipes import load_recipe

    with recipe_errors():
        loaded = load_recipe(recipe, overrides, endpoints=preflight)
    for line in protocol_note_lines(loaded):  # stated whether or not the checks below pass
        typer.echo(line)
    if preflight:
        from prour.stages import run_stages

        stages = run_stages(loaded)
        if preflight_problems(loaded, *stages, whole_run=True):
            raise typer.Exit(2)
        typer.echo(f"ok: {recipe} (recipe {loaded.name!r}); preflight passed for "
                   f"{', '.join(stages)}")
        return
    from prour.preflight import check_protocol, check_recipe, not_said, protocol_warnings
    from prour.stages import run_stages

    # the protocol rules and the stages' checks of the recipe's values against each other need
    # no model or node: plain validate makes them too, each step on its own recipe
    for line in protocol_warnings(loaded):
        typer.echo(f"warning: {line} (protocol.on_breach: warn)", err=True)
    values = check_recipe(loaded, run_stages(loaded), whole_run=True)
    refused = values + not_said(check_protocol(loaded), values)
    for problem in refused:
        typer.echo(f"error: {problem.line()}", err=True)
    if refused:
        raise typer.Exit(2)
    typer.echo(f"ok: {recipe} (recipe {loaded.name!r})")


@app.command()
def unlock(
    run_dir: str = typer.Argument(..., metavar="RUN_DIR",
                                  help="The folder whose .prour.lock to clear."),
    force: bool = typer.Option(
        False, "--force", help="Clear a lock held from another host, whose process cannot be "
        "checked from here (its Slurm job still is, with squeue)."),
) -> None:
    """Clear a run folder's lock left by a command that has ended (refused while it runs)."""
    from prour.runlock import UnlockRefused
    from prour.runlock import unlock as clear

    try:
        typer.echo(clear(run_dir, force=force))
    except UnlockRefused as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def _register_subcommands() -> None:
    """Each stage module adds its commands; their heavy imports stay inside the commands."""
    from prour.cli import (
        calibrate,
        calibrate_approve,
        collect,
        data,
        demo,
        env,
        eval,
        extract,
        normalize,
        posthoc,
        report,
        reward,
        run,
        serve,
        slurm,
        study,
        tau2,
        taxonomy,
        tiny,
        train,
        train_export,
        train_report,
        validation,
        view,
    )

    for module in (env, collect, normalize, extract, data, train, eval, posthoc, report, serve,
                   demo, tiny, run, tau2, view, study, taxonomy):
        module.register(app)  # env/episode, collect, ..., train, eval, posthoc, report, ..., status
    for command in (train_export, train_report):
        command.register(train.train_app)  # `prour train export`, `prour train report`
    calibrate_approve.register(calibrate.calibrate_app)
    app.add_typer(calibrate.calibrate_app, name="calibrate")
    app.add_typer(reward.reward_app, name="reward")
    app.add_typer(slurm.slurm_app, name="slurm")
    app.add_typer(validation.validation_app, name="validation")


_register_subcommands()


def main() -> None:
    """The ``prour`` command: the console script (pyproject's ``[project.scripts]``), ``python -m
    prour.cli.main`` and each step ``prour run`` starts all enter here, never at ``app`` itself,
    so that a read-only or full disk ends any command in one line, not a traceback."""
    from prour.cli.failures import run_app

    run_app(app)


if __name__ == "__main__":
    main()
