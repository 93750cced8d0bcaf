"""Fault cells of ``prour run`` (tests/faults/matrix.py lists every cell): the runner carries out
its collect step (tests/faults/test_collect_faults.py's scripted recipe, 6 tasks) and a signal
reaches the whole process group, as Ctrl-C in a terminal sends SIGINT and Slurm sends SIGTERM
(twice, 1.5 s apart) to every process of a job. The runner and its step each report once, exit
130, no lock is left, and a rerun of ``prour run`` finishes the step with every key once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_collect_faults import WAIT_S, _out, _planned, _recipe, _stored, _wait_for_records

from prour.interrupt import INTERRUPTED_EXIT
from prour.runlock import LOCK_FILE

TASKS = 6  # enough left to stop after the first (a scripted episode takes ~0.5 s)


def _run(recipe: Path, log: Path, **env: str) -> subprocess.Popen:
    with open(log, "wb") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "prour.cli.main", "run", "--recipe", str(recipe), "--only",
             "collect-retail"], stdout=output, stderr=subprocess.STDOUT,
            env={**os.environ, **env}, start_new_session=True)


@pytest.mark.full  # ~40 s each on 2 shared cores (runner, step, then the rerun)
@pytest.mark.parametrize("how", ["ctrl-c", "slurm"])
def test_a_signal_to_the_process_group_mid_step_reports_once_and_a_rerun_completes(tmp_path,
                                                                                   how):
    recipe = _recipe(tmp_path, tasks=TASKS)
    out, log = _out(recipe), tmp_path / "run.log"
    proc = _run(recipe, log, **({"SLURM_JOB_ID": "4242"} if how == "slurm" else {}))
    _wait_for_records(proc, out)
    signum = signal.SIGINT if how == "ctrl-c" else signal.SIGTERM
    os.killpg(proc.pid, signum)
    if how == "slurm":
        time.sleep(1.5)
        if proc.poll() is None:
            os.killpg(proc.pid, signum)
    assert proc.wait(timeout=WAIT_S) == INTERRUPTED_EXIT, log.read_text()
    text = log.read_text()
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    saved = _stored(out)
    step = [line for line in text.splitlines() if line.startswith("interrupted: ")
            and "trajectories saved" in line]
    report = (f"interrupted: {sum(saved.values())} trajectories saved in {out}; rerun `prour "
              "collect` with the same recipe to collect only the missing ones; released the "
              f"lock {out.parent / LOCK_FILE}; exit 130")
    assert step == [report], text
    assert [line for line in text.splitlines()
            if line.startswith("interrupted: 0 step(s) finished in this run")], text
    assert "stopped at once" not in text, text
    assert not (out.parent / LOCK_FILE).exists()
    assert max(saved.values()) == 1 and sum(saved.values()) < TASKS

    rerun_log = tmp_path / "rerun.log"
    rerun = _run(recipe, rerun_log)
    assert rerun.wait(timeout=WAIT_S) == 0, rerun_log.read_text()
    assert "Traceback" not in rerun_log.read_text()
    assert _stored(out) == _planned(TASKS)  # every key once: none lost, none twice
    assert not (out.parent / LOCK_FILE).exists()
