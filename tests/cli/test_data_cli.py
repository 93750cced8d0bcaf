"""``prour collect | normalize | extract | data stats`` from one recipe, in process."""

from __future__ import annotations

import json
from pathlib import Path

import data_scripts as scripts
import pytest
import yaml
from typer.testing import CliRunner

from prour.cli.main import app
from prour.data.dataset import check_dataset, load_split, split_path
from prour.llm.scripted import ScriptedLLM, register_script


def _recipe(tmp_path: Path, tiny_model_dir: Path) -> Path:
    files = scripts.write_script_files(tmp_path / "scripts")
    register_script("data-test-normalizer", scripts.normalizer_llm)
    register_script("data-test-decomposer", scripts.decomposer_llm)
    register_script("data-test-lossy", lambda: ScriptedLLM(default="I want help."))
    models = {role: {"backend": "scripted", "script": str(files[role])}
              for role in ("agent", "user", "teacher")}
    models["normalizer"] = {"backend": "scripted", "script": "data-test-normalizer"}
    models["decomposer"] = {"backend": "scripted", "script": "data-test-decomposer"}
    recipe = {
        "name": "data-cli",
        "run_dir": str(tmp_path / "run"),
        "models": models,
        "env": {"max_steps": 12},
        "data": {"num_trajectories": 2, "trial_seeds": [0], "max_tasks": 2, "concurrency": 2,
                 "val_ratio": 0.5, "tokenizer": str(tiny_model_dir), "max_prompt_tokens": 700},
        # Paper thresholds; the scripted decomposer is built to route its states around them.
        "router": {"tau_au": scripts.THRESHOLDS[0], "tau_eu": scripts.THRESHOLDS[1]},
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.fixture(scope="module")
def recipe(tmp_path_factory, tiny_model_dir) -> Path:
    return _recipe(tmp_path_factory.mktemp("cli"), tiny_model_dir)


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def test_the_data_stage_from_the_command_line(recipe: Path) -> None:
    run = recipe.parent / "run" / "data"
    result = invoke("collect", "--recipe", str(recipe), "--no-progress")
    assert result.exit_code == 0, result.output
    assert "2 trajectories" in result.output and "2 teacher question(s)" in result.output

    result = invoke("normalize", "--recipe", str(recipe))
    assert result.exit_code == 0 and "2 goals" in result.output and "0 flagged" in result.output

    result = invoke("extract", "--recipe", str(recipe), "--no-progress")
    assert result.exit_code == 0, result.output
    assert "train 2 rows, validation 2 rows" in result.output
    assert check_dataset(run / "dataset") == []
    assert len(load_split(split_path(run / "dataset", "validation"))) == 2

    result = invoke("data", "stats", str(run / "dataset"))
    assert result.exit_code == 0
    assert "| retail | 1 | 1 | 2 |" in result.output and (run / "dataset" / "card.md").is_file()
    provenance = json.loads((run / "dataset" / "provenance.json").read_text())
    assert provenance["stage"] == "extract" and provenance["seed"] == 0
    collected = recipe.parent / "run" / "provenance" / "collect" / "data" / "trajectories.jsonl"
    assert (collected / "recipe.resolved.yaml").is_file()


def test_normalize_reports_flags(recipe: Path) -> None:
    result = invoke("normalize", "--recipe", str(recipe), "--set",
                    "models.normalizer.script=data-test-lossy", "--set", "data.goals=lossy.jsonl")
    assert result.exit_code == 0
    assert "flag retail/0: missing order_id '#W2378156', zip '19122'" in result.output
    assert "2 flagged" in result.output


def test_extract_bad_line_flag(recipe: Path) -> None:
    invoke("collect", "--recipe", str(recipe), "--no-progress")
    traj = recipe.parent / "run" / "data" / "trajectories.jsonl"
    good = traj.read_text()
    try:
        with open(traj, "a") as handle:
            handle.write('{"truncated": \n')
        line = len(good.splitlines()) + 1
        refused = invoke("extract", "--recipe", str(recipe), "--no-progress")
        assert refused.exit_code == 1 and f"{traj}:{line}" in refused.output
        skipped = invoke("extract", "--recipe", str(recipe), "--no-progress",
                         "--on-bad-line", "skip")
        assert skipped.exit_code == 0, skipped.output
        assert f"skipped 1 corrupt line(s): {traj}:{line}" in skipped.output
    finally:
        traj.write_text(good)


def test_config_errors_name_the_key(recipe: Path) -> None:
    result = invoke("extract", "--recipe", str(recipe), "--set", "data.val_ratio=1.5")
    assert result.exit_code == 2 and "data.val_ratio" in result.output
    result = invoke("extract", "--recipe", str(recipe), "--on-bad-line", "ignore")
    assert result.exit_code == 2 and "data.on_bad_line" in result.output
