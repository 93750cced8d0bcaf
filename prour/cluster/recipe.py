"""A recipe as the cluster commands read it: its ``serve`` and ``slurm`` sections at hand."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prour.cluster.config import ServeConfig, SlurmConfig
from prour.config import ConfigError, Recipe, apply_override, parse_recipe
from prour.registry import did_you_mean


@dataclass
class ClusterRecipe:
    """A recipe with the sections the cluster commands read."""

    recipe: Recipe
    serve: ServeConfig
    slurm: SlurmConfig
    source: str | None = None

    @property
    def run_dir(self) -> Path:
        return self.recipe.resolved_run_dir()

    def section(self, name: str) -> dict[str, Any]:
        """A stage section as a plain mapping (empty when the recipe leaves it unset)."""
        value = getattr(self.recipe, name, None)
        return value.model_dump() if value is not None else {}


def load_cluster_recipe(path: str | Path, overrides: list[str] | None = None) -> ClusterRecipe:
    """Load a recipe for ``prour serve`` / ``prour slurm`` (endpoints are not resolved here)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError("<file>", f"recipe file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError("<yaml>", f"not valid YAML: {exc}", str(path)) from None
    if not isinstance(raw, dict):
        raise ConfigError("<root>", "a recipe must be a mapping", str(path))
    for item in overrides or []:
        apply_override(raw, item)
    recipe = parse_recipe(raw, str(path))  # endpoints are not resolved: serve decides roles itself
    loaded = ClusterRecipe(recipe, recipe.serve, recipe.slurm, str(path))
    check_served_roles(loaded)
    return loaded


def served_roles(recipe: Recipe, serve: ServeConfig) -> dict[str, list[str]]:
    """Model id -> the ``openai`` roles without a fixed ``base_url`` that it serves."""
    users: dict[str, list[str]] = {model_id: [] for model_id in serve.models}
    for role, cfg in recipe.models.items():
        if cfg.backend == "openai" and not cfg.base_url and cfg.model in users:
            users[cfg.model].append(role)
    return users


def check_served_roles(loaded: ClusterRecipe) -> None:
    """Every ``openai`` role without a ``base_url`` must name a model in ``serve.models``."""
    served = loaded.serve.models
    for role, cfg in loaded.recipe.models.items():
        if cfg.backend != "openai" or cfg.base_url or cfg.model in served:
            continue
        hint = did_you_mean(cfg.model, served)
        listing = ", ".join(served) or "none"
        raise ConfigError(
            f"models.{role}.model",
            f"{cfg.model!r} has no base_url and is not served by this recipe (serve.models: "
            f"{listing}); add it under serve.models or set models.{role}.base_url.{hint}",
            loaded.source,
        )
