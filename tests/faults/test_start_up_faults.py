"""The SIGINT-at-start-up cell of every long command but collect's and report's (which have their
own; tests/faults/matrix.py lists every cell): the installed ``prour`` script on recipes/smoke.yaml
gets a SIGINT once prour's handler is in place, while the command still imports and loads. It
ends with exit 130 and the one line saying it stopped before any work, no traceback, no
KeyboardInterrupt, and no run lock or output left in its run folder."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from installed_prour import prour_argv

from prour.interrupt import INTERRUPTED_EXIT

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "recipes" / "smoke.yaml"
REHEARSAL = ROOT / "recipes" / "rehearsal.yaml"
COMMANDS = {  # the matrix's command: prour's argv after the recipe
    "normalize": ("normalize",),
    "calibrate": ("calibrate", "--stage", "label"),
    "extract": ("extract", "--no-progress"),
    "train local": ("train", "--backend", "local"),
    "train verl rehearsal": ("train",),
    "eval": ("eval", "--no-progress"),
    "prour run": ("run",),
}


def _handles(pid: int, signum: int) -> bool:
    """Whether ``pid`` has a handler for ``signum`` (SigCgt in /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


@pytest.mark.parametrize("command", list(COMMANDS))
def test_ctrl_c_during_start_up_is_one_line_without_a_traceback(tmp_path, command):
    recipe = REHEARSAL if command == "train verl rehearsal" else SMOKE
    run = tmp_path / "run"
    first, *rest = COMMANDS[command]
    proc = subprocess.Popen(  # the installed script, as a user starts it
        prour_argv(first, "--recipe", str(recipe), *rest, "--set", f"run_dir={run}"),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    # ours sets SIGTERM's (Python has a SIGINT handler of its own from its first instant)
    while not _handles(proc.pid, signal.SIGTERM):
        assert proc.poll() is None and time.monotonic() < deadline, "no handler in place"
        time.sleep(0.01)
    # into the command's own imports (typer, the stage's modules); prour run imports little (its
    # steps are child processes) and is in its runner 0.3 s on, whose stop the collect-step
    # cell covers (tests/faults/test_run_faults.py), so it gets the signal at once
    time.sleep(0.0 if command == "prour run" else 0.3)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == INTERRUPTED_EXIT, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    ours = [line for line in stderr.splitlines() if "SIGINT" in line]
    assert ours == ["SIGINT received during start-up: stopped before any work began; exit 130"]
    assert not run.exists() or not any(run.rglob("*")), sorted(run.rglob("*"))
