"""The one path rule of a recipe: ``run_dir`` from the working directory, every other relative path
from ``run_dir``, model names left alone; and the one line for checkpoints in the old place."""

from __future__ import annotations

from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

import pytest
import yaml
from pydantic import BaseModel
from typer.testing import CliRunner

from prour.config import PATH_KEYS, Recipe
from prour.recipes import load_recipe
from prour.train.checkpoint import STATE_FILE, old_checkpoints

REPO = Path(__file__).resolve().parents[1]
# String keys that hold something other than a path of the run, each with its reason.
NOT_PATHS = {
    "models.*.path": "a hub id or a model folder (prour/llm/weights.py looks it up)",
    "serve.models.*.path": "a hub id or a model folder, as models.*.path",
    "data.tokenizer": "a tokenizer name: a hub id or a model folder",
    "models.*.script": "a registered script name or a rules file (tests only)",
    "serve.python": "a program, which may be a bare name found on PATH",
}


def write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def unit(tmp_path: Path, **extra) -> Path:
    data = {"name": "unit", "run_dir": "runs/${name}",
            "models": {"generator": {"backend": "hf", "path": "Qwen/Qwen3-1.7B"}}, **extra}
    return write(tmp_path / "unit.yaml", data)


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory of its own (run_dir is relative to it)."""
    folder = tmp_path / "work"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


def test_run_dir_is_taken_from_the_working_directory(here: Path) -> None:
    recipe = load_recipe(unit(here))
    assert recipe.run_dir == str(here / "runs" / "unit")
    assert recipe.resolved_run_dir() == here / "runs" / "unit"


def test_a_relative_dataset_path_is_taken_from_run_dir(here: Path) -> None:
    recipe = load_recipe(unit(here, data={"trajectories": "collected/t.jsonl"}),
                         ["data.dataset_dir=sets/${name}"])
    run = here / "runs" / "unit"
    assert recipe.data.trajectories == str(run / "collected" / "t.jsonl")
    assert recipe.data.dataset_dir == str(run / "sets" / "unit")
    assert recipe.data.goals == str(run / "data" / "goals.jsonl")  # a default is a path too


def test_train_output_dir_defaults_to_the_runs_checkpoints_folder(here: Path) -> None:
    recipe = load_recipe(unit(here, train={"backend": "local"}))
    assert recipe.train.output_dir == str(here / "runs" / "unit" / "checkpoints")
    assert recipe.train.train_file == str(here / "runs" / "unit" / "data/dataset/train.parquet")


def test_calibration_states_and_thresholds_are_taken_from_run_dir(here: Path) -> None:
    router = {"calibration": {"dev_states": "calibration/dev.jsonl", "out_dir": "cal"},
              "thresholds_file": "cal/thresholds.json"}
    recipe = load_recipe(unit(here, router=router))
    run = here / "runs" / "unit"
    assert recipe.router.calibration.dev_states == str(run / "calibration" / "dev.jsonl")
    assert recipe.router.calibration.test_states is None  # unset stays unset
    assert recipe.router.calibration.out_dir == str(run / "cal")
    assert recipe.router.thresholds_file == str(run / "cal" / "thresholds.json")


def test_the_paper_recipes_keep_their_calibration_states_in_the_paper_run(here: Path) -> None:
    states = here / "runs" / "paper" / "calibration"
    for name in ("paper", "paper-attention"):  # one set of labelled states for both runs
        calibration = load_recipe(REPO / "recipes" / f"{name}.yaml").router.calibration
        assert (calibration.dev_states, calibration.test_states) == (
            str(states / "dev_states.jsonl"), str(states / "test_states.jsonl"))
    assert load_recipe(REPO / "recipes" / "paper-attention.yaml").train.output_dir == str(
        here / "runs" / "paper-attention" / "checkpoints")


def test_absolute_paths_stay_as_they_are(here: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "shared"
    recipe = load_recipe(unit(here, run_dir=str(tmp_path / "r"), train={
        "output_dir": str(elsewhere / "ckpt"), "train_file": str(elsewhere / "train.parquet")}))
    assert recipe.run_dir == str(tmp_path / "r")
    assert recipe.train.output_dir == str(elsewhere / "ckpt")
    assert recipe.train.train_file == str(elsewhere / "train.parquet")
    assert recipe.data.goals == str(tmp_path / "r" / "data" / "goals.jsonl")


def test_model_ids_and_tokenizer_names_are_not_paths(here: Path) -> None:
    models = {"generator": {"backend": "hf", "path": "Qwen/Qwen3-1.7B"},
              "agent": {"backend": "hf", "path": "runs/smoke/tiny-model"},
              "user": {"backend": "openai", "model": "Qwen/Qwen3-8B"}}
    serve = {"models": {"Qwen/Qwen3-8B": {"path": "weights/Qwen3-8B"}}}
    recipe = load_recipe(unit(here, models=models, serve=serve,
                              data={"tokenizer": "Qwen/Qwen3-1.7B"}))
    assert recipe.models["generator"].path == "Qwen/Qwen3-1.7B"
    assert recipe.models["agent"].path == "runs/smoke/tiny-model"  # weights.py: from the cwd
    assert recipe.models["user"].model == "Qwen/Qwen3-8B"
    assert recipe.serve.models["Qwen/Qwen3-8B"].path == "weights/Qwen3-8B"
    assert recipe.data.tokenizer == "Qwen/Qwen3-1.7B"


def test_a_resolved_recipe_reads_back_the_same_from_another_folder(
        here: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = load_recipe(unit(here, train={"backend": "local"}))
    resolved = write(here / "recipe.resolved.yaml", recipe.model_dump(mode="json"))
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.chdir(other)
    assert load_recipe(resolved).model_dump() == recipe.model_dump()


def _string_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Dotted keys of every string field of a section (``*`` for a mapping's entries)."""
    return list(dict.fromkeys(key for name, field in model.model_fields.items()
                              for key in _keys_of(field.annotation, f"{prefix}{name}")))


