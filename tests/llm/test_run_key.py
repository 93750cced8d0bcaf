"""The run's API key file (prour.llm.run_key) and how a served role's client picks it up."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from prour.cluster.endpoints import apply_endpoints
from prour.config import Recipe
from prour.llm.openai import request_key
from prour.llm.run_key import RunKeyError, ensure_run_key, read_run_key


def test_the_key_is_made_once_and_only_its_owner_reads_it(tmp_path: Path) -> None:
    path = ensure_run_key(tmp_path / "run")
    assert path == tmp_path / "run" / "secrets" / "api-key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    key = read_run_key(path)
    assert len(key) >= 32
    assert ensure_run_key(tmp_path / "run") == path and read_run_key(path) == key  # kept
    assert read_run_key(ensure_run_key(tmp_path / "other")) != key  # one key per run
    assert [p.name for p in path.parent.iterdir()] == ["api-key"]  # no temporary file left


def test_an_empty_key_file_is_an_error_naming_it(tmp_path: Path) -> None:
    path = ensure_run_key(tmp_path)
    path.write_text("\n")
    with pytest.raises(RunKeyError, match=f"{path} is empty"):
        ensure_run_key(tmp_path)


def test_a_role_served_from_the_endpoints_file_sends_the_run_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "from-the-environment")
    key_file = ensure_run_key(tmp_path)
    recipe = Recipe.model_validate({
        "name": "k",
        "run_dir": str(tmp_path),
        "models": {
            "user": {"backend": "openai", "model": "tiny"},
            "judge": {"backend": "openai", "model": "hosted", "base_url": "http://elsewhere/v1"},
        },
    })
    record = {"servers": {"tiny": {"base_url": "http://10.0.0.1:8000/v1"}},
              "key_file": str(key_file)}
    served = apply_endpoints(recipe, record)
    user, judge = served.models["user"], served.models["judge"]
    assert (user.base_url, user.api_key_file) == ("http://10.0.0.1:8000/v1", str(key_file))
    assert request_key(user.api_key_env, user.api_key_file) == read_run_key(key_file)
    # a role with its own server keeps its own key
    assert judge.api_key_file is None
    assert request_key(judge.api_key_env, judge.api_key_file) == "from-the-environment"


def test_a_relative_key_file_is_taken_from_the_run_dir(tmp_path: Path) -> None:
    recipe = Recipe.model_validate({
        "name": "k",
        "run_dir": str(tmp_path / "run"),
        "models": {"user": {"backend": "openai", "model": "m", "api_key_file": "keys/user"}},
    })
    assert recipe.models["user"].api_key_file == str(tmp_path / "run" / "keys" / "user")
