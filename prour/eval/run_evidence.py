"""Where a run's evidence is, for the paper beside the run (:mod:`prour.eval.paper`): the eval
folder, the recipe it saved and the run folder that recipe names (or ``--run-dir``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from prour.config import Recipe
from prour.config.eval import TRADEOFF_FOLDERS


@dataclass
class RunEvidence:
    """The eval folder, its saved recipe and the run folder the other evidence lives in."""

    eval_dir: Path
    recipe: Recipe | None = None  # None: no run folder could be found
    run_dir: Path | None = None
    moved_from: Path | None = None  # the recipe's run_dir when --run-dir replaced it
    notes: list[str] = field(default_factory=list)
    problem: str | None = None  # why there is no run folder

    def path(self, recorded: str | Path) -> Path:
        """A path the recipe records, moved under ``--run-dir`` when it lay under the recipe's."""
        path = Path(recorded)
        if self.moved_from is not None and path.is_relative_to(self.moved_from):
            return self.run_dir / path.relative_to(self.moved_from)
        return path

    def metrics_dir(self) -> Path:
        """``train.output_dir`` (its default under the run folder when the recipe has no train
        section: an eval-only recipe)."""
        if self.recipe.train is None:
            from prour.config import run_path
            from prour.config.train import TrainConfig

            default = TrainConfig.model_fields["output_dir"].default
            return Path(run_path(default, self.run_dir, self.recipe.name))
        return self.path(self.recipe.train.output_dir)

    def router_evidence(self) -> Path:
        from prour.router.pipeline import router_evidence_path

        return self.path(router_evidence_path(self.recipe))

    def sweep_dir(self, name: str) -> Path:
        return self.run_dir / TRADEOFF_FOLDERS[name]


def locate(eval_dir: str | Path, run_dir: str | Path | None = None) -> RunEvidence:
    """Read ``EVAL_DIR/recipe.resolved.yaml``; the run folder is ``run_dir`` when given, else
    the recipe's. Without a saved recipe, ``run_dir`` gets the recipe defaults' layout."""
    from prour.provenance import RECIPE_FILE
    from prour.recipes import load_recipe
    from prour.section import ConfigError

    found = RunEvidence(Path(eval_dir))
    saved = found.eval_dir / RECIPE_FILE
    try:
        recipe = load_recipe(saved) if saved.is_file() else None
    except (ConfigError, ValueError) as exc:
        recipe, found.notes = None, [f"{saved} does not read ({exc})"]
    if recipe is None and run_dir is None:
        found.problem = (f"{saved} is missing or unreadable (`prour eval` writes it): pass the "
                         "run folder with --run-dir RUN_DIR")
        return found
    if recipe is None:
        found.notes.append(f"{saved} is missing: the recipe defaults' layout is assumed under "
                           f"{run_dir}")
        recipe = Recipe(name="defaults", run_dir=str(Path(run_dir).absolute()), train={})
    found.recipe = recipe
    found.run_dir = Path(run_dir).absolute() if run_dir is not None else Path(recipe.run_dir)
    if run_dir is not None and Path(recipe.run_dir) != found.run_dir:
        found.moved_from = Path(recipe.run_dir)
        found.notes.append(f"run folder {found.run_dir} (--run-dir; the recipe says "
                           f"{recipe.run_dir})")
    if recipe.train is None:  # the chain's recipes have one; an eval-only recipe may not
        found.notes.append("the recipe has no train section: train.output_dir's default is "
                           "assumed")
    return found
