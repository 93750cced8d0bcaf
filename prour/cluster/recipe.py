"""The servers a recipe's ``openai`` roles without a ``base_url`` need, as the cluster commands
read them (``load_recipe(..., cluster=True)`` runs :func:`check_served_roles`).

``serve.models`` lists the servers when given, and then every such role must name one of them.
When it is empty, each distinct model id of those roles gets one server with the defaults of
:class:`~prour.cluster.config.ServedModel` (roles that share a model id share a server)."""

from __future__ import annotations

from prour.cluster.config import ServedModel
from prour.config import ConfigError, Recipe
from prour.registry import did_you_mean


def unserved_roles(recipe: Recipe) -> dict[str, str]:
    """Role -> model id of every ``openai`` role without a ``base_url`` (the roles to serve)."""
    return {
        role: str(cfg.model)
        for role, cfg in recipe.models.items()
        if cfg.backend == "openai" and not cfg.base_url
    }


def served_models(recipe: Recipe) -> dict[str, ServedModel]:
    """Model id -> server: the ``serve.models`` entries some role uses, or one default server per
    model id to serve. An entry no role names is not a server: a recipe that extends another and
    changes its models (gpu-smoke, rehearsal) inherits the base's entries, merged key by key."""
    used = dict.fromkeys(unserved_roles(recipe).values())
    if recipe.serve.models:
        return {model_id: spec for model_id, spec in recipe.serve.models.items()
                if model_id in used}
    return {model_id: ServedModel() for model_id in used}


def served_roles(recipe: Recipe) -> dict[str, list[str]]:
    """Model id -> the ``openai`` roles without a fixed ``base_url`` that it serves."""
    users: dict[str, list[str]] = {model_id: [] for model_id in served_models(recipe)}
    for role, model_id in unserved_roles(recipe).items():
        if model_id in users:
            users[model_id].append(role)
    return users


def nothing_to_serve(recipe: Recipe) -> str | None:
    """Why ``prour serve`` would start no server for this recipe, or ``None`` when it starts some."""
    if any(served_roles(recipe).values()):
        return None
    how = [
        f"models.{role}: " + (f"base_url {cfg.base_url}" if cfg.backend == "openai" else cfg.backend)
        for role, cfg in recipe.models.items()
    ]
    return (
        f"nothing to serve: no openai role of recipe {recipe.name!r} lacks a base_url "
        f"({'; '.join(how) or 'no models'}); `prour serve` starts a vLLM server for each openai "
        f"role without base_url"
    )


def check_served_roles(recipe: Recipe, source: str | None = None) -> None:
    """Every ``openai`` role without a ``base_url`` must name a model in ``serve.models`` (when
    that list is given; without it every such model is served)."""
    served = recipe.serve.models
    if not served:
        return
    for role, cfg in recipe.models.items():
        if cfg.backend != "openai" or cfg.base_url or cfg.model in served:
            continue
        listing = ", ".join(served) or "none"
        raise ConfigError(
            f"models.{role}.model",
            f"{cfg.model!r} has no base_url and is not served by this recipe (serve.models: "
            f"{listing}); add it under serve.models or set models.{role}.base_url."
            f"{did_you_mean(cfg.model, served)}",
            source,
        )
