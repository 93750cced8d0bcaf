"""Fault cells of ``prour run`` that reach it through its step (tests/faults/matrix.py lists every
cell): the runner carries out its collect step (tests/faults/test_collect_faults.py's scripted
recipe) while the agent's backend fails every request (HTTP 500, a hang past the client's time
limit, a connection closed mid-reply), while the run folder is a read-only or full tmpfs, or
after a kill -9 of the whole process group left a half-written last record. ``prour run`` exits
1 with the step's one error line and its own line naming the step and its log, no traceback and
no lock left; with the fault removed a rerun of ``prour run`` finishes the step with every key
exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_collect_faults import (
    WAIT_S,
    Faulty,
    _out,
    _planned,
    _recipe,
    _served_agent,
    _stored,
    _wait_for_records,
)

from prour.runlock import LOCK_FILE, holder_alive, read_holder

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))  # test_bad_setups' tmpfs
TASKS = 2
STEP = "collect-retail"


def _run(recipe: Path, log: Path) -> subprocess.Popen:
    with open(log, "wb") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "prour.cli.main", "run", "--recipe", str(recipe), "--only",
             STEP], stdout=output, stderr=subprocess.STDOUT, start_new_session=True)


def _clean(log: Path) -> str:
    text = log.read_text()
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    return text


def _no_lock(run: Path) -> None:
    assert not [p for p in run.rglob(LOCK_FILE)], "a run lock was left behind"


def _rerun_completes(recipe: Path, tmp_path: Path, tasks: int = TASKS) -> str:
    log = tmp_path / "rerun.log"
    assert _run(recipe, log).wait(timeout=WAIT_S) == 0, log.read_text()
    assert _stored(_out(recipe)) == _planned(tasks), "a record lost or stored twice"
    _no_lock(recipe.parent / "run")
    return _clean(log)


@pytest.mark.parametrize("kind", ["http-500", pytest.param("timeout", marks=pytest.mark.full),
                                  pytest.param("closed-mid-reply", marks=pytest.mark.full)])
def test_a_failing_backend_fails_the_step_and_the_run_then_a_rerun_completes(tmp_path, kind):
    """The backend fails every request; fixed (the same recipe: the server answers again, as a
    restarted one would), the rerun retries the errored episodes. A recipe changed meanwhile
    would make the step stale instead (its outputs made with other values: the runner says so
    and names ``--rerun-stale``)."""
    server = Faulty(kind, failures=None)
    try:
        recipe = _recipe(tmp_path, tasks=TASKS, **_served_agent(server, retries=1))
        log = tmp_path / "run.log"
        assert _run(recipe, log).wait(timeout=WAIT_S) == 1, log.read_text()
        text = _clean(log)
        errors = [line for line in text.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, text  # the step's own line, once
        assert f"POST {server.url}/chat/completions failed after 2 attempt(s)" in errors[0]
        failed = [line for line in text.splitlines() if line.startswith(f"== {STEP}: failed")]
        assert len(failed) == 1 and "exit code 1" in failed[0], text
        assert str(tmp_path / "run" / "logs" / f"{STEP}.log") in failed[0], failed[0]
        _no_lock(tmp_path / "run")
        assert _stored(_out(recipe)) == _planned(TASKS)  # stored as errored, each once

        server.failures = server.posts  # the fault removed: every later request is answered
        text = _rerun_completes(recipe, tmp_path)
    finally:
        server.close()
    assert "retried: 2 errored episode(s) of an earlier run" in text, text


@pytest.mark.parametrize("fault", ["read-only", pytest.param("full", marks=pytest.mark.full)])
def test_a_read_only_or_full_run_folder_fails_the_run_in_one_line_then_a_rerun_completes(
        tmp_path, fault):
    from test_bad_setups import tmpfs
    from test_stage_faults import _fill

    run = tmp_path / "run"
    with tmpfs(run, "16m"):
        recipe = _recipe(tmp_path, tasks=TASKS)
        if fault == "read-only":
            subprocess.run(["mount", "-o", "remount,ro", str(run)], check=True)
        else:
            filler = _fill(run)
        log = tmp_path / "run.log"
        assert _run(recipe, log).wait(timeout=WAIT_S) == 1, log.read_text()
        text = _clean(log)
        errors = [line for line in text.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, text
        assert f"cannot write {run}" in errors[0], errors[0]
        assert (f"the file system ({run}) is read-only" if fault == "read-only" else
                f"no space left on the device ({run})") in errors[0], errors[0]
        if fault == "read-only":
            subprocess.run(["mount", "-o", "remount,rw", str(run)], check=True)
        else:
            filler.unlink()
        _no_lock(run)
        _rerun_completes(recipe, tmp_path)


def test_a_kill_of_the_run_mid_write_leaves_a_torn_line_that_the_rerun_repairs(tmp_path):
    """SIGKILL to the runner and its step (no handler runs) after the first record, with half a
    record appended as a kill mid-write leaves it: the rerun of ``prour run`` takes the dead
    locks over, the step repairs the line, and every key is stored once."""
    tasks = 4
    recipe = _recipe(tmp_path, tasks=tasks)
    out = _out(recipe)
    proc = _run(recipe, tmp_path / "run.log")
    _wait_for_records(proc, out)
    step = read_holder(out.parent / LOCK_FILE)  # the step, in a session of its own, holds it
    assert step is not None and step.pid != proc.pid
    for group in (proc.pid, step.pid):
        os.killpg(group, signal.SIGKILL)
    proc.wait(timeout=WAIT_S)
    deadline = time.monotonic() + 60
    while holder_alive(step):  # a killed process takes a moment to end: until then its lock holds
        assert time.monotonic() < deadline, f"the step (pid {step.pid}) still runs after SIGKILL"
        time.sleep(0.05)
    kept = out.read_text()
    with open(out, "a") as handle:
        handle.write('{"domain": "retail", "task_id": "9", "seed"')
    assert sum(_stored(out).values()) < tasks, "the kill came after the work was done"
    text = _rerun_completes(recipe, tmp_path, tasks)
    assert out.read_text().startswith(kept)  # what was saved is kept, not run again
    assert "repaired" in text and "torn" in text, text


def test_prour_run_makes_a_parquet_output_that_is_cut_short_again(tmp_path, tiny_model_dir):
    """An extract whose train split was cut short after it finished (a disk fault, a copy): the
    runner sees the file is no readable parquet and says so, runs extract again (its decisions
    are reused: no decomposer call, so its scripted model need not be registered in the child)
    and the split reads; a rerun then has nothing to do."""
    from test_stage_faults import _extracted, _invoke, _prepared

    from prour.data.dataset import read_rows, split_path
    from prour.recipes import load_recipe

    recipe = _prepared("extract", tmp_path, tiny_model_dir)
    assert _invoke("extract", "--recipe", str(recipe), "--no-progress").exit_code == 0
    train = split_path(load_recipe(recipe).data.dataset_dir, "train")
    train.write_bytes(train.read_bytes()[:100])  # cut short
    argv = [sys.executable, "-m", "prour.cli.main", "run", "--recipe", str(recipe), "--only",
            "extract"]
    plan = subprocess.run([*argv, "--dry-run"], check=False, capture_output=True, text=True,
                          timeout=600)
    assert f"{train} not a readable parquet file (cut short?): it runs again" in plan.stdout, (
        plan.stdout + plan.stderr)
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    output = done.stdout + done.stderr
    assert "== extract: start (resumes)" in output, output
    _extracted(tmp_path / "run", output)
    assert len(read_rows(train)) == 2
    again = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "== extract: start" not in again.stdout, again.stdout


@pytest.mark.full  # ~17 s: two trainings (train local's truncated-checkpoint cell is in CI)
def test_a_truncated_final_checkpoint_is_trained_again_by_prour_run(tmp_path, tiny_model_dir):
    """The last checkpoint of a finished train step cut short (a disk fault after the save):
    its file list (checkpoint_files.json) no longer matches, so the step is not done; prour run
    resumes it from the newest complete checkpoint and saves the last step again, each step
    once in metrics.jsonl, every checkpoint loadable."""
    import json

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
    from test_checkpoint import _recipe_file, _weights
    from train_helpers import instance_rows

    from prour.data.dataset import write_rows
    from prour.train import checkpoint as ckpt

    data = write_rows(instance_rows(5), tmp_path / "train.parquet")
    recipe = _recipe_file(tmp_path, "cut", tiny_model_dir, data)
    out = tmp_path / "ckpt" / "cut"
    argv = [sys.executable, "-m", "prour.cli.main", "run", "--recipe", str(recipe), "--only",
            "train"]
    first = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=WAIT_S)
    assert first.returncode == 0, first.stdout + first.stderr
    (weights,) = (out / "step_4").glob("*.safetensors")
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert [s for s, _ in ckpt.complete_checkpoints(out)] == [1, 2, 3]

    rerun = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=WAIT_S)
    output = rerun.stdout + rerun.stderr
    assert rerun.returncode == 0 and "Traceback" not in output, output
    assert "== train: start (resumes): prour train" in output and "--resume" in output, output
    assert [s for s, _ in ckpt.complete_checkpoints(out)] == [1, 2, 3, 4]
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4], steps
    assert _weights(out / "step_4")
    _no_lock(out)
