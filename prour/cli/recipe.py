"""How every command reads its recipe: the YAML file, the ``--set key.sub=value`` overrides, then
the command's own flags as overrides of the keys they stand for (``prour eval --max-tasks 3`` is
``--set eval.max_tasks=3``), validated once. Stages get that one resolved recipe, and provenance
records it as it is; an error exits 2 naming the dotted key.

The ``--recipe`` and ``--set`` options are defined here once; every command that reads a recipe
takes both (tests/cli/test_common_options.py walks the app to hold that).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

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


def flag_overrides(flags: Mapping[str, Any]) -> list[str]:
    """``{"eval.max_tasks": 3}`` → ``["eval.max_tasks=3"]``; unset flags (None) are skipped."""
    return [f"{key}={json.dumps(value)}" for key, value in flags.items() if value is not None]


def load_cli_recipe(
    path: str | Path,
    overrides: list[str] | None = None,
    flags: Mapping[str, Any] | None = None,
    served: bool = True,
) -> Recipe:
    """The resolved recipe of a command; with ``served``, ``openai`` roles without a ``base_url``
    take it from the endpoints file of ``prour serve`` (the cluster commands decide that)."""
    from prour.cluster.endpoints import load_run_recipe
    from prour.config import ConfigError, load_recipe

    items = [*(overrides or []), *flag_overrides(flags or {})]
    try:
        return (load_run_recipe if served else load_recipe)(path, items)
    except (ConfigError, RuntimeError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@contextmanager
def hold_run_folder(folder: str | Path) -> Iterator[None]:
    """One writer per run folder (:mod:`prour.runlock`): a folder held by another live command
    exits 2 with one line naming it (pid, host, since, command)."""
    from prour.runlock import RunLocked, acquire, release

    try:
        holder = acquire(folder)
    except RunLocked as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        yield
    finally:
        release(folder, holder)


def preflight_problems(recipe: Recipe, *stages: str, whole_run: bool = False,
                       skip: tuple[str, ...] = ()) -> list[str]:
    """The preflight lines of ``stages`` (:mod:`prour.preflight`), each printed as an error."""
    from prour.preflight import preflight

    found = preflight(recipe, stages, whole_run=whole_run, skip=skip)
    lines = [problem.line() for problem in found]
    for line in lines:
        typer.echo(f"error: {line}", err=True)
    return lines


def preflight_or_exit(recipe: Recipe, *stages: str) -> None:
    """Stop the command before its first episode or step (exit 2) when the setup is broken."""
    if preflight_problems(recipe, *stages):
        raise typer.Exit(2)


@contextmanager
def resumable(saved: Callable[[], str]) -> Iterator[None]:
    """Ctrl-C: say what ``saved()`` reports was kept and that a rerun resumes; exit 130."""
    try:
        yield
    except KeyboardInterrupt:
        typer.echo(f"\ninterrupted: {saved()}", err=True)
        raise typer.Exit(130) from None


def saved_lines(path: Path, what: str) -> str:
    """``N <what> saved in <path>`` counting the JSONL lines appended so far."""
    try:
        with open(path) as handle:
            count = sum(1 for line in handle if line.strip())
    except FileNotFoundError:
        count = 0
    return f"{count} {what} saved in {path}"
