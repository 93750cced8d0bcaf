"""`prour serve` against the real vLLM CPU server with the tiny model (needs .venv-vllm).

One test serves the tiny model, reads the endpoints through the recipe as train/eval do, makes a
chat call and stops with SIGINT. One serves the task agent: its tool-calling requests go through
vLLM's hermes tool parser, and a seeded request longer than the CPU build's step budget leaves the
server alive. Another points vLLM at a folder whose config is no model: the command must fail with
vLLM's reason long before the time limit; a folder with no model files at all is refused by
preflight before vLLM starts. (That a failure also stops the other servers is tested with a
stand-in server in test_serve.py.)
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster_helpers import (
    ORDER_TOOL,
    TOOL_CALL,
    TOOL_PROMPT,
    alive,
    tool_calling_model,
    write_recipe,
)

from prour.config import EnvConfig
from prour.env.agents import LLMAgent, TaskView
from prour.llm.base import ChatRequest, SamplingParams
from prour.llm.registry import build_llm
from prour.recipes import load_recipe

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

START_TIMEOUT_S = float(os.environ.get("PROUR_VLLM_START_TIMEOUT", "300"))


def served(model_dir: Path, max_model_len: int = 2048) -> dict:
    return {
        "path": str(model_dir),
        "dtype": "float32",
        "enforce_eager": True,
        "max_model_len": max_model_len,
    }


def recipes(tmp_path: Path, python: Path, serve_models: dict, roles: dict) -> tuple[Path, Path]:
    """The serving recipe, and the same recipe without its serve section (what a stage reads)."""
    base = {
        "name": "vllm-serve",
        "run_dir": str(tmp_path / "run"),
        "models": {
            role: {"backend": "openai", "model": mid, "max_retries": 1, "timeout_s": 60}
            for role, mid in roles.items()
        },
    }
    serving = write_recipe(
        tmp_path / "serving.yaml",
        {
            **base,
            "serve": {
                "python": str(python),
                "startup_timeout_s": START_TIMEOUT_S,
                "models": serve_models,
            },
        },
    )
    return serving, write_recipe(tmp_path / "stage.yaml", base)


def start_serve(recipe: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "prour.cli.main", "serve", "--recipe", str(recipe)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def read_status(path: Path, proc: subprocess.Popen[str], wanted: str, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.is_file():
            record = json.loads(path.read_text())
            if record["status"] == wanted:
                return record
        if proc.poll() is not None:
            raise AssertionError(
                f"prour serve exited early ({proc.returncode}): {proc.stderr.read()}"
            )
        time.sleep(0.5)
    raise AssertionError(f"{path} never said {wanted!r}")


def test_serve_tiny_model_endpoints_chat_and_clean_stop(
    vllm_python: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    serving, stage = recipes(
        tmp_path, vllm_python, {"tiny": served(tiny_model_dir)}, {"user": "tiny", "judge": "tiny"}
    )
    proc = start_serve(serving)
    try:
        record = read_status(
            tmp_path / "run" / "endpoints.json", proc, "ready", START_TIMEOUT_S + 30
        )
        server = record["servers"]["tiny"]
        assert server["roles"] == ["user", "judge"] and server["base_url"].startswith(
            "http://127.0.0.1:"
        )
        resolved = load_recipe(stage, endpoints=True)  # a train/eval stage loading its recipe
        assert resolved.models["user"].base_url == server["base_url"]
        llm = build_llm(resolved.models["user"])
        try:
            request = ChatRequest(
                [{"role": "user", "content": "Where is my order?"}],
                SamplingParams(temperature=0.0, max_tokens=6, seed=0),
            )
            (completions,) = llm.chat([request])
        finally:
            llm.close()
        assert len(completions) == 1 and 1 <= completions[0].completion_tokens <= 6
        assert_the_run_key_guards(record, tmp_path / "run")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "tiny: http://127.0.0.1:" in out
    assert not alive(server["pid"]), f"vLLM pid {server['pid']} survived prour serve"
    assert json.loads((tmp_path / "run" / "endpoints.json").read_text())["status"] == "stopped"
    assert load_recipe(stage, endpoints=True).models["user"].base_url is None


def assert_the_run_key_guards(record: dict, run_dir: Path) -> None:
    """The run's key: a file only its owner reads, kept off every command line; vLLM refuses a
    request without it (HTTP 401) and answers with it, as the role's client above did."""
    import httpx

    key_file = run_dir / "secrets" / "api-key"
    assert record["key_file"] == str(key_file)
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(key_file.parent.stat().st_mode) == 0o700
    key = key_file.read_text().strip()
    assert len(key) >= 32 and key not in json.dumps(record)
    url = record["servers"]["tiny"]["base_url"] + "/models"
    assert httpx.get(url, timeout=10).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer wrong"}, timeout=10).status_code == 401
    answer = httpx.get(url, headers={"Authorization": f"Bearer {key}"}, timeout=10)
    assert answer.status_code == 200 and answer.json()["data"][0]["id"] == "tiny"


