"""``prour extract`` from a recipe (inputs, decomposer, tokenizer, outputs) and the data stages'
provenance."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from prour.data.collect import load_trajectories
from prour.data.dataset import check_dataset
from prour.data.decisions import DecisionCache, decomposer_fingerprint
from prour.data.extract import (
    Router,
    every_state_instances,
    extract_instances,
    write_dataset,
)
from prour.data.normalize import load_goals
from prour.data.truncate import PolicyTokens
from prour.llm.weights import local_weights

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import ModelConfig, Recipe
    from prour.router.decomposer import Decomposer

log = logging.getLogger(__name__)


@dataclass
class ExtractResult:
    """Where the dataset went, its card, schema errors, and corrupt input lines skipped."""

    dataset_dir: Path
    trajectories_path: Path
    card: dict[str, Any]
    errors: list[str]
    skipped_lines: list[int] = field(default_factory=list)


class DecomposerParts(Protocol):
    """What extract asks of the builder of the recipe's components, which the ``prour extract``
    command makes and hands down."""

    recipe: Recipe

    def decomposer(self, domain: str) -> Decomposer: ...

    def model_config(self, role: str) -> ModelConfig: ...

    def thresholds(self) -> tuple[float, float]: ...


def build_router(builder: DecomposerParts) -> Router:
    """The decomposer of ``models.decomposer`` with the recipe's router settings and thresholds."""
    from prour.router.thresholds import decomposer_model_id

    recipe = builder.recipe
    decomposer_for = functools.cache(builder.decomposer)
    return Router(decomposer_for, decomposer_model_id(builder.model_config("decomposer")),
                  decomposer_fingerprint(recipe.router), builder.thresholds(),
                  recipe.router.empty_route)


def policy_tokenizer(recipe: Recipe) -> tuple[str, str]:
    """The policy tokenizer extract counts prompt tokens with, and the recipe key naming it."""
    if recipe.data.tokenizer:
        return recipe.data.tokenizer, "data.tokenizer"
    generator = recipe.models["generator"]
    if generator.path:
        return generator.path, "models.generator.path"
    return str(generator.model or generator.script), "models.generator.model"  # served: its hub id


def run_extract(recipe: Recipe, builder: DecomposerParts | None = None,
                progress: bool = True) -> ExtractResult:
    """Extract the dataset of a recipe's run directory and check it: the decomposer's clarify and
    verify states (``data.states: routed``, whose decomposer ``builder`` makes), or every
    decision state as a clarify row with no decomposer (``every``: the IG-Clarifier baseline's
    own data)."""
    cfg = recipe.data
    source = Path(cfg.trajectories)
    trajectories = load_trajectories(source, cfg.on_bad_line)
    goals = load_goals(cfg.goals, cfg.on_bad_line)
    tokenizer, key = policy_tokenizer(recipe)
    tokens = PolicyTokens(local_weights(tokenizer, recipe.models_dir, key))
    skipped = {str(source): list(trajectories.skipped)}
    if cfg.states == "every":
        instances, summary = every_state_instances(trajectories, goals, tokens, cfg)
        routing: dict[str, Any] = {"decomposer_model": None, "thresholds": None}
    else:
        if builder is None:
            raise ValueError("data.states: routed routes the states with models.decomposer: "
                             "give run_extract the builder of the recipe's components")
        router = build_router(builder)
        cache = DecisionCache(cfg.decisions, cfg.on_bad_line)
        instances, summary = extract_instances(trajectories, goals, router, cache, tokens, cfg,
                                               progress=progress)
        routing = {"decomposer_model": router.model_id, "thresholds": list(router.thresholds)}
        skipped[str(cache.path)] = cache.skipped_lines
    out_dir = Path(cfg.dataset_dir)
    extra = {"states_rule": cfg.states, **routing, "tokenizer": str(tokenizer),
             "max_prompt_tokens": cfg.max_prompt_tokens, "verify_target": cfg.verify_target,
             "split_by": cfg.split_by, "val_ratio": cfg.val_ratio, "split_seed": cfg.split_seed,
             "skipped_lines": skipped}
    card = write_dataset(instances, summary, out_dir, extra)
    record_provenance(recipe, "extract", out_dir)
    empty = not any(summary.rows.values())  # nothing to check: the caller says what it lacked
    errors = [] if empty else check_dataset(out_dir)
    return ExtractResult(out_dir, source, card, errors, list(trajectories.skipped))


def record_provenance(recipe: Recipe, stage: str, folder: Path | None = None, *,
                      output: Path | None = None) -> Path:
    """Resolved recipe, git commit, versions and seed of a data stage, in ``folder`` (default
    ``<run_dir>/provenance/<stage>``, or the folder of ``output`` there when a stage writes one
    of several files: each collection keeps its own)."""
    from prour.provenance import output_provenance_dir, write_provenance

    run_dir = recipe.resolved_run_dir()
    if folder is None:
        folder = (run_dir / "provenance" / stage if output is None
                  else output_provenance_dir(run_dir, stage, output))
    return write_provenance(folder, recipe, extra={"stage": stage, **(
        {"output": str(output)} if output is not None else {})})
