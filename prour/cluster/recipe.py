"""The recipe as the cluster commands read it: endpoints left unresolved (``prour serve`` decides
them) and every ``openai`` role without a ``base_url`` checked against ``serve.models``."""

from __future__ import annotations

from pathlib import Path

from prour.config import ConfigError, Recipe, load_recipe
from prour.registry import did_you_mean


def load_cluster_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Load a recipe for ``prour serve`` / ``prour slurm`` (endpoints are not resolved here)."""
    recipe = load_recipe(path, overrides)
    check_served_roles(recipe, str(path))
    return recipe


def served_roles(recipe: Recipe) -> dict[str, list[str]]:
    """Model id -> the ``openai`` roles without a fixed ``base_url`` that it serves."""
    users: dict[str, list[str]] = {model_id: [] for model_id in recipe.serve.models}
    for role, cfg in recipe.models.items():
        if cfg.backend == "openai" and not cfg.base_url and cfg.model in users:
            users[cfg.model].append(role)
    return users


def check_served_roles(recipe: Recipe, source: str | None = None) -> None:
    """Every ``openai`` role without a ``base_url`` must name a model in ``serve.models``."""
    served = recipe.serve.models
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
