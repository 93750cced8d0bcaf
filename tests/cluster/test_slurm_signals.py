"""``scancel`` of a running collect job on the local Slurm: the job's log says what was saved, the
run lock is gone, and a resubmission collects exactly the missing trajectories (by key)."""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import write_recipe
from test_slurm_local import SMALL, prour, status_of, wait_done

from prour.runlock import LOCK_FILE, Holder

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

TASKS = 3
WAIT_S = 240.0


def _recipe(tmp_path: Path, tiny_model_dir: Path) -> Path:
    # the retail policy and tool schemas alone are ~9k tiny-tokenizer tokens
    model = {"backend": "hf", "path": str(tiny_model_dir), "device": "cpu", "dtype": "float32",
             "max_model_len": 16384}
    return write_recipe(tmp_path / "recipe.yaml", {
        "name": "scancel",
        "run_dir": str(tmp_path / "run"),
        "models": {"agent": model, "user": model},
        "env": {"max_steps": 2, "agent_max_tokens": 16, "user_max_tokens": 16},
        "data": {"max_tasks": TASKS, "num_trajectories": TASKS, "trial_seeds": [0],
                 "concurrency": 1, "teacher": False},
    })


def _submit(cluster: Any, recipe: Path) -> str:
    sets = [part for item in SMALL for part in ("--set", item)]
    done = prour(cluster, "slurm", "submit", "--recipe", str(recipe), "--stages", "collect",
                 *sets)
    assert done.returncode == 0, done.stdout + done.stderr
    manifest = json.loads((recipe.parent / "run" / "slurm_jobs.json").read_text())
    (job,) = [entry["job_id"] for entry in manifest["stages"]]
    return job


def _keys(path: Path) -> Counter[tuple[str, int]]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return Counter((row["task_id"], row["seed"]) for row in rows)


def _job_log(run_dir: Path, job: str) -> str:
    (log,) = (run_dir / "slurm" / "logs").glob(f"*-{job}.out")
    return log.read_text()


def test_scancel_of_a_collect_job_saves_and_the_resubmission_does_only_the_missing_work(
    slurm_cluster: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from prour.env.domains import select_tasks

    recipe = _recipe(tmp_path, tiny_model_dir)
    run_dir = tmp_path / "run"
    out = run_dir / "data" / "trajectories.jsonl"
    job = _submit(slurm_cluster, recipe)
    deadline = time.monotonic() + WAIT_S
    while not (out.is_file() and out.read_text().strip()):
        assert time.monotonic() < deadline, f"job {job} saved no trajectory in {WAIT_S:g} s"
        time.sleep(0.2)
    subprocess.run(["scancel", job], env=slurm_cluster.env(), check=True, timeout=30)
    wait_done(slurm_cluster, {"stages": [{"job_id": job}], "run_dir": str(run_dir)},
              timeout_s=WAIT_S)

    saved = out.read_text().splitlines()
    log = _job_log(run_dir, job)
    assert "SIGTERM received: stopping;" in log, log
    assert (f"interrupted: {len(saved)} trajectories saved in {out}; rerun `prour collect` with "
            f"the same recipe to collect only the missing ones; released the lock "
            f"{out.parent / LOCK_FILE}") in log, log
    assert "Traceback" not in log
    assert not (out.parent / LOCK_FILE).exists()
    status = status_of(run_dir, "collect")
    assert status.get("rc") == "130", f"{status}\n{log}"  # the job shell outlived prour
    assert len(saved) < TASKS, "the job ended before scancel: nothing was tested"

    # as if the cancelled job had run on a node that died before it could release its lock: the
    # resubmission finds that job ended (squeue) and takes the lock over
    left = Holder(pid=4242, host="node-that-died", command="prour collect", since="then", job=job)
    (out.parent / LOCK_FILE).write_text(json.dumps(asdict(left)))
    again = _submit(slurm_cluster, recipe)
    wait_done(slurm_cluster, {"stages": [{"job_id": again}], "run_dir": str(run_dir)},
              timeout_s=WAIT_S)
    expected = {(task.id, 0) for task in select_tasks("retail", "train", max_tasks=TASKS)}
    assert _keys(out) == Counter(dict.fromkeys(expected, 1)), _job_log(run_dir, again)
    assert out.read_text().splitlines()[: len(saved)] == saved
    assert f"taking over the lock of {out.parent} from a dead process" in _job_log(run_dir, again)
