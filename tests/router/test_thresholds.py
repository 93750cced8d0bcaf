"""Thresholds stored per decomposer model, with provenance; clear errors when one is missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prour.config import ModelConfig
from prour.router import (
    RouterConfig,
    ThresholdsNotFound,
    calibrate,
    load_thresholds,
    save_thresholds,
)
from prour.router.thresholds import decomposer_model_id, router_thresholds, thresholds_path


def test_save_and_load_per_model(tmp_path: Path) -> None:
    path = tmp_path / "thresholds.json"
    first = calibrate([0.05, 0.10, 0.50], [0.05, 0.50, 0.00], ["act", "verify", "clarify"])
    second = calibrate([0.05, 0.40, 0.70], [0.05, 0.50, 0.00], ["act", "verify", "clarify"])
    save_thresholds(path, "hf:qwen3-8b", first, dataset="dev.jsonl")
    save_thresholds(path, "hf:glm-4-32b", second, dataset="dev.jsonl")
    a, b = load_thresholds(path, "hf:qwen3-8b"), load_thresholds(path, "hf:glm-4-32b")
    assert (a.tau_au, a.tau_eu) == (0.11, 0.06)
    assert (b.tau_au, b.tau_eu) == (0.41, 0.06)
    assert a.dataset == "dev.jsonl" and a.macro_f1 == 1.0 and a.date and a.n_states == 3
    assert set(json.loads(path.read_text())) == {"hf:qwen3-8b", "hf:glm-4-32b"}


def test_missing_model_and_missing_file_name_both(tmp_path: Path) -> None:
    path = tmp_path / "thresholds.json"
    with pytest.raises(ThresholdsNotFound, match=r"does not exist.*'hf:x'"):
        load_thresholds(path, "hf:x")
    save_thresholds(path, "hf:a", calibrate([0.5], [0.0], ["clarify"]), dataset="d")
    with pytest.raises(
        ThresholdsNotFound, match=r"'hf:x' in .*thresholds.json \(models there: hf:a\)"
    ):
        load_thresholds(path, "hf:x")


def test_router_config_reads_thresholds_for_its_model(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    model = ModelConfig(backend="hf", path="/models/tiny")
    model_id = decomposer_model_id(model)
    assert model_id == "hf:/models/tiny"
    save_thresholds(path, model_id, calibrate([0.05, 0.5], [0.05, 0.0], ["act", "clarify"]), "d")
    assert router_thresholds(RouterConfig(thresholds_file=str(path)), model_id) == (0.06, 0.06)
    explicit = RouterConfig(tau_au=0.3, tau_eu=0.1, thresholds_file=str(path))
    assert router_thresholds(explicit, model_id) == (0.3, 0.1)
    with pytest.raises(ValueError, match="no thresholds"):
        router_thresholds(RouterConfig(), model_id)


def test_built_decomposer_reads_the_thresholds_of_its_model(tmp_path: Path) -> None:
    from prour.build import Builder
    from prour.config import Recipe
    from prour.llm.scripted import ScriptedLLM

    path = tmp_path / "t.json"
    save_thresholds(
        path, "openai:qwen3-8b", calibrate([0.3, 0.0], [0.0, 0.0], ["clarify", "act"]), "d"
    )

    def decomposer_of(served: str):
        model = ModelConfig(backend="openai", base_url="http://127.0.0.1:1/v1", model=served)
        recipe = Recipe(name="t", models={"decomposer": model},
                        router=RouterConfig(thresholds_file=str(path)))
        return Builder(recipe, {"decomposer": ScriptedLLM()}).decomposer("retail")

    decomposer = decomposer_of("qwen3-8b")
    assert decomposer.thresholds == (0.01, 0.01)  # act needs EU < τ_EU, so τ_EU > 0
    assert "get_order_details" in decomposer.catalog.names
    with pytest.raises(ThresholdsNotFound, match="glm-4-32b"):
        decomposer_of("glm-4-32b")


def test_stages_read_the_thresholds_where_calibrate_writes_them(tmp_path: Path) -> None:
    """Without router.thresholds_file a routing stage reads <run_dir>/calibration/thresholds.json
    (calibrate's default output); while it is missing, the stage's error is one line naming the
    file, the decomposer model and the fix."""
    from prour.build import Builder
    from prour.config import Recipe
    from prour.llm.scripted import ScriptedLLM

    model = ModelConfig(backend="openai", base_url="http://127.0.0.1:1/v1", model="qwen3-8b")
    recipe = Recipe(name="t", run_dir=str(tmp_path / "run"), models={"decomposer": model})
    with pytest.raises(ValueError) as info:  # ThresholdsNotFound is a ValueError too
        Builder(recipe, {"decomposer": ScriptedLLM()}).thresholds()
    message = str(info.value)
    assert "\n" not in message and "run `prour calibrate`" in message
    assert str(tmp_path / "run" / "calibration" / "thresholds.json") in message
    assert "'openai:qwen3-8b'" in message
    fit = calibrate([0.3, 0.0], [0.0, 0.0], ["clarify", "act"])
    save_thresholds(thresholds_path(recipe), "openai:qwen3-8b", fit, "d")
    assert Builder(recipe, {"decomposer": ScriptedLLM()}).thresholds() == (0.01, 0.01)
