"""What a Slurm submission is made of: the request, the jobs planned for it, and the gate it
stops at (shared by the planning in :mod:`prour.cluster.slurm` and the submitting and status
reading in :mod:`prour.cluster.jobs`; nothing else imported here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class StagePlan:
    """One job to submit: its rendered script, where it logs, and what it waits for."""

    stage: str
    template: str
    script_path: Path
    script: str
    log_pattern: str  # sbatch --output pattern (%j)
    status_path: Path
    dependency: str | None = None  # "afterok" on the previous stage, filled at plan time
    after: str | None = None  # the stage it depends on
    command: list[str] = field(default_factory=list)  # the `prour` arguments the job runs
    notes: list[str] = field(default_factory=list)


@dataclass
class SubmitRequest:
    """What the user asked for: recipe file, stages (None: the chain), run folder, overrides,
    checkpoint, whether the labels are approved, the untrained generator evaluated, and stale
    steps rerun."""

    recipe_path: Path
    stages: list[str] | None
    run_dir: Path
    overrides: list[str]
    workdir: Path
    checkpoint: str | None = None
    approve_labels: bool = False
    base_model: bool = False
    rerun_stale: bool = False


@dataclass
class Submission:
    """The jobs of one submission in order; ``gate``: the chain stops at the review gate and this
    is the command that approves the labels and submits the rest."""

    plans: list[StagePlan]
    gate: str | None = None
