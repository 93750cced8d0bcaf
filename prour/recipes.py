"""The one way prour reads a recipe file, for every command and stage alike.

:func:`load_recipe` reads the YAML (with its ``extends`` chain), applies the ``--set key.sub=value``
overrides and then a command's own flags (``prour eval --max-tasks 3`` is
``--set eval.max_tasks=3``), validates the result once into a :class:`~prour.config.Recipe`, whose
paths follow the recipe's one path rule (see :mod:`prour.config`), and, when the caller asks,
checks what the cluster commands need or fills the base URLs of served models. Nothing else in
prour parses a recipe file (tests/test_architecture.py holds that line).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from prour.config import Recipe, apply_override, parse_recipe, read_recipe_data

__all__ = ["flag_overrides", "load_recipe", "prour_command", "with_data", "with_settings"]


def flag_overrides(flags: Mapping[str, Any]) -> list[str]:
    """``{"eval.max_tasks": 3}`` → ``["eval.max_tasks=3"]``; unset flags (None) are skipped."""
    return [f"{key}={json.dumps(value)}" for key, value in flags.items() if value is not None]


def load_recipe(
    path: str | Path,
    overrides: list[str] | None = None,
    *,
    flags: Mapping[str, Any] | None = None,
    endpoints: bool = False,
    cluster: bool = False,
) -> Recipe:
    """The validated recipe of ``path``; raises :class:`~prour.config.ConfigError` naming the
    file and dotted key.

    ``overrides`` (``key.sub=value``, values parsed as YAML) apply first, then ``flags`` (dotted
    key -> value; ``None`` means the flag was not given). With ``cluster`` every ``openai`` role
    without a ``base_url`` must be served by ``serve.models`` when that list is given (``prour
    serve``, ``prour slurm``). With ``endpoints`` such roles take their ``base_url`` from a ready
    endpoints file of ``prour serve`` (stages that call models); an unreadable endpoints file
    raises :class:`~prour.cluster.endpoints.EndpointsError`.
    """
    data = read_recipe_data(Path(path))
    items = [*(overrides or []), *flag_overrides(flags or {})]
    for item in items:
        apply_override(data, item)
    recipe = parse_recipe(data, str(path))
    recipe._origin = (str(path), tuple(items))
    if cluster:
        from prour.cluster.recipe import check_served_roles

        check_served_roles(recipe, str(path))
    if endpoints:
        from prour.cluster.endpoints import resolve_endpoints

        recipe = resolve_endpoints(recipe)
    return recipe


def with_settings(recipe: Recipe, items: list[str], source: str) -> Recipe:
    """``recipe`` with ``key.sub=value`` items laid over it as ``--set`` would, validated again
    (``source`` names them in an error): a step that runs its recipe with settings of its own
    (the chain's ig-clarifier training) reads the recipe its command will."""
    data = recipe.model_dump(mode="json", by_alias=True)
    for item in items:
        apply_override(data, item)
    return parse_recipe(data, source)


def with_data(recipe: Recipe, change: Callable[[dict[str, Any]], dict[str, Any]],
              source: str) -> Recipe:
    """``recipe`` as a mapping, changed by ``change`` and validated again (``source`` names the
    change in an error): a study's cell lays its axis values over the run's recipe."""
    data = recipe.model_dump(mode="json", by_alias=True)
    return parse_recipe(change(data), source)


def prour_command(recipe: Recipe, *argv: str) -> str:
    """``prour <argv> --recipe PATH [--set K=V ...]`` for the recipe as it was loaded: a hint that
    runs as printed, on the same recipe and overrides."""
    import shlex

    return shlex.join(["prour", *argv, *recipe.recipe_args()])
