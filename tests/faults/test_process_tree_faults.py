"""Faults of the process tree (tests/faults/matrix.py lists every cell): ``prour run`` killed by
SIGKILL while its step runs. No handler of the runner runs, and the step, in a session of its
own, gets no signal from a terminal or a process group; the kernel's parent-death signal
(prour/process_tree.py) gives it SIGTERM, so it saves, frees its lock and ends at once, instead of
running on as an orphan beside a rerun. The rerun then finds no process of the first run, takes
the dead runner's lock over and stores every key exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from installed_prour import prour_argv
from test_collect_faults import WAIT_S, _out, _planned, _recipe, _stored, _wait_for_records

from prour.runlock import LOCK_FILE, holder_alive, read_holder

TASKS = 12  # ~0.5 s a scripted episode: the step has seconds of work left when the runner dies
STEP = "collect-retail"
GONE_S = 30.0  # the step's time to save and end after its runner died


def _run(recipe, log):
    with open(log, "wb") as sink:
        return subprocess.Popen(prour_argv("run", "--recipe", str(recipe), "--only", STEP),
                                stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)


def test_kill_minus_nine_of_prour_run_ends_its_step_and_a_rerun_finds_no_orphan(tmp_path):
    recipe = _recipe(tmp_path, tasks=TASKS)
    run, out = tmp_path / "run", _out(recipe)
    runner = _run(recipe, tmp_path / "run.log")
    _wait_for_records(runner, out)
    step = read_holder(out.parent / LOCK_FILE)  # the step holds its folder; the runner, run_dir
    assert step is not None and step.pid != runner.pid, step
    assert read_holder(run / LOCK_FILE).pid == runner.pid
    os.kill(runner.pid, signal.SIGKILL)  # the runner alone: its step is in a session of its own
    runner.wait(timeout=WAIT_S)
    deadline = time.monotonic() + GONE_S
    while holder_alive(step):
        assert time.monotonic() < deadline, f"the step (pid {step.pid}) outlived its runner"
        time.sleep(0.05)
    saved = _stored(out)
    assert sum(saved.values()) < TASKS, "the step finished its work: it was not stopped"
    assert max(saved.values()) == 1
    # SIGTERM, not SIGKILL: the step released its own lock as it stopped
    assert not (out.parent / LOCK_FILE).exists(), read_holder(out.parent / LOCK_FILE)
    left = read_holder(run / LOCK_FILE)  # the killed runner's, its holder dead
    assert left is not None and left.pid == runner.pid and not holder_alive(left)

    log = tmp_path / "rerun.log"
    assert _run(recipe, log).wait(timeout=WAIT_S) == 0, log.read_text()
    text = log.read_text()
    assert "Traceback" not in text, text
    assert f"taking over the lock of {run} from a dead process" in text, text
    assert f"taking over the lock of {out.parent}" not in text, text  # the step freed its own
    assert _stored(out) == _planned(TASKS)  # every key once: none lost, none twice
    assert not list(run.rglob(LOCK_FILE))
