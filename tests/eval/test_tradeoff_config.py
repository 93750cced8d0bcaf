"""eval.tradeoff (Figures 5 and 8 as steps of prour run): bad values name their dotted key, and
a sweep step's command runs the recipe's tradeoff methods over one router key into its own
folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prour.config import ConfigError
from prour.recipes import load_recipe

REPO = Path(__file__).resolve().parents[2]
PAPER = REPO / "recipes" / "paper.yaml"


@pytest.mark.parametrize(("item", "key", "said"), [
    ("eval.tradeoff.methods=[base]", "eval.tradeoff.methods", "routes with no router"),
    ("eval.tradeoff.methods=[]", "eval.tradeoff.methods", "at least one method"),
    ("eval.tradeoff.budget=[2,2]", "eval.tradeoff.budget", "values repeat"),
    ("eval.tradeoff.every_n=[0]", "eval.tradeoff.every_n", "not an integer >= 1"),
    ("eval.tradeoff.budget=[-1]", "eval.tradeoff.budget", "not an integer >= 0"),
])
def test_a_bad_tradeoff_value_names_its_key(item: str, key: str, said: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_recipe(PAPER, [item])
    assert key in str(caught.value) and said in str(caught.value)


def test_the_sweep_steps_run_the_tradeoff_methods_over_one_router_key(tmp_path: Path) -> None:
    from prour.stages import get_step, tradeoff_recipe

    recipe = load_recipe(PAPER, [f"run_dir={tmp_path}"])
    for name, folder, key in (("budget", "eval-budget", "router.budget"),
                              ("every_n", "eval-every-n", "router.every_n")):
        swept = tradeoff_recipe(recipe, name)
        assert swept.eval.methods == ["prour"]
        assert swept.eval.sweep == {key: getattr(recipe.eval.tradeoff, name)}
        command = get_step(f"eval-{name.replace('_', '-')}").argv(recipe, "R")
        at = command.index("--out")
        assert command[at + 1] == str(tmp_path / folder)
        sets = [command[i + 1] for i, word in enumerate(command) if word == "--set"]
        assert f"eval.sweep={json.dumps({key: getattr(recipe.eval.tradeoff, name)})}" in sets
        assert 'eval.methods=["prour"]' in sets
