"""The recipe as the training stage reads it: its ``train`` section and its plain dump."""

from __future__ import annotations

from typing import Any

from prour.config import ConfigError, Recipe
from prour.config.train import TrainConfig


def train_section(recipe: Recipe) -> TrainConfig:
    """The recipe's ``train`` section, or a :class:`ConfigError` when the recipe has none."""
    if recipe.train is None:
        raise ConfigError("train", "this recipe has no `train` section; add one to train")
    return recipe.train


def recipe_dict(recipe: Recipe) -> dict[str, Any]:
    """The whole resolved recipe as plain data (for provenance)."""
    return recipe.model_dump(mode="json")
