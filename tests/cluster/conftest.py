"""Fixtures for the cluster tests: a stand-in vLLM "python" and a local single-node Slurm."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import FAKE_VLLM


@pytest.fixture
def fake_vllm_python(tmp_path: Path) -> Path:
    """An executable that behaves like the vLLM server command for start/health/stop purposes."""
    script = tmp_path / "fake-vllm-python"
    script.write_text(FAKE_VLLM.format(python=sys.executable))
    script.chmod(0o755)
    return script


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A single-node Slurm started for the session (installed with apt-get when missing, as root).

    Skips where Slurm cannot be had (not root, no apt) unless PROUR_REQUIRE_SLURM=1, which fails.
    """
    from prour.cluster.local import LocalSlurm, SlurmUnavailable

    try:
        cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"))
        cluster.ensure_installed()
        cluster.start()
    except SlurmUnavailable as exc:
        if os.environ.get("PROUR_REQUIRE_SLURM") == "1":
            pytest.fail(f"Slurm is required (PROUR_REQUIRE_SLURM=1) but unavailable: {exc}")
        pytest.skip(f"local Slurm unavailable: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()
