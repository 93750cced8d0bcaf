"""The builder: every component of a recipe from one place, one loaded model per distinct model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from prour.build import Builder, instance_key
from prour.config import ModelConfig, Recipe

ROLES = ("agent", "user", "decomposer", "verifier", "generator", "strict_user", "judge")


@pytest.fixture
def model_loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Paths passed to ``AutoModelForCausalLM.from_pretrained`` (each call is one real load)."""
    import transformers

    loads: list[str] = []
    original = transformers.AutoModelForCausalLM.from_pretrained

    def counting(path: Any, *args: Any, **kwargs: Any) -> Any:
        loads.append(str(path))
        return original(path, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", counting)
    return loads


def _recipe(tiny: Path, **different: dict[str, Any]) -> Recipe:
    """Every role on the tiny model (float32, cpu); ``different`` changes some roles' fields."""
    base = {"backend": "hf", "path": str(tiny), "device": "cpu", "dtype": "float32"}
    models = {role: {**base, **different.get(role, {})} for role in ROLES}
    return Recipe.model_validate({"name": "shared", "models": models,
                                  "router": {"tau_au": 0.5, "tau_eu": 0.5}})


def _build_every_component(builder: Builder) -> list[Any]:
    return [
        builder.task_agent(),
        builder.user_simulator(),
        builder.decomposer("retail"),
        builder.verifier("retail"),
        builder.strict_user(),
        builder.judge(attempts=1),
        builder.llm("generator"),
    ]


def test_one_model_shared_by_seven_roles_loads_once(tiny_model_dir: Path,
                                                     model_loads: list[str]) -> None:
    builder = Builder(_recipe(tiny_model_dir))
    components = _build_every_component(builder)
    assert model_loads == [str(tiny_model_dir)]
    backends = {id(builder.llm(role)) for role in ROLES}
    assert len(backends) == 1
    assert components[0].llm is components[2].llm is builder.llm("generator")
    builder.close()


def test_the_smoke_recipe_loads_its_one_model_once_for_all_roles(tiny_model_dir: Path,
                                                                  model_loads: list[str]) -> None:
    from prour.recipes import load_recipe

    smoke = Path(__file__).resolve().parents[1] / "recipes" / "smoke.yaml"
    roles = list(load_recipe(smoke).models)
    recipe = load_recipe(smoke, [f"models.{role}.path={tiny_model_dir}" for role in roles])
    builder = Builder(recipe)
    assert len({id(builder.llm(role)) for role in roles}) == 1
    assert len(roles) == 9 and model_loads == [str(tiny_model_dir)]
    builder.close()


def test_a_role_with_another_dtype_loads_its_own_copy(tiny_model_dir: Path,
                                                       model_loads: list[str]) -> None:
    builder = Builder(_recipe(tiny_model_dir, verifier={"dtype": "bfloat16"}))
    _build_every_component(builder)
    assert model_loads == [str(tiny_model_dir)] * 2
    assert builder.llm("verifier") is not builder.llm("agent")
    assert builder.llm("strict_user") is builder.llm("agent")
    builder.close()


def test_a_role_with_another_path_loads_its_own_copy(tiny_model_dir: Path, tmp_path: Path,
                                                      model_loads: list[str]) -> None:
    import shutil

    copy = shutil.copytree(tiny_model_dir, tmp_path / "copy")
    builder = Builder(_recipe(tiny_model_dir, judge={"path": str(copy)}))
    _build_every_component(builder)
    assert sorted(model_loads) == sorted([str(tiny_model_dir), str(copy)])
    builder.close()


def test_equal_model_configs_share_one_key() -> None:
    one = ModelConfig(backend="hf", path="m", dtype="float32", device="cpu")
    assert instance_key(one) == instance_key(one.model_copy())
    assert instance_key(one) != instance_key(one.model_copy(update={"device": "cuda"}))


def test_metered_views_share_backends_but_not_counters() -> None:
    from prour.eval.agent import CallCounts, CountingLLM
    from prour.llm.scripted import ScriptedLLM

    shared = ScriptedLLM(default="hello")
    builder = Builder(Recipe(name="m"), llms={"agent": shared, "user": shared})
    first, second = CallCounts(), CallCounts()
    one = builder.metered(lambda role, llm: CountingLLM(llm, first, role))
    two = builder.metered(lambda role, llm: CountingLLM(llm, second, role))
    messages = [{"role": "user", "content": "hi"}]
    one.task_agent().act(messages, [])
    one.user_simulator()
    two.task_agent().act(messages, [])
    two.task_agent().act(messages, [])
    assert first.take() == {"agent.chat": 1} and second.take() == {"agent.chat": 2}
    assert shared.calls["chat"] == 3
    assert one.shared_llm("agent") is two.shared_llm("user") is shared


def test_a_missing_role_names_its_key() -> None:
    with pytest.raises(ValueError, match="models.verifier is not in the recipe"):
        Builder(Recipe(name="none")).verifier("retail")
