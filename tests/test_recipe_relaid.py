"""A recipe laid out again as a mapping and validated (:func:`prour.recipes.with_settings`: a
trade-off sweep's recipe, a step's own ``--set`` items; :func:`prour.recipes.with_data`: a study
cell's) is the same recipe: a key the recipe sets to null whose default is not null stays null.
paper.yaml's ``serve.models.exported-generator.tool_call_parser: null`` came back as the default
``hermes``, so `prour run` planned the sweeps' generator server unlike eval's and restarted it
between the two steps, and a study cell served its generator with tool calling."""

from __future__ import annotations

from pathlib import Path

import pytest

from prour.cluster.serve import plan_servers
from prour.recipes import load_recipe, with_data, with_settings
from prour.stages import STAGES

RECIPES = sorted((Path(__file__).resolve().parents[1] / "recipes").glob("*.yaml"))


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_a_recipe_laid_out_again_keeps_every_value(path: Path, tmp_path: Path) -> None:
    recipe = load_recipe(path, [f"run_dir={tmp_path}"])
    values = recipe.model_dump(mode="json")
    assert with_settings(recipe, [], "no items").model_dump(mode="json") == values
    assert with_data(recipe, lambda data: data, "no change").model_dump(mode="json") == values


def test_the_sweeps_call_the_generator_server_eval_started(tmp_path: Path) -> None:
    recipe = load_recipe(RECIPES[0].parent / "rehearsal.yaml", [f"run_dir={tmp_path}"])
    steps = {step.name: step for stage in STAGES for step in stage.steps}
    plans = {name: {p.model_id: p for p in plan_servers(recipe, step=steps[name])}
             for name in ("eval", "eval-budget", "eval-every-n")}
    served = plans["eval"]["exported-generator"]
    assert served.spec.tool_call_parser is None  # as paper.yaml sets it: no tools offered
    for name in ("eval-budget", "eval-every-n"):
        assert plans[name]["exported-generator"] == served, name
