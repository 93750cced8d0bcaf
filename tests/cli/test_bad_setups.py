"""Setups that used to end in a traceback (issue #23 item 7) end in one line naming the cause and
the fix, and the fix a line prints runs as printed."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prour.cli.main import app

SMOKE = Path(__file__).resolve().parents[2] / "recipes" / "smoke.yaml"


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def one_error(result, code: int, *fragments: str) -> str:
    """Exit ``code`` without a traceback, with exactly one ``error:`` line holding the fragments."""
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, result.output
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.mark.parametrize("value", ["[unclosed", "{a: 1", "it's: [x"])
def test_a_set_value_that_is_not_yaml_names_the_item_and_the_quoting_that_passes(value):
    """The line names the --set item and its key; the quoted form it prints, run as printed,
    loads the text unchanged."""
    item = f"name={value}"
    line = one_error(invoke("validate", str(SMOKE), "--set", item), 2,
                     f"--set {item!r}", "name:", "not valid YAML")
    fix = shlex.split(line.split("quote it: ")[1])
    assert fix[0] == "--set"
    result = invoke("validate", str(SMOKE), *fix)
    assert result.exit_code == 0, result.output
    from prour.recipes import load_recipe

    assert load_recipe(SMOKE, fix[1:]).name == value


# ---- a weights folder with config.json but no weight files -----------------------------------

PAPER = SMOKE.parent / "paper.yaml"


def _weights_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error: weights: ")]


def test_preflight_names_a_model_folder_without_weight_files(tmp_path, monkeypatch):
    """Every model of the paper in a models folder, but the 1.7B with config.json alone and the
    8B's index naming a shard that is not there: one line each (transformers would raise OSError
    at load time); with the files in place preflight has no weights line."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    models = tmp_path / "models"
    for hub_id in ("Qwen/Qwen3-1.7B", "Qwen/Qwen3-8B", "Qwen/Qwen3-32B"):
        (models / hub_id).mkdir(parents=True)
        (models / hub_id / "config.json").write_text("{}")
    (models / "Qwen/Qwen3-32B/model-00001-of-00001.safetensors").write_bytes(b"")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors",
                            "b": "model-00002-of-00002.safetensors"}}
    (models / "Qwen/Qwen3-8B/model.safetensors.index.json").write_text(json.dumps(index))
    (models / "Qwen/Qwen3-8B/model-00001-of-00002.safetensors").write_bytes(b"")
    env = {"PROUR_MODELS_DIR": str(models)}
    result = CliRunner().invoke(app, ["validate", "--preflight", str(PAPER)], env=env)
    assert result.exit_code == 2 and "Traceback" not in result.output
    small, large = sorted(_weights_lines(result.output))
    assert small.startswith("error: weights: model 'Qwen/Qwen3-1.7B' (models.generator.path")
    assert f"folder {models / 'Qwen/Qwen3-1.7B'} holds no weight files" in small
    fix = shlex.split(small.split("download them with `")[1].rstrip("`"))
    assert fix == ["hf", "download", "Qwen/Qwen3-1.7B", "--local-dir",
                   str(models / "Qwen/Qwen3-1.7B")]
    assert large.startswith("error: weights: model 'Qwen/Qwen3-8B' (serve.models.Qwen/Qwen3-8B)")
    assert ("1 of 2 weight shard(s) named by model.safetensors.index.json are missing "
            "(model-00002-of-00002.safetensors)") in large
    (models / "Qwen/Qwen3-1.7B/model.safetensors").write_bytes(b"")
    (models / "Qwen/Qwen3-8B/model-00002-of-00002.safetensors").write_bytes(b"")
    again = CliRunner().invoke(app, ["validate", "--preflight", str(PAPER)], env=env)
    assert _weights_lines(again.output) == [], again.output


def test_a_tokenizer_folder_needs_no_weight_files(tmp_path):
    """extract reads data.tokenizer's tokenizer alone: a folder with tokenizer files passes."""
    from prour.preflight import check_weights
    from prour.recipes import load_recipe

    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text("{}")
    recipe = load_recipe(SMOKE, [f"data.tokenizer={folder}", f"run_dir={tmp_path / 'run'}"])
    assert check_weights(recipe, {"extract": ()}) == []
    (folder / "tokenizer_config.json").unlink()
    assert len(check_weights(recipe, {"extract": ()})) == 1
