"""Built model folders that are reused: a marker file records what built a folder.

The tiny model and the warm start both write a standard Hugging Face folder plus a JSON marker of
the arguments that built it. A folder whose marker records the same arguments is reused as it is;
a new build is written into a staging folder next to the target and moved into place, so a
half-written folder is never seen and a concurrent builder of the same arguments is kept.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

BuildArgs = dict[str, Any]


def read_marker(folder: Path, marker: str) -> dict[str, Any] | None:
    """The JSON marker ``folder/marker``, or None when the folder holds none (or a torn one)."""
    try:
        return json.loads((folder / marker).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def built_with(folder: Path, marker: str, args: BuildArgs, key: str | None) -> bool:
    """Whether the folder's marker records ``args`` (under ``key``, or as the whole marker)."""
    found = read_marker(folder, marker)
    if found is None:
        return False
    return (found.get(key) if key is not None else found) == args


def refuse_non_folder(out_dir: Path, what: str) -> None:
    """A FileExistsError when ``out_dir`` (or a folder above it) is a file: a build would fail
    half-way there, so it is refused before anything is written."""
    for path in (out_dir, *out_dir.parents):
        if path.exists() and not path.is_dir():
            raise FileExistsError(f"{path} is a file, not a folder; pick a new or empty folder "
                                  f"for the {what}")
        if path.exists():
            return


def build_folder(
    out_dir: Path,
    marker: str,
    args: BuildArgs,
    write: Callable[[Path], None],
    what: str,
    key: str | None = None,
) -> Path:
    """``out_dir`` built by ``write(staging)`` unless it already holds a build of ``args``.

    ``write`` must leave the marker in the staging folder. A non-empty folder without the marker
    is never overwritten (``what`` names the build in that error).
    """
    refuse_non_folder(out_dir, what)
    if built_with(out_dir, marker, args, key):
        return out_dir
    if out_dir.exists() and any(out_dir.iterdir()) and read_marker(out_dir, marker) is None:
        raise FileExistsError(
            f"{out_dir} is not empty and holds no {what} ({marker} missing); "
            "pick an empty or new folder"
        )
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        write(staging)
        _publish(staging, out_dir, marker, args, key)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def _publish(staging: Path, out_dir: Path, marker: str, args: BuildArgs, key: str | None) -> None:
    """Move the finished build into place; a concurrent builder that won the race is kept."""
    if out_dir.exists():
        if built_with(out_dir, marker, args, key):
            return
        shutil.rmtree(out_dir)
    try:
        os.rename(staging, out_dir)
    except OSError:
        if not built_with(out_dir, marker, args, key):
            raise


def save_quietly(model: Any, folder: Path) -> None:
    """``model.save_pretrained(folder)`` without transformers' progress bars."""
    from transformers.utils import logging as hf_logging

    bars_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(folder)
    finally:
        if bars_on:
            hf_logging.enable_progress_bar()
