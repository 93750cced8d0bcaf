"""Shared fixtures: the tiny local model (built once per session), its tokenizer, one warm-started
copy of it, the rehearsals' model as `prour tiny-model` builds it, and the vLLM venv. The
session's rules (caches in the temp folder, no skips in CI) are the plugins
tests/session_caches.py and tests/skip_rules.py."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# tests/train/train_helpers.py is imported by tests in several folders (core, faults, cli): its
# folder goes on the path here, not only when pytest happens to collect tests/train first.
sys.path.insert(0, str(Path(__file__).parent / "train"))

# pytester: tests/test_session_setup.py runs pytest on planted tests.
pytest_plugins = ("session_caches", "skip_rules", "pytester")

# The warm start behind `warm_tiny_model`: the demo's own code, shortened (the demo runs 300 steps
# on more tasks). Tests that read its corpus take the values from the folder's prour_warmstart.json.
WARM_START = {"steps": 60, "tasks_per_domain": 2, "row_tokens": 1024}


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
def tiny_tokenizer(tiny_model_dir: Path) -> Any:
    """The tiny model's tokenizer, loaded once; tests only read it."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def warm_tiny_model(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model after the demo's warm start (WARM_START), built once per session: it writes
    the query, tool-call and reply formats some of the time. Tests read the folder and never
    write into it (train into your own output folder)."""
    from prour.demo.warmstart import warm_start

    return warm_start(tiny_model_dir, tmp_path_factory.mktemp("warm") / "model", **WARM_START)


@pytest.fixture(scope="session")
def format_policy_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model after the demo's warm start on one prompt: emits the answer format some of
    the time. Not the session's ``warm_tiny_model``: that one asks a well-formed question in none
    of 24 samples on this prompt, so the format-reward test would have nothing to reinforce."""
    import torch
    from train_helpers import warm_start

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return warm_start(tiny_model_dir, tmp_path_factory.mktemp("format_policy"))
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="session")
def rehearsal_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path], None]:
    """Places the rehearsal recipes' tiny model in a working folder: ``runs/tiny-model`` and
    ``runs/tiny-model-base`` as the installed ``prour tiny-model`` (TINY_MODEL_ARGS) built them
    once for the session. A rehearsal then runs the same command in its folder, which finds them
    built with its arguments and reuses them instead of training them again."""
    import shutil
    import subprocess

    from installed_prour import prour_argv
    from rehearsal_report import TINY_MODEL_ARGS

    once = tmp_path_factory.mktemp("rehearsal-model")
    built = subprocess.run(prour_argv(*TINY_MODEL_ARGS), cwd=once, capture_output=True,
                           text=True, timeout=900, check=False)
    assert built.returncode == 0, built.stdout + built.stderr

    def place(work: Path) -> None:
        for name in ("tiny-model-base", "tiny-model"):
            shutil.copytree(once / "runs" / name, work / "runs" / name)

    return place


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """Python of the vLLM CPU venv; skips (a failure in CI, or under PROUR_REQUIRE_VLLM=1) when
    missing."""
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


@pytest.fixture(scope="session")
def chromium() -> str:
    """Headless Chromium's program (Debian's package, apt-get installed when missing, as root);
    skips where it cannot be had (a failure in CI, where skips fail the run)."""
    from headless_chromium import ChromiumUnavailable, ensure_chromium

    try:
        return ensure_chromium()
    except ChromiumUnavailable as exc:
        pytest.skip(f"headless Chromium unavailable: {exc}")
