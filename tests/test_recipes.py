"""Every recipe under recipes/ (recursively) loads and validates, stage sections included; each
decoding value has one key, with the paper's numbers as defaults."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest
from pydantic import BaseModel

from prour.config import ConfigError, Recipe, load_recipe, parse_recipe

RECIPES = sorted((Path(__file__).resolve().parents[1] / "recipes").rglob("*.yaml"))


def test_there_are_recipes():
    names = {p.name for p in RECIPES}
    assert {"paper.yaml", "smoke.yaml"} <= names


@pytest.mark.parametrize("path", RECIPES, ids=[str(p.relative_to(p.parents[1])) for p in RECIPES])
def test_recipe_validates(path: Path):
    recipe = load_recipe(path)
    assert recipe.name == path.stem


def test_decoding_defaults_are_the_papers_numbers():
    """DESIGN §3: evaluation agent 0.01, user 1.0, generator 0.0; training rollouts at 0.8,
    top-p 1.0, prompt <= 1400 and response <= 1760 tokens, thinking on."""
    recipe = Recipe(name="defaults", train={})
    env, rollout = recipe.env, recipe.train.rollout
    assert (env.agent_temperature, env.user_temperature, recipe.eval.generator_temperature) == (
        0.01, 1.0, 0.0)
    assert (rollout.temperature, rollout.top_p, rollout.enable_thinking) == (0.8, 1.0, True)
    assert (recipe.data.max_prompt_tokens, rollout.max_response_tokens) == (1400, 1760)


@pytest.mark.parametrize(("key", "home"), [
    ("env.split", "data.split / eval.split"),
    ("env.tasks", "eval.tasks"),
    ("env.max_tasks", "data.max_tasks / eval.max_tasks"),
    ("models.generator.temperature", "train.rollout.temperature"),
    ("data.agent_temperature", "env.agent_temperature"),
    ("eval.user_max_tokens", "env.user_max_tokens"),
    ("eval.generator_max_tokens", "train.rollout.max_response_tokens"),
    ("eval.generator_thinking", "train.rollout.enable_thinking"),
    ("eval.verifier_max_steps", "reward.verifier_max_steps"),
    ("eval.verifier_max_tokens", "reward.responder_max_tokens"),
    ("train.rollout.max_prompt_tokens", "data.max_prompt_tokens"),
    ("eval.n_boot", "prour report --n-boot"),
])
def test_a_second_copy_of_a_value_is_refused_naming_its_key(key: str, home: str):
    """Each of these once had a twin (``home``, kept); the twin is now an unknown key."""
    data: dict = {"name": "twins", "train": {}, "models": {"generator": {"path": "g"}}}
    *parents, leaf = key.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = 1
    with pytest.raises(ConfigError, match=rf"{key.replace('.', '[.]')}: unknown key"):
        parse_recipe(data)
    for kept in home.split(" / "):
        if not kept.startswith("prour "):
            assert _is_field(kept), kept


def _is_field(key: str) -> bool:
    """Whether a dotted key names a field of :class:`Recipe` (sections walked by their type)."""
    model: type[BaseModel] = Recipe
    for part in key.split("."):
        if part not in model.model_fields:
            return False
        annotation = model.model_fields[part].annotation
        inner = [a for a in (annotation, *get_args(annotation))
                 if isinstance(a, type) and issubclass(a, BaseModel)]
        model = inner[0] if inner else BaseModel
    return True


def test_a_recipe_extends_another_merging_mappings(tmp_path: Path):
    (tmp_path / "base.yaml").write_text(
        "name: base\nseed: 3\nreward:\n  aggregation: mean\n  invalid_penalty: -1.0\n")
    (tmp_path / "child.yaml").write_text(
        "extends: base.yaml\nname: child\nreward:\n  attention:\n    lambda: 0.2\n")
    recipe = load_recipe(tmp_path / "child.yaml", ["reward.invalid_penalty=-0.5"])
    assert (recipe.name, recipe.seed, recipe.reward.aggregation) == ("child", 3, "mean")
    assert (recipe.reward.attention.lam, recipe.reward.invalid_penalty) == (0.2, -0.5)


def test_extends_refuses_a_cycle_and_names_a_missing_base(tmp_path: Path):
    (tmp_path / "a.yaml").write_text("extends: b.yaml\nname: a\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\nname: b\n")
    with pytest.raises(ConfigError, match="extends: recipes extend each other in a cycle"):
        load_recipe(tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text("extends: gone.yaml\nname: c\n")
    with pytest.raises(ConfigError, match=r"gone.yaml \(extended by .*c.yaml\)"):
        load_recipe(tmp_path / "c.yaml")
