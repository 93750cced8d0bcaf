"""The data stage from a recipe: its sections, and ``prour extract`` (inputs, decomposer, tokenizer,
outputs)."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prour.data.collect import load_trajectories
from prour.data.dataset import check_dataset
from prour.data.decisions import DecisionCache, decomposer_fingerprint
from prour.data.extract import Router, extract_instances, write_dataset
from prour.data.normalize import load_goals
from prour.data.truncate import PolicyTokens

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe
    from prour.data.config import DataConfig
    from prour.router.config import RouterConfig

log = logging.getLogger(__name__)


@dataclass
class DataRecipe:
    """A recipe with the two sections the data stage reads."""

    recipe: Recipe
    data: DataConfig
    router: RouterConfig

    @property
    def run_dir(self) -> Path:
        return self.recipe.resolved_run_dir()


def load_data_recipe(path: str | Path, overrides: list[str] | None = None) -> DataRecipe:
    """Load a recipe with the ``data`` and ``router`` sections the data stage reads."""
    from prour.cluster.endpoints import load_run_recipe

    recipe = load_run_recipe(path, overrides)
    return DataRecipe(recipe, recipe.data, recipe.router)


@dataclass
class ExtractResult:
    """Where the dataset went, its card, schema errors, and corrupt input lines skipped."""

    dataset_dir: Path
    trajectories_path: Path
    card: dict[str, Any]
    errors: list[str]
    skipped_lines: list[int] = field(default_factory=list)


def build_router(run: DataRecipe) -> Router:
    """The decomposer of ``models.decomposer`` with the recipe's router settings and thresholds."""
    from prour.env.environment import tool_schemas
    from prour.llm.registry import build_llm
    from prour.router.decomposer import Decomposer
    from prour.router.thresholds import decomposer_model_id

    model = run.recipe.models["decomposer"]
    model_id = decomposer_model_id(model)
    thresholds = run.router.thresholds(model_id)
    llm = build_llm(model)

    @functools.cache
    def decomposer_for(domain: str) -> Decomposer:
        return Decomposer(llm, tool_schemas(domain), run.router, thresholds=thresholds)

    return Router(decomposer_for, model_id, decomposer_fingerprint(run.router), thresholds,
                  run.router.empty_route)


def run_extract(run: DataRecipe, progress: bool = True) -> ExtractResult:
    """Extract the dataset of a recipe's run directory and check it."""
    cfg, run_dir = run.data, run.run_dir
    source = cfg.path("trajectories", run_dir)
    trajectories = load_trajectories(source, cfg.on_bad_line)
    goals = load_goals(cfg.path("goals", run_dir), cfg.on_bad_line)
    router = build_router(run)
    cache = DecisionCache(cfg.path("decisions", run_dir), cfg.on_bad_line)
    tokenizer = cfg.tokenizer or run.recipe.models["generator"].path
    tokens = PolicyTokens(tokenizer)
    instances, summary = extract_instances(trajectories, goals, router, cache, tokens, cfg,
                                           progress=progress)
    out_dir = cfg.path("dataset_dir", run_dir)
    extra = {"decomposer_model": router.model_id, "thresholds": list(router.thresholds),
             "tokenizer": str(tokenizer), "max_prompt_tokens": cfg.max_prompt_tokens,
             "split_by": cfg.split_by, "val_ratio": cfg.val_ratio, "split_seed": cfg.split_seed,
             "skipped_lines": {str(source): list(trajectories.skipped),
                               str(cache.path): cache.skipped_lines}}
    card = write_dataset(instances, summary, out_dir, extra)
    record_provenance(run, "extract", out_dir)
    return ExtractResult(out_dir, source, card, check_dataset(out_dir), list(trajectories.skipped))


def record_provenance(run: DataRecipe, stage: str, folder: Path | None = None) -> Path:
    """Resolved recipe (with the data and router sections), git commit, versions and seed of a
    stage, in ``folder`` (default ``<run_dir>/provenance/<stage>``)."""
    from prour.provenance import write_provenance

    resolved = run.recipe.model_dump(mode="json")
    resolved.update(data=run.data.model_dump(mode="json"), router=run.router.model_dump(mode="json"))
    target = folder or run.run_dir / "provenance" / stage
    return write_provenance(target, resolved, run.recipe.seed, extra={"stage": stage})
