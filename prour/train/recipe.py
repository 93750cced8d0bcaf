"""The recipe as the training stage reads it: its ``train`` section and its plain dump."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prour.config import ConfigError, Recipe, run_path
from prour.config.train import TrainConfig


def train_section(recipe: Recipe) -> TrainConfig:
    """The recipe's ``train`` section, or a :class:`ConfigError` when the recipe has none."""
    if recipe.train is None:
        raise ConfigError("train", "this recipe has no `train` section; add one to train")
    return recipe.train


def output_dir(recipe: Recipe) -> Path:
    """Where training writes its checkpoints: ``train.output_dir``, or its default taken from
    ``run_dir`` by the path rule when the recipe has no ``train`` section."""
    if recipe.train is not None:
        return Path(recipe.train.output_dir)
    return Path(run_path(TrainConfig().output_dir, recipe.resolved_run_dir(), recipe.name))


def recipe_dict(recipe: Recipe) -> dict[str, Any]:
    """The whole resolved recipe as plain data (for provenance)."""
    return recipe.model_dump(mode="json")
