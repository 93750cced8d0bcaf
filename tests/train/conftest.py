"""Fixtures of the training tests: one torch thread, a format-aware tiny policy, run folders."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Two threads on a shared 2-core machine run ten times slower than one; tests use one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)



@pytest.fixture
def fresh_dir(tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.rmtree(out, ignore_errors=True)
    return out
