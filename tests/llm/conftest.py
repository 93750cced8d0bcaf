"""Fixtures for the vLLM-backed tests: one server per test module, stopped by PID at teardown."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from prour.cluster.vllm_server import VLLMServer
    from prour.llm.openai import OpenAILLM

SERVED_NAME = "tiny"
START_TIMEOUT_S = float(os.environ.get("PROUR_VLLM_START_TIMEOUT", "600"))
# One engine process without a separate worker: start-up imports vLLM twice instead of three times.
CPU_ARGS = ("--distributed-executor-backend", "uni")


def pid_alive(pid: int) -> bool:
    """Whether a process with this PID still exists (zombies count as gone once reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def vllm_server(vllm_python: Path, tiny_model_dir: Path) -> Iterator[VLLMServer]:
    """The tiny model served by vLLM on 127.0.0.1 (float32, eager); one per module."""
    from prour.cluster.vllm_server import VLLMServer

    server = VLLMServer(
        tiny_model_dir,
        python=vllm_python,
        served_name=SERVED_NAME,
        max_model_len=2048,
        extra_args=CPU_ARGS,
    )
    server.start(timeout_s=START_TIMEOUT_S)
    pid = server.pid
    try:
        yield server
    finally:
        server.stop()
        if pid is not None and pid_alive(pid):
            raise RuntimeError(f"vLLM server pid {pid} is still alive after stop()")


@pytest.fixture(scope="module")
def openai_llm(vllm_server: VLLMServer) -> Iterator[OpenAILLM]:
    """The ``openai`` backend pointed at the module's vLLM server."""
    from prour.config import ModelConfig
    from prour.llm.registry import build_llm

    llm = build_llm(ModelConfig(backend="openai", base_url=vllm_server.base_url,
                                model=SERVED_NAME, timeout_s=120, max_retries=1))
    try:
        yield llm
    finally:
        llm.close()
