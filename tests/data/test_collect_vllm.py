"""``prour collect`` against a real vLLM CPU server (the tiny model as the task agent) that is
killed after two episodes: the collection exits 1 naming the lost server; with the server back
on the same address, a rerun runs the errored episodes again and ends with every key once."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import data_scripts as scripts
import pytest
import yaml

from prour.cluster.vllm_server import VLLMServer, free_port
from prour.data.collect import load_trajectories

SERVED = "tiny"
START_TIMEOUT_S = float(os.environ.get("PROUR_VLLM_START_TIMEOUT", "600"))
# One engine process (as tests/llm serve the tiny model), and tool calling as `prour serve` sets it
# up for the task agent's role (Qwen3's hermes parser).
SERVER_ARGS = ("--distributed-executor-backend", "uni", "--enable-auto-tool-choice",
               "--tool-call-parser", "hermes")
EPISODES = 4  # the third may finish before the kill lands; the fourth cannot


def _servable(tiny_model_dir: Path, folder: Path) -> Path:
    """The tiny model with room for the agent's prompt: retail's policy and tool schemas are ~9k
    tiny-tokenizer tokens, past its 4096 positions (RoPE has no weights: only the limit moves)."""
    shutil.copytree(tiny_model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 16384}))
    return folder


def _recipe(tmp_path: Path, base_url: str) -> Path:
    files = scripts.write_script_files(tmp_path / "scripts")
    models = {role: {"backend": "scripted", "script": str(files[role])}
              for role in ("user", "teacher")}
    models["agent"] = {"backend": "openai", "base_url": base_url, "model": SERVED,
                       "max_retries": 1, "timeout_s": 120}
    recipe = {
        "name": "collect-vllm",
        "run_dir": str(tmp_path / "run"),
        "models": models,
        "env": {"max_steps": 2, "agent_max_tokens": 8},  # the user opens, the agent answers
        "data": {"num_trajectories": EPISODES, "trial_seeds": [0], "max_tasks": EPISODES,
                 "concurrency": 1},
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _collect(recipe: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "prour.cli.main", "collect", "--recipe", str(recipe),
         "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _lines(path: Path) -> list[str]:
    """The complete lines of a JSONL file (none when it does not exist yet)."""
    return path.read_text().split("\n")[:-1] if path.exists() else []


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.full  # two vLLM starts and two collects: ~2 min on two cores
def test_collect_fails_when_its_server_dies_and_a_rerun_retries_the_errored(
        tmp_path: Path, vllm_python: Path, tiny_model_dir: Path) -> None:
    model = _servable(tiny_model_dir, tmp_path / "model")
    port = free_port()

    def server() -> VLLMServer:
        return VLLMServer(model, python=vllm_python, served_name=SERVED, port=port,
                          max_model_len=16384, extra_args=SERVER_ARGS)

    first = server().start(timeout_s=START_TIMEOUT_S)
    recipe, out = _recipe(tmp_path, first.base_url), tmp_path / "run" / "data" / "trajectories.jsonl"
    try:
        proc = _collect(recipe)
        deadline = time.monotonic() + 300
        while len(_lines(out)) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first.pid is not None
        os.killpg(first.pid, signal.SIGKILL)  # the server dies: no goodbye, no more answers
        output = proc.communicate(timeout=300)[0]
    finally:
        first.stop()
    assert proc.returncode == 1, output[-3000:]
    stored = {t.key: t for t in load_trajectories(out, "error")}
    done = [key for key, t in stored.items() if t.termination != "error"]
    errored = [key for key, t in stored.items() if t.termination == "error"]
    assert len(stored) == EPISODES and len(done) >= 2 and errored, [
        t.errors for t in stored.values()]
    error_lines = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and "Traceback" not in output
    assert error_lines[0].startswith(
        f"error: {len(errored)} of {EPISODES} episodes ended in an error")
    assert f"POST {first.base_url}/chat/completions failed after 2 attempt(s)" in error_lines[0]
    kept = {json.loads(line)["task_id"]: line for line in _lines(out)
            if json.loads(line)["termination"] != "error"}

    with server().start(timeout_s=START_TIMEOUT_S):  # the server is back, on the same address
        rerun = _collect(recipe)
        output = rerun.communicate(timeout=300)[0]
    assert rerun.returncode == 0, output[-3000:]
    assert f"{EPISODES} trajectories in {out}" in output and ", 0 errored," in output
    lines = _lines(out)
    records = [json.loads(line) for line in lines]
    assert sorted(r["task_id"] for r in records) == sorted(k[1] for k in stored)  # each key once
    assert all(r["termination"] != "error" for r in records)
    for line in kept.values():  # finished episodes were not run again
        assert line in lines
