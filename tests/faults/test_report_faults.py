"""Fault cells of ``prour report`` (tests/faults/matrix.py lists every cell): the installed ``prour``
script's ``prour report`` on a hand-written results.jsonl of 8 episodes (2 methods x 2 tasks x 2 seeds).
A torn last line is skipped and named, the 8 complete episodes counted once each; a read-only or
full report folder is one line naming the disk and the fix, and with the fault removed a rerun
writes the report; a SIGINT during start-up stops before any work."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from installed_prour import prour_argv

from prour.interrupt import INTERRUPTED_EXIT

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
from test_bad_setups import tmpfs  # tests/cli: the small-mount helper

METHODS, TASKS, SEEDS = ("prour", "base"), ("t1", "t2"), (0, 1)
EPISODES = len(METHODS) * len(TASKS) * len(SEEDS)


def _line(method: str, task: str, seed: int) -> dict:
    ok = seed == 0
    return {"schema": 1, "key": ["retail", task, seed, method], "method": method,
            "variant": None, "domain": "retail", "task_id": task, "seed": seed,
            "reward": float(ok), "score": float(ok), "success": ok, "termination": "user_stop",
            "error": False, "timeout": False, "unscored": False, "errors": [],
            "steps": {"act": 3, "clarify": 1, "verify": 1}, "records": 9,
            "model_calls": {"agent.chat": 5}, "model_calls_total": 5, "seconds": 10.0,
            "decisions": [], "episode_started_at": "t", "attention": None}


def _write_run(run: Path, torn: bool = False) -> Path:
    lines = [_line(m, t, s) for m in METHODS for t in TASKS for s in SEEDS]
    text = "".join(json.dumps(line) + "\n" for line in lines)
    if torn:  # a crash mid-append leaves half a record without its newline
        text += json.dumps(_line("prour", "t3", 0))[:60]
    run.mkdir(parents=True, exist_ok=True)
    (run / "results.jsonl").write_text(text)
    return run


def _report(run: Path) -> subprocess.CompletedProcess:
    return subprocess.run(prour_argv("report", str(run), "--n-boot", "20"), capture_output=True,
                          text=True, timeout=300, check=False)


def _completes(run: Path) -> str:
    """The report is written, every complete episode counted exactly once."""
    proc = _report(run)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    systems = json.loads((run / "report" / "report.json").read_text())["systems"]
    assert {s["label"]: s["episodes"] for s in systems} == {m: EPISODES // 2 for m in METHODS}
    return proc.stderr


def _one_line(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def test_a_torn_last_line_is_named_and_skipped_and_every_episode_counted_once(tmp_path):
    run = _write_run(tmp_path / "run", torn=True)
    stderr = _completes(run)
    assert f"{run / 'results.jsonl'}:{EPISODES + 1}:" in stderr and "torn" in stderr, stderr


def test_a_read_only_report_folder_is_one_line_then_a_rerun_writes_it(tmp_path):
    mount = tmp_path / "ro"
    with tmpfs(mount, "1m"):
        run = _write_run(mount / "run")
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        proc = _report(run)
        _one_line(proc, f"cannot write {run / 'report'}", f"file system ({mount}) is read-only",
                  "--out DIR")
        subprocess.run(["mount", "-o", "remount,rw", str(mount)], check=True)
        _completes(run)


def test_a_full_disk_is_one_line_naming_the_space_then_a_rerun_writes_the_report(tmp_path):
    mount = tmp_path / "full"
    with tmpfs(mount, "1m"):
        run = _write_run(mount / "run")
        filler = mount / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
        try:
            with pytest.raises(OSError):  # write until the disk refuses
                while True:
                    os.write(fd, b"\0" * 4096)
            os.ftruncate(fd, os.fstat(fd).st_size - 8 * 1024)
        finally:
            os.close(fd)
        proc = _report(run)
        _one_line(proc, "cannot write", f"no space left on the device ({mount})",
                  "free of 1.0 MiB", "--out DIR")
        assert (run / "results.jsonl").read_text().count("\n") == EPISODES  # input untouched
        filler.unlink()
        _completes(run)


def test_ctrl_c_during_report_start_up_is_one_line_without_a_traceback(tmp_path):
    run = _write_run(tmp_path / "run")
    proc = subprocess.Popen(prour_argv("report", str(run)), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not _handles(proc.pid, signal.SIGTERM):  # ours: Python has its own SIGINT one
        assert proc.poll() is None and time.monotonic() < deadline, "no handler in place"
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == INTERRUPTED_EXIT, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    ours = [line for line in stderr.splitlines() if "SIGINT" in line]
    assert ours == ["SIGINT received during start-up: stopped before any work began; exit 130"]
    assert not (run / "report").exists()


def _handles(pid: int, signum: int) -> bool:
    """Whether ``pid`` has a handler for ``signum`` (SigCgt in /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False
