"""SIGINT and SIGTERM (:mod:`prour.interrupt`) in real ``prour collect`` processes (the tiny model
in process) and in a small program that holds a known number of requests in flight."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from prour.interrupt import INTERRUPTED_EXIT, SAME_SIGNAL_S
from prour.runlock import LOCK_FILE

TASKS = 3
WAIT_S = 300.0


def _recipe(tmp_path: Path, tiny_model_dir: Path) -> Path:
    # the retail policy and tool schemas alone are ~9k tiny-tokenizer tokens
    model = {"backend": "hf", "path": str(tiny_model_dir), "device": "cpu", "dtype": "float32",
             "max_model_len": 16384}
    recipe = {
        "name": "signals",
        "run_dir": str(tmp_path / "run"),
        "models": {"agent": model, "user": model},
        "env": {"max_steps": 2, "agent_max_tokens": 16, "user_max_tokens": 16},
        "data": {"max_tasks": TASKS, "num_trajectories": TASKS, "trial_seeds": [0],
                 "concurrency": 1, "teacher": False},
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _collect(recipe: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "prour.cli.main", "collect", "--recipe", str(recipe),
             "--no-progress"], stdout=subprocess.DEVNULL, stderr=stderr)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _wait_until(condition, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"the command ended (exit {proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no {what} within {WAIT_S:g} s")
        time.sleep(0.1)


def _handles(pid: int, signum: int) -> bool:
    """Whether ``pid`` has a handler for ``signum`` (SigCgt in /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def _keys(path: Path) -> Counter[tuple[str, int]]:
    return Counter((json.loads(line)["task_id"], json.loads(line)["seed"]) for line in _lines(path))


@pytest.fixture
def recipe(tmp_path: Path, tiny_model_dir: Path) -> Path:
    return _recipe(tmp_path, tiny_model_dir)


def test_sigterm_saves_releases_the_lock_exits_130_and_a_rerun_completes(recipe: Path) -> None:
    from prour.env.domains import select_tasks

    out = recipe.parent / "run" / "data" / "trajectories.jsonl"
    log = recipe.parent / "collect.log"
    proc = _collect(recipe, log)
    _wait_until(lambda: len(_lines(out)) >= 1, proc, "first trajectory")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=WAIT_S) == INTERRUPTED_EXIT
    saved = _lines(out)
    stderr = log.read_text()
    assert "Traceback" not in stderr
    assert "SIGTERM received: stopping;" in stderr
    assert (f"interrupted: {len(saved)} trajectories saved in {out}; rerun `prour collect` with "
            "the same recipe to collect only the missing ones; released the lock "
            f"{out.parent / LOCK_FILE}; exit 130") in stderr
    assert not (out.parent / LOCK_FILE).exists()
    assert len(saved) < TASKS, "the signal came after the work was done: nothing was tested"

    rerun = _collect(recipe, recipe.parent / "rerun.log")
    assert rerun.wait(timeout=WAIT_S) == 0, (recipe.parent / "rerun.log").read_text()
    expected = {(task.id, 0) for task in select_tasks("retail", "train", max_tasks=TASKS)}
    assert _keys(out) == Counter(dict.fromkeys(expected, 1))  # every key once: none lost, none twice
    assert _lines(out)[: len(saved)] == saved  # the saved ones were kept, not run again


def test_prour_run_passes_sigterm_on_to_its_step_and_prints_the_steps_report(recipe: Path):
    """The runner's step (its own session) gets the signal through the runner only; the runner
    waits for its report, copies it to its own output and exits 130."""
    out = recipe.parent / "run" / "data" / "trajectories.jsonl"
    log = recipe.parent / "run.log"
    with open(log, "wb") as output:
        proc = subprocess.Popen(
            [sys.executable, "-m", "prour.cli.main", "run", "--recipe", str(recipe), "--only",
             "collect-retail"], stdout=output, stderr=subprocess.STDOUT)
    _wait_until(lambda: len(_lines(out)) >= 1, proc, "first trajectory")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=WAIT_S) == INTERRUPTED_EXIT
    text = log.read_text()
    saved = len(_lines(out))
    assert "SIGTERM received: stopping; waiting for 1 child process(es) to stop: prour collect" \
        in text, text
    assert f"interrupted: {saved} trajectories saved in {out}; rerun `prour collect`" in text
    assert "interrupted: 0 step(s) finished in this run" in text and "Traceback" not in text
    assert not (out.parent / LOCK_FILE).exists()
    assert saved < TASKS


