"""``scancel`` of a train job on the local Slurm whose trainer is verl's CPU rehearsal on Ray
(``train.verl.engine: cpu_rehearsal``, one node): Slurm's SIGTERM reaches every process of the
job at once, the Ray driver (``prour train``) and its runner as well as Ray's own processes and
the policy rank's actor. The job still ends as a SIGTERM to the driver alone ends it: exit 130
recorded by the job, one line naming the newest checkpoint, no traceback, every run lock freed,
no Ray process of the job left; and the resubmission resumes after that checkpoint and saves
every step exactly once (nothing lost, nothing repeated).

Real Slurm and Ray (root, as the other Slurm cells); ``full``: two rehearsals on Ray take minutes
on 2 cores."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import alive
from test_multinode_train import job_log, prepare, ranks, sets, submit, wait_job
from test_slurm_local import status_of

from prour.runlock import LOCK_FILE, read_holder
from prour.train import checkpoint as ckpt

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.full]

STEPS = 6  # a few seconds each: the job is cancelled after the first
WAIT_S = 420.0


def _overrides(run_dir: Path, model: Path) -> list[str]:
    one_node = [item for item in sets(run_dir, model, steps=STEPS)
                if not item.startswith("train.verl.nnodes=")]
    return [*one_node, "train.verl.nnodes=1", "train.save_every=1"]


def _ended(*pids: int, within_s: float = 60.0) -> None:
    """Every pid gone within ``within_s``: a Ray worker whose raylet the SIGTERM ended leaves on
    its own a few seconds after it notices (Slurm's process tracking here, linuxproc, loses a
    process whose parent died, so Slurm itself does not end it)."""
    deadline = time.monotonic() + within_s
    while [pid for pid in pids if alive(pid, settle_s=0)]:
        assert time.monotonic() < deadline, [pid for pid in pids if alive(pid, settle_s=0)]
        time.sleep(0.5)


def _steps(out: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_scancel_reaching_the_ray_workers_and_the_driver_exits_130_and_the_resubmission_resumes(
        slurm_cluster: Any, tiny_model_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    out = run_dir / "checkpoints"
    prepare(run_dir)
    overrides = _overrides(run_dir, tiny_model_dir)
    job = submit(slurm_cluster, run_dir, overrides)
    log_path = job_log(run_dir, job)
    deadline = time.monotonic() + WAIT_S
    while ckpt.latest_checkpoint(out) is None:  # step 1 saved: Ray and its actor are up
        assert time.monotonic() < deadline, (log_path.read_text() if log_path.exists()
                                             else "no job log")
        time.sleep(0.2)
    log = log_path.read_text()
    (rank,) = ranks(log).values()  # the policy rank: an actor in a Ray worker process
    driver = read_holder(out / LOCK_FILE)  # `prour train`, the Ray driver, holds its output
    subprocess.run(["scancel", job], env=slurm_cluster.env(), check=True, timeout=30)
    assert driver is not None and rank[2] != driver.pid
    assert wait_job(slurm_cluster, job, WAIT_S) == "CANCELLED"
    log = log_path.read_text()

    assert status_of(run_dir, "train").get("rc") == "130", log[-6000:]
    assert "Traceback" not in log and "died during step" not in log, log[-6000:]
    saved = [step for step, _ in ckpt.complete_checkpoints(out)]
    assert saved and max(saved) < STEPS, (saved, log[-3000:])
    reports = [line for line in log.splitlines() if line.startswith("interrupted: newest")]
    expected = (f"interrupted: newest checkpoint {out / f'step_{max(saved)}'}, metrics in "
                f"{out / 'metrics.jsonl'}; rerun with --resume to continue from it; released "
                f"the lock {out / LOCK_FILE}; exit 130")
    assert reports == [expected], log[-6000:]
    assert not list(run_dir.rglob(LOCK_FILE)), "a run lock was left behind"
    _ended(rank[2], driver.pid)

    again = submit(slurm_cluster, run_dir, overrides)
    state = wait_job(slurm_cluster, again, WAIT_S)
    log = job_log(run_dir, again).read_text()
    assert state == "COMPLETED", log[-6000:]
    assert f"[rehearsal] steps {max(saved) + 1}..{STEPS} from {out / f'step_{max(saved)}'}" in log
    assert [step for step, _ in ckpt.complete_checkpoints(out)] == list(range(1, STEPS + 1))
    assert _steps(out) == list(range(1, STEPS + 1))  # each step once: none lost, none twice
