"""The verl backend on an empty train file (extract routed no state to clarify or verify): as the
local trainer does, the initial policy is saved as the final step and the run says what it
lacked, so that the chain's export, eval and report still run."""

from __future__ import annotations

from pathlib import Path

import pytest


def _recipe(tmp_path: Path, model_dir: Path, total_steps: int = 3):
    from prour.config import Recipe
    from prour.data.dataset import write_rows

    data = tmp_path / "run" / "data"
    write_rows([], data / "train.parquet")
    write_rows([], data / "validation.parquet")
    return Recipe.model_validate({
        "name": "paper", "seed": 7, "run_dir": str(tmp_path / "run"),
        "models": {"generator": {"backend": "hf", "path": str(model_dir)}},
        "train": {"backend": "verl", "output_dir": str(tmp_path / "ckpt"),
                  "train_file": str(data / "train.parquet"),
                  "val_file": str(data / "validation.parquet"), "total_steps": total_steps},
    })


def test_verls_dataset_cannot_read_a_train_file_without_rows(tmp_path, tiny_model_dir):
    """Why verl is not launched on it: the dataset verl's trainer builds from the data section
    prour composes (ProurRLDataset, over verl's RLHFDataset) stops in Hugging Face datasets'
    parquet reader on 0 rows; on a GPU node that comes after Ray and the workers have started."""
    from datasets.exceptions import DatasetGenerationError
    from transformers import AutoTokenizer

    from prour.train.verl_backend import compose_verl_config, prepare_verl_run
    from prour.train.verl_ext.dataset import ProurRLDataset

    recipe = _recipe(tmp_path, tiny_model_dir)
    config = compose_verl_config(prepare_verl_run(recipe, recipe.train, write=False).overrides)
    with pytest.raises(DatasetGenerationError):
        ProurRLDataset(recipe.train.train_file, AutoTokenizer.from_pretrained(tiny_model_dir),
                       config.data)


def test_an_empty_train_file_saves_the_initial_policy_as_the_final_step(
        tmp_path, tiny_model_dir, monkeypatch, capsys):
    """`prour train` (verl) does not launch verl: step_3 holds the initial weights file for file,
    global_step_3 says why, the chain reads train and export as done, and `prour train export`
    hands back step_3."""
    import typer

    import prour.train.verl_backend as backend
    from prour.cli.train_verl import run_verl as _run_verl
    from prour.stages import get_step

    launched: list = []
    monkeypatch.setattr(backend, "launch", lambda run: launched.append(run) or 1)
    recipe = _recipe(tmp_path, tiny_model_dir)
    try:
        _run_verl(recipe, recipe.train, dry_run=False, resume=False)
    except typer.Exit as stop:
        assert stop.exit_code == 0, capsys.readouterr()
    assert launched == []
    said = capsys.readouterr().out
    step = tmp_path / "ckpt" / "step_3"
    assert f"lacking: {recipe.train.train_file} holds no training state" in said
    assert str(step) in said and "verl was not launched" in said
    assert (step / "model.safetensors").read_bytes() == \
        (tiny_model_dir / "model.safetensors").read_bytes()  # not one parameter moved
    assert "holds no training state" in (tmp_path / "ckpt" / "global_step_3" /
                                         "untrained.json").read_text()
    assert get_step("train").is_done(recipe) and get_step("export").is_done(recipe)

    from prour.train.verl_backend import export_checkpoint

    command, folder = export_checkpoint(tmp_path / "ckpt")
    assert command == [] and folder == step  # nothing to merge: step_3 is the policy already


def test_the_dry_run_says_verl_would_not_be_launched(tmp_path, tiny_model_dir, capsys):
    from prour.cli.train_verl import run_verl as _run_verl

    recipe = _recipe(tmp_path, tiny_model_dir)
    _run_verl(recipe, recipe.train, dry_run=True, resume=False)
    said = capsys.readouterr().out
    assert "holds no training state" in said and "would save the initial policy" in said
    assert not (tmp_path / "ckpt").exists()
