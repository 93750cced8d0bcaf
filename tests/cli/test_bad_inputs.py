"""Broken setups and bad inputs end in one error line and a non-zero exit, never a traceback
(issue #14 items 5 and 7); Ctrl-C says what was saved and exits 130."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

import data_scripts as scripts
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from prour.cli.main import app
from prour.data.dataset import write_rows
from prour.data.schema import ROW_SCHEMA

CLI_PAGE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"  # the commands' page


@pytest.fixture(autouse=True)
def _no_models_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROUR_MODELS_DIR", raising=False)


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error: ")]


def assert_one_error(result, code: int, *fragments: str) -> str:
    """Exit ``code``, no traceback, exactly one ``error:`` line holding every fragment."""
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    lines = error_lines(result.output)
    assert len(lines) == 1, result.output
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def write_recipe(tmp_path: Path, **sections) -> Path:
    scripted = scripts.write_script_files(tmp_path / "scripts")
    models = {role: {"backend": "scripted", "script": str(path)} for role, path in scripted.items()}
    models.update(sections.pop("models", {}))
    recipe = {"name": "bad", "run_dir": str(tmp_path / "run"), "models": models,
              "env": {"max_steps": 12}, **sections}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


# ---- data stats ----------------------------------------------------------------------------


@pytest.mark.parametrize("content, reason", [
    (b"PAR1 this is not parquet", "Parquet magic bytes not found"),
    (b"", "Parquet file size is 0 bytes"),
])
def test_data_stats_on_a_corrupt_or_empty_file(tmp_path, content, reason):
    (tmp_path / "train.parquet").write_bytes(content)
    assert_one_error(invoke("data", "stats", str(tmp_path)), 1,
                     f"{tmp_path / 'train.parquet'}: not a readable parquet file", reason,
                     "rerun `prour extract`")


def test_data_stats_on_a_dataset_without_rows(tmp_path):
    pq.write_table(pa.Table.from_pylist([], schema=ROW_SCHEMA), tmp_path / "train.parquet")
    assert_one_error(invoke("data", "stats", str(tmp_path)), 1, "train.parquet holds no rows")


# ---- a nonexistent model path --------------------------------------------------------------


def test_collect_with_a_nonexistent_agent_path_stops_before_any_episode(tmp_path):
    recipe = write_recipe(tmp_path, models={"agent": {"backend": "hf", "path": "/no/such/model"}})
    started = time.monotonic()
    result = invoke("collect", "--recipe", str(recipe), "--no-progress")
    assert time.monotonic() - started < 10
    assert_one_error(result, 2, "weights: model '/no/such/model' (models.agent.path)",
                     "looked in /no/such/model", "fix the path")
    assert not (tmp_path / "run" / "data" / "trajectories.jsonl").exists()


def test_train_with_a_nonexistent_policy_path_stops_before_any_step(tmp_path):
    train_file = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([], schema=ROW_SCHEMA), train_file)
    recipe = write_recipe(
        tmp_path,
        models={"generator": {"backend": "hf", "path": "Org/NoSuchModel-1B"},
                "strict_user": {"backend": "scripted", "script": str(tmp_path / "scripts" /
                                                                      "user.yaml")},
                "verifier": {"backend": "scripted", "script": str(tmp_path / "scripts" /
                                                                   "user.yaml")}},
        train={"backend": "local", "train_file": str(train_file), "val_file": None,
               "output_dir": str(tmp_path / "ckpt")})
    line = assert_one_error(invoke("train", "--recipe", str(recipe)), 2,
                            "'Org/NoSuchModel-1B' (models.generator.path) has no local weights",
                            "hf download Org/NoSuchModel-1B")
    assert "models_dir" in line and not (tmp_path / "ckpt" / "metrics.jsonl").exists()


# ---- eval: setup-wide failures fail before the first episode --------------------------------


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("agent, fragments", [
    ({"backend": "openai", "model": "Qwen/Qwen3-8B", "base_url": "http://127.0.0.1:{port}/v1"},
     ["endpoint: models.agent: http://127.0.0.1:{port}/v1/models is unreachable"]),
    ({"backend": "openai", "model": "Qwen/Qwen3-8B"},
     ["models.agent (Qwen/Qwen3-8B) has no base_url", "endpoints.json does not exist"]),
    ({"backend": "hf", "path": "{tmp}/missing-model"},
     ["weights: model '{tmp}/missing-model' (models.agent.path)"]),
])
def test_eval_with_a_broken_setup_exits_non_zero_naming_the_cause(tmp_path, agent, fragments):
    port = _closed_port()
    fill = lambda text: text.format(port=port, tmp=tmp_path)
    agent = {key: fill(value) for key, value in agent.items()}
    recipe = write_recipe(tmp_path, models={"agent": agent},
                          eval={"methods": ["base"], "domains": ["retail"], "max_tasks": 1,
                                "seeds": [0]})
    result = invoke("eval", "--recipe", str(recipe), "--no-progress")
    assert_one_error(result, 2, *map(fill, fragments))
    assert not (tmp_path / "run" / "eval" / "episodes.jsonl").exists()


# ---- the verl backend without its extras ------------------------------------------------------


def test_the_verl_backend_without_the_gpu_extra(tmp_path, monkeypatch, tiny_model_dir):
    from prour import preflight

    real = preflight.module_available
    monkeypatch.setattr(preflight, "module_available",
                        lambda name, python=None: name != "verl" and (
                            name in ("vllm", "ray", "transfer_queue") or real(name, python)))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    train_file = tmp_path / "train.parquet"
    write_rows([], train_file)  # readable (preflight reads a parquet input's footer), no rows
    user = str(tmp_path / "scripts" / "user.yaml")
    recipe = write_recipe(
        tmp_path,
        models={"generator": {"backend": "hf", "path": str(tiny_model_dir)},
                "strict_user": {"backend": "scripted", "script": user},
                "verifier": {"backend": "scripted", "script": user}},
        train={"backend": "verl", "train_file": str(train_file), "val_file": None,
               "output_dir": str(tmp_path / "ckpt")})
    assert_one_error(invoke("train", "--recipe", str(recipe)), 2,
                     "extra: `verl` is not importable (train.backend=verl)",
                     "pip install -e '.[gpu]'")


# ---- train export when verl's merger fails --------------------------------------------------


def test_train_export_when_the_merge_fails(tmp_path):
    actor = tmp_path / "ckpt" / "global_step_3" / "actor"
    actor.mkdir(parents=True)
    (actor / "model_world_size_1_rank_0.pt").write_bytes(b"not a torch file")
    recipe = write_recipe(tmp_path, train={"backend": "verl", "output_dir": str(tmp_path / "ckpt")},
                          models={"generator": {"backend": "hf", "path": "Qwen/Qwen3-1.7B"}})
    assert_one_error(invoke("train", "export", "--recipe", str(recipe)), 2,
                     f"merging {actor} into a Hugging Face folder failed (verl.model_merger exit")
    assert not (tmp_path / "ckpt" / "step_3").exists()


# ---- Ctrl-C -----------------------------------------------------------------------------------


def _interrupt_once(path: Path, timeout_s: float = 120.0) -> threading.Thread:
    """SIGINT this process (as Ctrl-C does) once ``path`` holds a line."""
    def watch() -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if path.is_file() and path.read_text().strip():
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.01)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_ctrl_c_during_eval_says_what_was_saved_and_exits_130(tmp_path):
    recipe = write_recipe(tmp_path, eval={"methods": ["oracle"], "domains": ["retail"],
                                          "split": "base", "seeds": [0], "concurrency": 1})
    episodes = tmp_path / "run" / "eval" / "episodes.jsonl"
    _interrupt_once(episodes)
    result = invoke("eval", "--recipe", str(recipe), "--no-progress")
    assert result.exit_code == 130, result.output
    saved = len(episodes.read_text().splitlines())
    assert 0 < saved < 114  # stopped part-way through retail's 114 base tasks
    assert f"interrupted: {saved} episodes saved in {episodes}; rerun the same `prour eval`" \
        in result.output
    assert not (tmp_path / "run" / "eval" / ".prour.lock").exists()  # the lock is released


def test_the_docs_method_example_parses(tmp_path):
    text = CLI_PAGE.read_text()
    assert "--method base,prour" in text and "--method base prour" not in text
    recipe = write_recipe(tmp_path, eval={"domains": ["retail"], "max_tasks": 1, "seeds": [0]})
    result = invoke("eval", "--recipe", str(recipe), "--method", "base,prour", "--no-progress")
    # Both methods are read (no usage error); prour stops in preflight on its missing roles.
    assert result.exit_code == 2 and "No such option" not in result.output
    assert "error: models: models.generator is not in the recipe; `prour eval` needs it" in \
        result.output


def test_ctrl_c_during_collect_says_what_was_saved_and_exits_130(tmp_path):
    recipe = write_recipe(tmp_path, data={"split": "base", "num_trajectories": 100,
                                          "concurrency": 1, "teacher": False})
    trajectories = tmp_path / "run" / "data" / "trajectories.jsonl"
    _interrupt_once(trajectories)
    result = invoke("collect", "--recipe", str(recipe), "--no-progress")
    assert result.exit_code == 130, result.output
    saved = len(trajectories.read_text().splitlines())
    assert 0 < saved < 100
    assert (f"interrupted: {saved} trajectories saved in {trajectories}; rerun `prour collect` "
            "with the same recipe") in result.output


def test_an_interrupted_training_names_its_newest_checkpoint(tmp_path):
    from prour.cli.train_run import saved_checkpoint
    from prour.train.checkpoint import STATE_FILE

    assert saved_checkpoint(tmp_path, "local") == (
        f"no checkpoint saved yet in {tmp_path} (train.save_every); a rerun starts over")
    for step in (1, 2):
        (tmp_path / f"step_{step}").mkdir()
        (tmp_path / f"step_{step}" / STATE_FILE).write_bytes(b"")
    (tmp_path / "step_3").mkdir()  # unfinished: no trainer state
    assert saved_checkpoint(tmp_path, "local").startswith(
        f"newest checkpoint {tmp_path / 'step_2'}, metrics in {tmp_path / 'metrics.jsonl'}; "
        "rerun with --resume")
    (tmp_path / "global_step_4" / "actor").mkdir(parents=True)
    assert saved_checkpoint(tmp_path, "verl").startswith(
        f"newest checkpoint {tmp_path / 'global_step_4'}")
