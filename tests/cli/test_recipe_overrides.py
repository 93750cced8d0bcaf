"""Command-line flags are overrides of the one recipe; provenance records the recipe that ran."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from prour.cli.main import app
from prour.cli.recipe import recipe_errors
from prour.provenance import RECIPE_FILE
from prour.recipes import flag_overrides, load_recipe


def _recipe(tmp_path: Path, **sections: object) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"name": "flags", "run_dir": str(tmp_path / "run"),
                                    **sections}))
    return path


def test_flags_become_dotted_overrides_and_unset_flags_are_skipped() -> None:
    flags = {"eval.max_tasks": 3, "eval.methods": ["oracle", "base"], "data.on_bad_line": "skip",
             "eval.concurrency": None}
    assert flag_overrides(flags) == ['eval.max_tasks=3', 'eval.methods=["oracle", "base"]',
                                     'data.on_bad_line="skip"']


def test_a_flag_wins_over_set_and_is_validated_like_the_file(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    path = _recipe(tmp_path, eval={"max_tasks": 5})
    loaded = load_recipe(path, ["eval.max_tasks=4"], flags={"eval.max_tasks": 2})
    assert loaded.eval.max_tasks == 2
    with pytest.raises(typer.Exit) as info, recipe_errors():
        load_recipe(path, [], flags={"eval.max_tasks": 0})
    assert info.value.exit_code == 2
    assert "eval.max_tasks" in capsys.readouterr().err


def test_eval_flags_reach_the_recorded_recipe(tmp_path: Path) -> None:
    path = _recipe(tmp_path, eval={"methods": ["base"], "seeds": [0, 1, 2], "concurrency": 3})
    out = tmp_path / "eval"
    result = CliRunner().invoke(app, ["eval", "--recipe", str(path), "--method", "oracle",
                                      "--domains", "retail", "--max-tasks", "1", "--seeds", "4",
                                      "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    recorded = yaml.safe_load((out / RECIPE_FILE).read_text())
    assert recorded["name"] == "flags"
    assert recorded["eval"]["methods"] == ["oracle"]
    assert recorded["eval"]["domains"] == ["retail"]
    assert recorded["eval"]["max_tasks"] == 1
    assert recorded["eval"]["seeds"] == [4]
    assert recorded["eval"]["concurrency"] == 3  # from the file, untouched by any flag
    assert "oracle: 1 episodes, 1 solved" in result.output
