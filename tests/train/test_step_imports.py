"""The local trainer's DAPO step reads in three prour modules and runs without verl."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

STEP_MODULES = ["prour.core.policy_gradient", "prour.train.layout", "prour.train.step"]
"""The step (:mod:`prour.train.step`), the maths it calls, and the micro-batch layout: all a
reader opens to follow one update from the scored groups to ``optimizer.step()``."""


def loaded_by(module: str) -> list[str]:
    """Every module name ``import <module>`` loads in a fresh interpreter."""
    probe = f"import {module}, sys, json; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd=REPO)
    return json.loads(out.stdout)


def own_modules(names: list[str]) -> list[str]:
    """The prour modules among ``names`` that are not a package's ``__init__``."""
    return [name for name in names if name.split(".")[0] == "prour"
            and not (REPO / name.replace(".", "/") / "__init__.py").is_file()]


def test_the_step_loads_three_prour_modules_and_no_verl() -> None:
    loaded = loaded_by("prour.train.step")
    assert own_modules(loaded) == STEP_MODULES
    assert len(STEP_MODULES) <= 3
    assert [m for m in loaded if m.split(".")[0] == "verl"] == []


def test_the_trainer_loads_no_verl_and_no_builder() -> None:
    """The single-process trainer's module imports neither verl nor the components' builder
    (the CLI hands the reward down)."""
    loaded = loaded_by("prour.train.local")
    assert [m for m in loaded if m.split(".")[0] == "verl"] == []
    assert "prour.build" not in loaded


CORE = ["prour.core.asks", "prour.core.clock", "prour.core.cost", "prour.core.policy_gradient",
        "prour.core.reward"]
STAGES = ("prour.train.", "prour.eval.", "prour.cluster.", "prour.rewards.", "prour.build")


def test_the_core_imports_no_stage_package() -> None:
    loaded = loaded_by(", ".join(CORE))
    assert [m for m in own_modules(loaded) if m.startswith("prour.core.")] == CORE
    assert [m for m in loaded if m.startswith(STAGES)] == []


def test_the_reward_imports_neither_evaluation_nor_training() -> None:
    loaded = loaded_by("prour.rewards.reward")
    assert [m for m in loaded if m.startswith(("prour.eval.", "prour.train."))] == []


def test_own_modules_leaves_out_package_inits() -> None:
    names = ["prour", "prour.core", "prour.train.step", "torch", "verl.utils"]
    assert own_modules(names) == ["prour.train.step"]