def test_ctrl_c_during_start_up_is_one_line_without_a_traceback(recipe: Path) -> None:
    log = recipe.parent / "collect.log"
    proc = _collect(recipe, log)
    # our handler is in place (the CLI's first import) while tau2, torch and the model still load
    _wait_until(lambda: _handles(proc.pid, signal.SIGTERM), proc, "signal handler")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=WAIT_S) == INTERRUPTED_EXIT
    stderr = log.read_text()
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    ours = [line for line in stderr.splitlines() if "SIGINT" in line]
    assert ours == ["SIGINT received during start-up: stopped before any work began; exit 130"]
    assert not (recipe.parent / "run" / "data" / LOCK_FILE).exists()


HOLDER = textwrap.dedent("""
    import sys, threading
    from prour import interrupt

    interrupt.install()
    release = threading.Event()
    entered = threading.Barrier({n} + 1)

    def request():
        with interrupt.request():
            entered.wait()
            release.wait()  # a request that never ends on its own

    threads = [threading.Thread(target=request) for _ in range({n})]
    with interrupt.interruptible(lambda: "7 rows saved in rows.jsonl; rerun to resume"):
        for thread in threads:
            thread.start()
        entered.wait()
        print("ready", flush=True)
        for thread in threads:
            thread.join()
""")


def test_the_first_sigint_names_the_requests_in_flight_and_a_second_stops_at_once(tmp_path):
    n = 3
    log = tmp_path / "holder.log"
    with open(log, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", HOLDER.format(n=n)], stdout=subprocess.PIPE,
                                stderr=stderr, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    proc.send_signal(signal.SIGINT)
    _wait_until(lambda: "stopping" in log.read_text(), proc, "first message")
    assert (f"SIGINT received: stopping; waiting for {n} request(s) in flight; send it again "
            "(or Ctrl-C) to stop at once") in log.read_text()
    time.sleep(0.5)
    assert proc.poll() is None  # still waiting for the requests, as it said
    proc.send_signal(signal.SIGINT)  # within SAME_SIGNAL_S: the same stop, delivered twice
    time.sleep(SAME_SIGNAL_S)
    assert proc.poll() is None
    second = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == INTERRUPTED_EXIT
    assert time.monotonic() - second < 2.0
    assert ("stopped at once (SIGTERM again): 7 rows saved in rows.jsonl; rerun to resume; "
            "exit 130") in log.read_text()



@pytest.mark.parametrize("in_slurm", [True, False])
def test_inside_a_slurm_job_a_repeated_sigterm_is_slurms_own_and_a_sigint_stops_at_once(
    monkeypatch: pytest.MonkeyPatch, in_slurm: bool
) -> None:
    """Slurm signals every process of a job, sometimes twice seconds apart on a busy node: inside
    a job a second SIGTERM does not cut the save short; outside one, and for Ctrl-C, it does."""
    from prour import interrupt

    stops: list[str] = []
    clock = iter([100.0, 100.0 + 3 * SAME_SIGNAL_S, 100.0 + 6 * SAME_SIGNAL_S])
    monkeypatch.setattr(interrupt, "_state", interrupt._State())
    monkeypatch.setattr(interrupt, "_stop_at_once", stops.append)
    monkeypatch.setattr(interrupt, "_send_children", lambda signum: None)
    monkeypatch.setattr(interrupt, "_say", lambda text: None)
    monkeypatch.setattr(interrupt.time, "monotonic", lambda: next(clock))
    if in_slurm:
        monkeypatch.setenv("SLURM_JOB_ID", "4242")
    else:
        monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    stop = threading.Event()
    interrupt._state.phases.append(interrupt._Phase(lambda: "saved", stop))
    interrupt._on_signal(signal.SIGTERM, None)
    assert stop.is_set() and not stops
    interrupt._on_signal(signal.SIGTERM, None)  # past the same-signal window
    assert stops == ([] if in_slurm else ["SIGTERM"])
    interrupt._on_signal(signal.SIGINT, None)
    assert stops[-1:] == ["SIGINT"]
