"""``--recipe`` and ``--set`` are defined once (prour/cli/recipe.py): every command that reads a
recipe takes ``--set`` too, and no module declares its own copy of either option."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import typer
import yaml
from typer.models import OptionInfo
from typer.testing import CliRunner

from prour.cli import recipe as common
from prour.cli.main import app

SHARED = {"--recipe": (common.RecipeOpt, common.RecipeOrNoneOpt), "--set": (common.SetOpt,)}


def click_commands(command: Any, path: str = "prour") -> Iterator[tuple[str, Any]]:
    """Every command of the tree, a group's own callback included (``prour calibrate``)."""
    yield path, command
    if hasattr(command, "commands"):  # a group (typer vendors its own click)
        for name, sub in command.commands.items():
            yield from click_commands(sub, f"{path} {name}")


def callbacks(typer_app: typer.Typer) -> Iterator[Callable]:
    """The functions behind the app's commands and group callbacks, recursively."""
    if typer_app.registered_callback and typer_app.registered_callback.callback:
        yield typer_app.registered_callback.callback
    for info in typer_app.registered_commands:
        yield info.callback
    for group in typer_app.registered_groups:
        yield from callbacks(group.typer_instance)


def reads_a_recipe(command: Any) -> bool:
    return any("--recipe" in p.opts or p.name == "recipe" for p in command.params)


def missing_set(root: Any) -> list[str]:
    """Commands that read a recipe (``--recipe`` or a ``recipe`` argument) but lack ``--set``."""
    return [path for path, command in click_commands(root) if reads_a_recipe(command)
            and not any("--set" in p.opts for p in command.params)]


def own_copies(typer_app: typer.Typer) -> list[str]:
    """``function(param)`` for each ``--recipe``/``--set`` option not taken from prour/cli/recipe."""
    found = []
    for callback in callbacks(typer_app):
        for name, param in inspect.signature(callback).parameters.items():
            declared = param.default
            if not isinstance(declared, OptionInfo):
                continue
            for flag, shared in SHARED.items():
                if flag in declared.param_decls and not any(declared is s for s in shared):
                    found.append(f"{callback.__qualname__}({name})")
    return found


def copied_help(root: Any) -> list[str]:
    """Options named --recipe/--set whose help is not the shared one (an Annotated copy)."""
    helps = {flag: {s.help for s in shared} for flag, shared in SHARED.items()}
    return [f"{path} {flag}" for path, command in click_commands(root) for p in command.params
            for flag in helps if flag in getattr(p, "opts", ()) and p.help not in helps[flag]]


def test_every_command_that_reads_a_recipe_takes_set() -> None:
    root = typer.main.get_command(app)
    readers = [path for path, command in click_commands(root) if reads_a_recipe(command)]
    assert {"prour validate", "prour eval", "prour train", "prour demo", "prour slurm submit",
            "prour calibrate", "prour calibrate states", "prour reward probe"} <= set(readers)
    assert missing_set(root) == []


def test_the_options_come_from_the_one_definition() -> None:
    assert own_copies(app) == []
    assert copied_help(typer.main.get_command(app)) == []


def test_a_command_with_its_own_options_is_reported() -> None:
    planted = typer.Typer()

    @planted.command("shared")
    def shared(recipe: str = common.RecipeOpt, overrides: list[str] | None = common.SetOpt) -> None:
        """Reads a recipe the shared way."""

    @planted.command("copied")
    def copied(recipe: str = typer.Option(..., "--recipe", help="own copy")) -> None:
        """Reads a recipe with its own option and no --set."""

    root = typer.main.get_command(planted)
    assert missing_set(root) == ["prour copied"]
    assert own_copies(planted) == [f"{copied.__qualname__}(recipe)"]
    assert copied_help(root) == ["prour copied --recipe"]


def test_validate_applies_set(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"name": "from-file", "run_dir": str(tmp_path / "run")}))
    runner = CliRunner()
    done = runner.invoke(app, ["validate", str(path), "--set", "name=from-set"])
    assert done.exit_code == 0, done.output
    assert "(recipe 'from-set')" in done.output
    bad = runner.invoke(app, ["validate", str(path), "--set", "seed=not-a-number"])
    assert bad.exit_code == 2
    assert "seed" in bad.output
