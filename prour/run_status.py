"""The recipe behind a run folder, for ``prour status``: the ``.prour/run.json`` that ``prour run``
writes (:data:`prour.runner.RUN_RECORD`), else the ``slurm_jobs.json`` of ``prour slurm
submit``."""

from __future__ import annotations

import json
from pathlib import Path

from prour.runner import RUN_RECORD, RunError


def status_recipe(run_dir: Path) -> tuple[str, list[str]]:
    """The recipe path and ``--set`` items a run folder was made with: ``.prour/run.json`` of
    ``prour run``, else ``slurm_jobs.json`` of ``prour slurm submit``."""
    record_path = run_dir / ".prour" / RUN_RECORD
    if record_path.is_file():
        record = json.loads(record_path.read_text())
        return record["recipe"], [*record.get("overrides", []), f"run_dir={record['run_dir']}"]
    from prour.cluster.jobs import load_manifest

    try:
        manifest = load_manifest(run_dir)
    except (FileNotFoundError, ValueError):
        raise RunError(f"{run_dir} has neither {record_path} nor slurm_jobs.json: not a run "
                       "folder of `prour run` or `prour slurm submit` (or give the recipe: "
                       "prour run --recipe RECIPE --dry-run)") from None
    return manifest["recipe"], [*manifest.get("overrides", []),
                                f"run_dir={manifest['run_dir']}"]
