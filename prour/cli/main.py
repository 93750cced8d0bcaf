"""The ``prour`` command. Each subcommand lives in its own module and imports heavy code lazily."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="prour",
    help="Train and evaluate the query generator of proactive tool-using agents on tau2-bench.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command()
def validate(recipe: str = typer.Argument(..., help="Path to a YAML recipe.")) -> None:
    """Check a recipe without loading any model; print the first error with its dotted key."""
    from prour.config import ConfigError, load_recipe

    try:
        loaded = load_recipe(recipe)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"ok: {recipe} (recipe {loaded.name!r})")


from prour.cli.reward import reward_app

app.add_typer(reward_app, name="reward")
app.command("calibrate")(__import__("prour.cli.calibrate", fromlist=["calibrate"]).calibrate)
__import__("prour.cli.data", fromlist=["register"]).register(app)  # collect, normalize, extract, data
__import__("prour.cli.train", fromlist=["register"]).register(app)  # train, train export
__import__("prour.cli.serve", fromlist=["register"]).register(app)  # serve, endpoints
app.add_typer(__import__("prour.cli.slurm", fromlist=["slurm_app"]).slurm_app, name="slurm")
__import__("prour.cli.eval", fromlist=["register"]).register(app)  # eval, report
__import__("prour.cli.env", fromlist=["register"]).register(app)  # env, episode


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