def _keys_of(annotation: Any, key: str) -> list[str]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _string_keys(annotation, f"{key}.")
    if get_origin(annotation) is dict:
        return _keys_of(get_args(annotation)[1], f"{key}.*")
    if get_origin(annotation) in (Union, UnionType):
        return [k for arg in get_args(annotation) for k in _keys_of(arg, key)]
    return [key] if annotation is str else []


def test_every_key_that_holds_a_path_follows_the_rule() -> None:
    """A string key named like a file or folder is in PATH_KEYS or listed with its reason."""
    looks_like_path = [k for k in _string_keys(Recipe) if k != "run_dir" and any(
        k.endswith(end) for end in ("_dir", "_file", "_states", ".path", ".script", ".python",
                                    ".tokenizer", "trajectories", "goals", "decisions"))]
    assert sorted(looks_like_path) == sorted([*PATH_KEYS, *NOT_PATHS])


# ---- checkpoints where an older prour put them ----------------------------------------------


def _saved_step(folder: Path, name: str) -> None:
    (folder / name).mkdir(parents=True)
    (folder / name / STATE_FILE).write_bytes(b"")


def test_checkpoints_in_the_old_place_are_named_in_one_line(here: Path) -> None:
    recipe = load_recipe(unit(here, train={"backend": "local", "device": "cpu"}))
    old = here / "checkpoints" / "unit"
    assert old_checkpoints(recipe.train.output_dir, recipe.run_dir, "unit") is None
    _saved_step(old, "step_2")
    line = old_checkpoints(recipe.train.output_dir, recipe.run_dir, "unit")
    new = here / "runs" / "unit" / "checkpoints"
    assert line is not None and "\n" not in line
    assert str(old) in line and f"mkdir -p {new.parent} && mv {old} {new}" in line
    assert f"train.output_dir={old}" in line
    _saved_step(new, "step_1")  # the run's own folder has checkpoints: nothing to say
    assert old_checkpoints(recipe.train.output_dir, recipe.run_dir, "unit") is None


def test_a_verl_run_in_the_old_place_of_an_explicit_output_dir_is_found(here: Path) -> None:
    recipe = load_recipe(unit(here, train={"output_dir": "ckpt/${name}"}))
    old = here / "ckpt" / "unit"  # the same relative path, taken from the working directory
    (old / "global_step_100").mkdir(parents=True)
    line = old_checkpoints(recipe.train.output_dir, recipe.run_dir, "unit")
    assert line is not None and str(old) in line
    assert str(here / "runs" / "unit" / "ckpt" / "unit") in line


def test_prour_train_stops_with_the_line_instead_of_starting_over(here: Path) -> None:
    from prour.cli.main import app

    path = unit(here, train={"backend": "local", "device": "cpu"})
    _saved_step(here / "checkpoints" / "unit", "step_3")
    result = CliRunner().invoke(app, ["train", "--recipe", str(path), "--dry-run"])
    assert result.exit_code == 2
    [line] = [x for x in result.output.splitlines() if x.strip()]
    assert line.startswith("error: the checkpoints of recipe 'unit' are in ") and "mv " in line
    assert not (here / "runs" / "unit" / "checkpoints").exists()