def stop_serve(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """SIGINT, then the output; a process that does not stop in a minute is killed."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_agent_tool_calls_through_vllm_parser_and_seeded_long_prompt(
    vllm_python: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The agent's server gets tool calling, hermes and the qwen3 reasoning parser; our agent's
    request comes back with the server's parsed tool call. A seeded prompt longer than the CPU
    build's 2048-token step (vLLM crashed on it with `CPU Generator does not use offset`) is
    answered and the server lives on."""
    model = tool_calling_model(tiny_model_dir, tmp_path / "tool-model")
    serving, stage = recipes(
        tmp_path, vllm_python, {"tiny": served(model, 4096)}, {"agent": "tiny", "judge": "tiny"}
    )
    proc = start_serve(serving)
    try:
        record = read_status(
            tmp_path / "run" / "endpoints.json", proc, "ready", START_TIMEOUT_S + 30
        )
        command = " ".join(record["servers"]["tiny"]["command"])
        for flag in (
            "--enable-auto-tool-choice --tool-call-parser hermes",
            "--reasoning-parser qwen3",
            "--enable-prefix-caching",
            "--no-enable-chunked-prefill --max-num-batched-tokens 4096",
        ):
            assert flag in command, (flag, command)
        llm = build_llm(load_recipe(stage, endpoints=True).models["agent"])
        agent = LLMAgent(llm, EnvConfig(agent_temperature=0.0, agent_max_tokens=48))
        try:
            agent.reset("retail", TaskView("retail", "0", "policy", seed=3))
            turn = agent.act(list(TOOL_PROMPT), [ORDER_TOOL])
            filler = " ".join(f"item{i % 50}" for i in range(900))  # ~2.9k prompt tokens
            long_turn = agent.act([*TOOL_PROMPT, {"role": "user", "content": filler}], [ORDER_TOOL])
        finally:
            llm.close()
        assert [(c.name, c.arguments) for c in turn.tool_calls] == [
            (TOOL_CALL["name"], TOOL_CALL["arguments"])
        ]
        assert turn.tool_calls[0].id.startswith("chatcmpl-tool-")  # parsed by vLLM, not by us
        assert "<tool_call>" not in turn.content
        assert long_turn.meta["prompt_tokens"] > 2048
        assert proc.poll() is None and alive(record["servers"]["tiny"]["pid"], settle_s=0)
    finally:
        _, err = stop_serve(proc)
    assert proc.returncode == 0, err
    assert (
        "CPU Generator does not use offset"
        not in Path(record["servers"]["tiny"]["log"]).read_text()
    )


def test_a_folder_without_model_files_is_refused_before_vllm_starts(
    vllm_python: Path, tmp_path: Path
) -> None:
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    serving, _ = recipes(tmp_path, vllm_python, {"broken": served(empty)}, {"judge": "broken"})
    proc = start_serve(serving)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert err.splitlines() == [
        (f"error: weights: model '{empty}' (serve.models.broken): folder {empty} holds neither "
         "config.json nor tokenizer_config.json; point at the folder that holds the model's files")]
    assert not (tmp_path / "run" / "endpoints.json").exists()


def test_a_model_folder_vllm_cannot_load_fails_fast(vllm_python: Path, tmp_path: Path) -> None:
    """vLLM exits on a folder without a model: `prour serve` reports why, well before the limit."""
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    (empty / "config.json").write_text("{}")  # passes preflight's look; vLLM finds no model in it
    (empty / "model.safetensors").write_bytes(b"")
    serving, _ = recipes(tmp_path, vllm_python, {"broken": served(empty)}, {"judge": "broken"})
    started = time.monotonic()
    proc = start_serve(serving)
    try:
        _, err = proc.communicate(timeout=START_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    elapsed = time.monotonic() - started
    assert proc.returncode == 1
    assert "server 'broken' could not start" in err and "exited with code" in err
    assert str(empty) in err  # vLLM's own reason, from the log tail, names the folder
    record = json.loads((tmp_path / "run" / "endpoints.json").read_text())
    assert record["status"] == "failed" and "broken" in record["error"]
    pid = record["servers"]["broken"]["pid"]
    assert pid is not None and not alive(pid)
    assert elapsed < START_TIMEOUT_S / 2, f"failure took {elapsed:.0f} s to report"
