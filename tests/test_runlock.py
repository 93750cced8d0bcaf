"""The run-folder lock: one holder, refusals naming it, dead holders taken over, release always."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from prour import runlock
from prour.runlock import LOCK_FILE, Holder, RunLocked, acquire, read_holder, release, run_lock


def _dead_pid() -> int:
    """The PID of a process that has ended and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _write_lock(folder: Path, holder: Holder) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LOCK_FILE).write_text(json.dumps(asdict(holder)))


def test_the_lock_records_this_process_and_is_released_after_the_block(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/venv/bin/prour", "eval", "--recipe", "my run.yaml"])
    folder = tmp_path / "run"
    with run_lock(folder) as holder:
        stored = json.loads((folder / LOCK_FILE).read_text())
        assert stored["pid"] == os.getpid() == holder.pid
        assert stored["host"] == socket.gethostname()
        assert stored["command"] == "prour eval --recipe 'my run.yaml'"
        assert stored["since"] and stored["started"]  # /proc exists on the test machines
    assert not (folder / LOCK_FILE).exists()


def test_a_live_holder_is_refused_with_its_pid_command_and_start(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        other = Holder(pid=sleeper.pid, host=socket.gethostname(), command="prour eval -r a.yaml",
                       since="2026-12-01T00:10:00+0000", started=runlock._process_start(sleeper.pid))
        _write_lock(tmp_path, other)
        with pytest.raises(RunLocked) as refused:
            acquire(tmp_path)
    finally:
        sleeper.kill()
        sleeper.wait()
    message = str(refused.value)
    assert "\n" not in message
    assert f"pid {sleeper.pid}" in message and "prour eval -r a.yaml" in message
    assert "since 2026-12-01T00:10:00+0000" in message and str(tmp_path) in message
    assert read_holder(tmp_path / LOCK_FILE) == other  # the refusal left the holder's lock alone


def test_a_second_acquire_in_the_same_process_is_refused(tmp_path):
    with run_lock(tmp_path), pytest.raises(RunLocked, match=f"pid {os.getpid()}"):
        acquire(tmp_path)
    assert not (tmp_path / LOCK_FILE).exists()


def test_a_dead_holders_lock_is_taken_over_with_a_log_line(tmp_path, caplog):
    dead = Holder(pid=_dead_pid(), host=socket.gethostname(), command="prour train -r t.yaml",
                  since="2026-12-01T00:00:00+0000")
    _write_lock(tmp_path, dead)
    with caplog.at_level(logging.WARNING, logger="prour.runlock"):
        holder = acquire(tmp_path)
    assert read_holder(tmp_path / LOCK_FILE) == holder and holder.pid == os.getpid()
    assert f"dead process (pid {dead.pid}" in caplog.text and "prour train -r t.yaml" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_FILE]  # nothing set aside left
    release(tmp_path, holder)


def test_a_reused_pid_is_not_the_holder(tmp_path):
    """Our own PID with another process start time: the recorded process has ended."""
    reused = Holder(pid=os.getppid(), host=socket.gethostname(), command="prour collect",
                    since="2026-12-01T00:00:00+0000", started="1")
    _write_lock(tmp_path, reused)
    assert acquire(tmp_path).pid == os.getpid()


def test_a_killed_but_unreaped_holder_is_dead(tmp_path):
    """A holder killed while its parent has not yet waited for it is a zombie: ``kill(pid, 0)``
    still finds the PID and /proc still lists it (state Z) with its start time, yet the process
    runs nothing, so its lock is taken over."""
    import signal
    import time

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = runlock._process_start(child.pid)
        child.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 10
        stat = Path(f"/proc/{child.pid}/stat")
        while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":  # not reaped: no wait()
            assert time.monotonic() < deadline, "the killed child never became a zombie"
            time.sleep(0.01)
        os.kill(child.pid, 0)  # the PID is still there (no ProcessLookupError) ...
        zombie = Holder(pid=child.pid, host=socket.gethostname(), command="prour eval -r z.yaml",
                        since="2026-12-01T00:00:00+0000", started=started)
        assert runlock._process_start(child.pid) == started  # ... with the same start time
        assert not runlock.holder_alive(zombie)
        _write_lock(tmp_path, zombie)
        holder = acquire(tmp_path)
        assert holder.pid == os.getpid() and read_holder(tmp_path / LOCK_FILE) == holder
        release(tmp_path, holder)
    finally:
        child.kill()
        child.wait()


def test_a_torn_lock_is_taken_over(tmp_path):
    torn = tmp_path / LOCK_FILE
    torn.write_text('{"pid": 12')  # killed between create and write
    os.utime(torn, (0, 0))  # long ago: a fresh torn lock may still be being written
    assert acquire(tmp_path).pid == os.getpid()


def test_a_holder_on_another_host_is_refused(tmp_path):
    remote = Holder(pid=_dead_pid(), host="node-elsewhere", command="prour eval",
                    since="2026-12-01T00:00:00+0000")
    _write_lock(tmp_path, remote)
    with pytest.raises(RunLocked, match="on node-elsewhere"):
        acquire(tmp_path)


@pytest.mark.parametrize("error", [ValueError("boom"), KeyboardInterrupt()])
def test_the_lock_is_released_on_an_error_and_on_ctrl_c(tmp_path, error):
    with pytest.raises(type(error)), run_lock(tmp_path):
        assert (tmp_path / LOCK_FILE).exists()
        raise error
    assert not (tmp_path / LOCK_FILE).exists()
    with run_lock(tmp_path):  # free again
        pass


def test_release_leaves_a_lock_taken_over_by_another_process(tmp_path):
    holder = acquire(tmp_path)
    newer = Holder(pid=holder.pid + 1, host=holder.host, command="prour eval", since="later")
    _write_lock(tmp_path, newer)
    release(tmp_path, holder)
    assert read_holder(tmp_path / LOCK_FILE) == newer


def _run_unlock(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "prour.cli.main", "unlock", *args],
                          capture_output=True, text=True, timeout=120, check=False)


