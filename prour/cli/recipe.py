"""What the commands share around their recipe: the ``--recipe`` and ``--set`` options, defined
here once (every command that reads a recipe takes both; tests/cli/test_common_options.py walks the
app to hold that), and a recipe that does not load exiting 2 with its one error line. Every command
loads through :func:`prour.recipes.load_recipe`, its ``--set`` overrides and then its own flags as
overrides of the keys they stand for (``prour eval --max-tasks 3`` is ``--set eval.max_tasks=3``),
validated once. Stages get that one resolved recipe, and provenance records it as it is. Also here:
the run-folder lock, preflight and SIGINT/SIGTERM handling.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe

RecipeOpt = typer.Option(..., "--recipe", "-r", help="Path to a YAML recipe.")
# For a command that names what it does without one (its help says so): a group callback whose
# subcommands read their own, `prour demo`'s embedded smoke recipe, `reward probe --model`.
RecipeOrNoneOpt = typer.Option(
    None, "--recipe", "-r", help="Path to a YAML recipe (see the command's help when omitted).")
SetOpt = typer.Option(
    None, "--set", help="Override a recipe value: key.sub=value (repeatable).")


@contextmanager
def recipe_errors() -> Iterator[None]:
    """A recipe that does not load (:class:`~prour.config.ConfigError`, an unreadable endpoints
    file) exits 2 with its one line naming the file, the dotted key and the fix."""
    from prour.config import ConfigError

    try:
        yield
    except (ConfigError, RuntimeError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@contextmanager
def hold_run_folder(folder: str | Path) -> Iterator[None]:
    """One writer per run folder (:mod:`prour.runlock`): a folder held by another live command
    exits 2 with one line naming it (pid, host, since, command). An interrupted command releases
    it before its report says so (:func:`prour.interrupt.on_stop`)."""
    from prour import interrupt
    from prour.runlock import LOCK_FILE, RunLocked, acquire, release

    try:
        holder = acquire(folder)
    except RunLocked as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        with interrupt.on_stop(f"the lock {Path(folder) / LOCK_FILE}",
                               lambda: release(folder, holder)):
            yield
    finally:
        release(folder, holder)


def preflight_problems(recipe: Recipe, *stages: str, whole_run: bool = False,
                       skip: tuple[str, ...] = ()) -> list[str]:
    """The preflight lines of ``stages`` (:mod:`prour.preflight`), each printed as an error."""
    from prour.cli.failures import complete_hints
    from prour.preflight import preflight, protocol_warnings

    found = preflight(recipe, stages, whole_run=whole_run, skip=skip)
    if "protocol" not in skip:
        for line in protocol_warnings(recipe):
            typer.echo(f"warning: {line} (protocol.on_breach: warn)", err=True)
    lines = [complete_hints(problem.line(), recipe) for problem in found]
    for line in lines:
        typer.echo(f"error: {line}", err=True)
    return lines


def preflight_or_exit(recipe: Recipe, *stages: str) -> None:
    """Stop the command before its first episode or step (exit 2) when the setup is broken."""
    if preflight_problems(recipe, *stages):
        raise typer.Exit(2)


@contextmanager
def resumable(saved: Callable[[], str]) -> Iterator[None]:
    """SIGINT or SIGTERM (:mod:`prour.interrupt`): say what ``saved()`` reports was kept and that a
    rerun resumes, release the run lock, exit 130."""
    from prour import interrupt

    with interrupt.interruptible(saved):
        yield


def saved_lines(path: Path, what: str) -> str:
    """``N <what> saved in <path>`` counting the JSONL lines appended so far."""
    try:
        with open(path) as handle:
            count = sum(1 for line in handle if line.strip())
    except FileNotFoundError:
        count = 0
    return f"{count} {what} saved in {path}"
