"""What this node offers a stage: the GPUs its processes may use."""

from __future__ import annotations

import os
import shutil
import subprocess


def visible_gpus() -> int:
    """GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` when set, else ``nvidia-smi -L``."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        ids = [item for item in listed.split(",") if item.strip()]
        return 0 if not ids or ids[0].strip() == "-1" else len(ids)
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines())
