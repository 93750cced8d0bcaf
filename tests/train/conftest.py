"""Fixtures of the training tests: one torch thread, a format-aware tiny policy, run folders."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from train_helpers import warm_start


@pytest.fixture(autouse=True)
def one_thread():
    """Two threads on a shared 2-core machine run ten times slower than one; tests use one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def format_policy_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model after the demo's warm start on one prompt: emits the answer format some of
    the time. Not the session's ``warm_tiny_model``: that one asks a well-formed question in none
    of 24 samples on this prompt, so the format-reward test would have nothing to reinforce."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return warm_start(tiny_model_dir, tmp_path_factory.mktemp("format_policy"))
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def fresh_dir(tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.rmtree(out, ignore_errors=True)
    return out
