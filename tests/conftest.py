"""Shared fixtures: the tiny local model (built once per session) and the vLLM venv."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """One torch thread: the tiny model's matmuls are far slower with two threads on two cores."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a base dependency
        return
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-init Qwen3 with a local BPE tokenizer and Qwen-style chat template."""
    from prour.demo.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """Python of the vLLM CPU venv; skips (or fails under PROUR_REQUIRE_VLLM=1) when missing."""
    candidate = Path(
        os.environ.get("PROUR_VLLM_PYTHON")
        or Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"
    )
    if not candidate.exists():
        message = f"vLLM venv not found at {candidate} (run `make vllm-env`)"
        if os.environ.get("PROUR_REQUIRE_VLLM") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return candidate
