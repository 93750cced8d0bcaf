"""Checkpoints of the local trainer: ``<output_dir>/step_N/`` written atomically.

A checkpoint holds the policy in Hugging Face format (weights, config, generation config,
tokenizer) and ``trainer_state.pt`` (optimizer, scheduler, RNG states, data position). It is
assembled in a hidden temporary folder and renamed into place, so a ``step_N`` folder is always
complete; leftovers of a save that was killed are hidden folders that loading ignores.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

logger = logging.getLogger(__name__)

STATE_FILE = "trainer_state.pt"
TEMP_PREFIX = ".tmp-"
STEP_DIR = re.compile(r"^step_(\d+)$")


def step_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / f"step_{step}"


def complete_checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every finished checkpoint, oldest first (temp folders are skipped)."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = STEP_DIR.match(child.name)
        if match and child.is_dir() and (child / STATE_FILE).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest finished checkpoint folder, or None."""
    found = complete_checkpoints(output_dir)
    return found[-1][1] if found else None


def rng_state() -> dict[str, Any]:
    """Every random stream the trainer draws from."""
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    output_dir: str | Path, step: int, model: Any, tokenizer: Any, trainer_state: dict[str, Any]
) -> Path:
    """Write ``step_<step>`` atomically and return it (an older folder of that name is replaced)."""
    root = Path(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}step_{step}-", dir=root))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        torch.save(trainer_state, staging / STATE_FILE)
        _fsync_tree(staging)
        final = step_dir(root, step)
        if final.exists():  # re-saving a step after a resume: move the old one aside first
            old = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}old-step_{step}-", dir=root))
            os.replace(final, old / final.name)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(staging, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.info("checkpoint written: %s", final)
    return final


HF_FILES = ("config.json", "tokenizer_config.json")
HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def export_hf(output_dir: str | Path, step: int | None = None, target: Path | None = None) -> Path:
    """The Hugging Face folder of a finished local checkpoint (newest when ``step`` is None).

    ``step_N`` already is one (weights, config, tokenizer; loaders ignore the trainer state
    beside them), so without ``target`` it is checked and returned; with ``target`` its files
    except the trainer state are copied there. Missing steps or files raise FileNotFoundError.
    """
    found = dict(complete_checkpoints(output_dir))
    if not found:
        raise FileNotFoundError(
            f"no finished checkpoint (step_N with {STATE_FILE}) under {output_dir}; "
            "run `prour train` first"
        )
    step = max(found) if step is None else step
    if step not in found:
        steps = ", ".join(map(str, sorted(found)))
        raise FileNotFoundError(f"no finished step_{step} under {output_dir} (steps: {steps})")
    folder = found[step]
    missing = [name for name in HF_FILES if not (folder / name).is_file()]
    if not any((folder / name).is_file() for name in HF_WEIGHTS):
        missing.append("weights (" + " or ".join(HF_WEIGHTS) + ")")
    if missing:
        raise FileNotFoundError(f"{folder} is not a Hugging Face folder: no {', '.join(missing)}")
    if target is None:
        return folder
    shutil.copytree(folder, target, ignore=shutil.ignore_patterns(STATE_FILE), dirs_exist_ok=True)
    return target


def load_trainer_state(folder: str | Path) -> dict[str, Any]:
    """The trainer state of a finished checkpoint (optimizer, scheduler, RNG, data position)."""
    path = Path(folder) / STATE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{folder} is not a finished checkpoint: {STATE_FILE} is missing")
    return torch.load(path, map_location="cpu", weights_only=False)


def remove_temporaries(output_dir: str | Path) -> list[Path]:
    """Delete hidden leftovers of interrupted saves; returns what was removed."""
    root = Path(output_dir)
    removed = [p for p in root.glob(f"{TEMP_PREFIX}*") if p.is_dir()] if root.is_dir() else []
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
        logger.info("removed an unfinished checkpoint: %s", path)
    return removed


def prune_checkpoints(output_dir: str | Path, keep: int | None) -> None:
    """Keep only the ``keep`` newest finished checkpoints (None: keep all)."""
    if keep is None:
        return
    for _, folder in complete_checkpoints(output_dir)[:-keep]:
        shutil.rmtree(folder, ignore_errors=True)


def _fsync_tree(folder: Path) -> None:
    """Flush every file of ``folder`` to disk before it is renamed into place."""
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
