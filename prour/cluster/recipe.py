"""A recipe with the sections the cluster commands read (``serve``, ``slurm``) beside its others.

Sections that :class:`~prour.config.Recipe` does not carry yet are validated here and the rest
are kept as plain mappings, so ``prour serve`` and ``prour slurm`` work on any recipe file.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from prour.cluster.config import ServeConfig, SlurmConfig
from prour.config import ConfigError, Recipe, Section, apply_override, first_error, parse_recipe


@dataclass
class ClusterRecipe:
    """A recipe with the sections the cluster commands read; other sections stay raw mappings."""

    recipe: Recipe
    serve: ServeConfig
    slurm: SlurmConfig
    raw: dict[str, Any] = field(default_factory=dict)  # sections Recipe does not carry (yet)
    source: str | None = None

    @property
    def run_dir(self) -> Path:
        return self.recipe.resolved_run_dir()

    def section(self, name: str) -> dict[str, Any]:
        """A stage section as a plain mapping, whether Recipe carries it or not."""
        value = getattr(self.recipe, name, None)
        if value is not None and hasattr(value, "model_dump"):
            return value.model_dump()
        raw = self.raw.get(name)
        return dict(raw) if isinstance(raw, dict) else {}


def _section(model: type[Section], raw: Any, name: str, source: str | None) -> Any:
    """Validate one section mapping, naming the dotted key on error."""
    try:
        return model.model_validate(raw or {})
    except ValidationError as exc:
        err = first_error(exc)
        text = str(err).split(": ", 1)[-1]
        raise ConfigError(f"{name}.{err.key}", text, source) from None


def load_cluster_recipe(path: str | Path, overrides: list[str] | None = None) -> ClusterRecipe:
    """Load a recipe with its ``serve`` and ``slurm`` sections (read beside Recipe if need be)."""
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
    extra = {key: raw.pop(key) for key in list(raw) if key not in Recipe.model_fields}
    recipe = parse_recipe(raw, str(path), endpoints=False)  # serve decides roles itself
    serve = getattr(recipe, "serve", None) or _section(
        ServeConfig, extra.get("serve"), "serve", str(path)
    )
    slurm = getattr(recipe, "slurm", None) or _section(
        SlurmConfig, extra.get("slurm"), "slurm", str(path)
    )
    loaded = ClusterRecipe(recipe, serve, slurm, extra, str(path))
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
        close = difflib.get_close_matches(str(cfg.model), list(served), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        listing = ", ".join(served) or "none"
        raise ConfigError(
            f"models.{role}.model",
            f"{cfg.model!r} has no base_url and is not served by this recipe (serve.models: "
            f"{listing}); add it under serve.models or set models.{role}.base_url.{hint}",
            loaded.source,
        )