def test_a_lock_from_another_host_names_the_unlock_command_which_clears_it(tmp_path):
    folder = tmp_path / "run dir"
    remote = Holder(pid=4242, host="node-elsewhere", command="prour collect -r paper.yaml",
                    since="2026-12-01T00:00:00+0000")
    _write_lock(folder, remote)
    with pytest.raises(RunLocked) as refused:
        acquire(folder)
    hint = f"prour unlock '{folder}' --force"
    assert f"clear the lock with `{hint}`" in str(refused.value)

    without_force = _run_unlock(str(folder))
    assert without_force.returncode == 1
    assert "cannot check a process on node-elsewhere" in without_force.stderr
    assert hint in without_force.stderr and read_holder(folder / LOCK_FILE) == remote

    cleared = _run_unlock(str(folder), "--force")  # the hint, as printed, with its arguments
    assert cleared.returncode == 0, cleared.stderr
    assert "pid 4242 on node-elsewhere not checked (another host; --force)" in cleared.stdout
    assert not (folder / LOCK_FILE).exists()
    with run_lock(folder):  # free again
        pass


def test_unlock_refuses_a_live_holder_on_this_host_and_clears_a_dead_one(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = Holder(pid=sleeper.pid, host=socket.gethostname(), command="prour train",
                      since="now", started=runlock._process_start(sleeper.pid))
        _write_lock(tmp_path, live)
        with pytest.raises(runlock.UnlockRefused, match=f"kill -INT {sleeper.pid}"):
            runlock.unlock(tmp_path, force=True)  # --force does not override a visible process
        assert read_holder(tmp_path / LOCK_FILE) == live
    finally:
        sleeper.kill()
        sleeper.wait()
    message = runlock.unlock(tmp_path)
    assert message.endswith(f"pid {sleeper.pid} is not running on {socket.gethostname()}")
    assert not (tmp_path / LOCK_FILE).exists()
    assert runlock.unlock(tmp_path).endswith(f"is not locked (no {tmp_path / LOCK_FILE})")


def test_unlock_looks_up_the_holders_slurm_job(tmp_path, monkeypatch):
    """A holder's recorded Slurm job is asked of squeue: listed refuses, gone clears."""
    remote = Holder(pid=7, host="node-elsewhere", command="prour eval", since="then", job="812")
    states = {"812": "RUNNING"}
    monkeypatch.setattr(runlock, "slurm_job_state", lambda job: states.get(job, ""))
    _write_lock(tmp_path, remote)
    with pytest.raises(runlock.UnlockRefused, match="Slurm job 812 is RUNNING; cancel it"):
        runlock.unlock(tmp_path, force=True)
    states.clear()
    assert "Slurm job 812 has ended (not in squeue)" in runlock.unlock(tmp_path, force=True)


def test_the_lock_records_the_slurm_job_it_runs_in(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "9031")
    with run_lock(tmp_path) as holder:
        assert read_holder(tmp_path / LOCK_FILE).job == "9031" == holder.job
        assert "(Slurm job 9031)" in holder.describe()


def test_a_lock_left_by_an_earlier_run_of_this_requeued_job_is_taken_over(tmp_path, monkeypatch):
    """Slurm keeps a requeued job's id and counts its restarts: the lock of restart 0 on another
    node is dead for restart 1; the same restart elsewhere is another task of this job, alive."""
    monkeypatch.setenv("SLURM_JOB_ID", "55")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    same = Holder(pid=11, host="node-elsewhere", command="prour run", since="then", job="55",
                  restart="1")
    _write_lock(tmp_path, same)
    with pytest.raises(RunLocked, match="on node-elsewhere"):
        acquire(tmp_path)
    earlier = Holder(pid=11, host="node-elsewhere", command="prour run", since="then", job="55")
    _write_lock(tmp_path, earlier)
    assert acquire(tmp_path).restart == "1"
