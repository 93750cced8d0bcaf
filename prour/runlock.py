"""One writer per run folder: ``<folder>/.prour.lock`` holds the PID, host, command and start time
of the command writing there. A second command on the folder refuses, naming the holder; a lock
whose process is gone (same host, PID not alive) is taken over with a log line. The lock is
released when the command ends, normally, on an error or on SIGINT/SIGTERM. A lock whose holder
ran on another host cannot be checked from here: the refusal names ``prour unlock FOLDER
--force`` (:func:`unlock`), which clears it after checking what it can (the holder's Slurm job).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from prour.files import named

logger = logging.getLogger(__name__)

LOCK_FILE = ".prour.lock"
# squeue states of a job whose processes Slurm has ended (squeue may still list it for a while)
ENDED_STATES = frozenset({"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
                          "OUT_OF_MEMORY", "PREEMPTED", "REVOKED", "TIMEOUT"})
TORN_GRACE_S = 2.0  # an unreadable lock younger than this may still be being written


@dataclass(frozen=True)
class Holder:
    """Who holds a run folder: ``started`` is the process start as /proc reports it (Linux), so a
    PID reused by another process after a crash is not mistaken for the holder."""

    pid: int
    host: str
    command: str
    since: str
    started: str | None = None
    job: str | None = None  # SLURM_JOB_ID of the holder, when it ran in a Slurm job
    restart: str | None = None  # its SLURM_RESTART_COUNT: a requeued job keeps its id

    def describe(self) -> str:
        job = f" (Slurm job {self.job})" if self.job else ""
        return f"pid {self.pid} on {self.host}{job} since {self.since}: {self.command}"


class RunLocked(RuntimeError):
    """The folder is held by another live command (or one on another host, unknown)."""

    def __init__(self, folder: Path, holder: Holder):
        self.folder, self.holder = folder, holder
        if holder.host != socket.gethostname():
            fix = ("if that command has ended, clear the lock with "
                   f"`prour unlock {shlex.quote(str(folder))} --force`")
        else:
            fix = f"wait for that command to end, or stop it: kill -INT {holder.pid}"
        super().__init__(f"{folder} is in use by {holder.describe()} (lock {folder / LOCK_FILE}; "
                         f"{fix})")


class UnlockRefused(RuntimeError):
    """``prour unlock`` would remove the lock of a command that may still run."""


def _process_start(pid: int) -> str | None:
    """Start time of ``pid`` in clock ticks since boot (field 22 of /proc/PID/stat); None where
    /proc is unavailable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _process_state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def current_holder() -> Holder:
    """This process as a lock holder."""
    pid = os.getpid()
    return Holder(pid=pid, host=socket.gethostname(), command=shlex.join(["prour", *sys.argv[1:]]),
                  since=time.strftime("%Y-%m-%dT%H:%M:%S%z"), started=_process_start(pid),
                  job=os.environ.get("SLURM_JOB_ID") or None,
                  restart=os.environ.get("SLURM_RESTART_COUNT") or None)


def holder_alive(holder: Holder) -> bool:
    """Whether the holder's process still runs. A holder on another host counts as alive (its
    PID cannot be checked from here) unless its Slurm job is over: an earlier run of this very
    job (requeued, so the same job id with another restart count) or a job ``squeue`` no longer
    lists (Slurm ends every process of a job that ends)."""
    if holder.host != socket.gethostname():
        return not (holder.job and _job_over(holder))
    if holder.pid <= 0:
        return False  # a torn lock
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user
    if _process_state(holder.pid) == "Z":
        return False  # killed, not yet reaped by its parent
    started = _process_start(holder.pid)
    return holder.started is None or started is None or started == holder.started


def read_holder(path: Path) -> Holder | None:
    """The holder recorded in a lock file; None when there is none. An unreadable lock (torn by a
    crash between create and write) reads as PID 0 on this host: a dead holder."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return Holder(**json.loads(text))
    except (ValueError, TypeError):
        return Holder(pid=0, host=socket.gethostname(), command="(unreadable lock)", since="?")


def _age(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def _create(path: Path, holder: Holder) -> bool:
    """Write the lock if no lock exists (O_CREAT|O_EXCL: exactly one creator wins)."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(asdict(holder), handle)
    except OSError as exc:  # a full disk: no empty lock left behind, and the error names it
        path.unlink(missing_ok=True)
        raise named(exc, path) from None
    return True


def _remove_stale(path: Path, stale: Holder) -> None:
    """Move a dead holder's lock aside; if another process replaced it meanwhile, put theirs back."""
    aside = path.with_name(f"{LOCK_FILE}.stale-{os.getpid()}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return  # another process removed it first
    if read_holder(aside) != stale:
        try:
            os.link(aside, path)
        except FileExistsError:
            pass
    aside.unlink()


def _our_runner(holder: Holder) -> bool:
    """Whether ``holder`` is the ``prour run`` that started this process (a step of it may
    write in a folder its runner holds, e.g. a recipe path inside run_dir itself)."""
    from prour.interrupt import runner_pid

    return (holder.host == socket.gethostname() and holder.pid == runner_pid()
            and holder.pid == os.getppid())


def live_holder(folder: str | Path) -> Holder | None:
    """The live holder of ``folder``'s lock that :func:`acquire` would refuse (not this process,
    nor the runner that started it); None when the folder is free or its holder is gone."""
    holder = read_holder(Path(folder) / LOCK_FILE)
    if holder is None or _our_runner(holder) or (
            holder.pid == os.getpid() and holder.host == socket.gethostname()):
        return None
    return holder if holder.pid > 0 and holder_alive(holder) else None


def acquire(folder: str | Path) -> Holder:
    """Lock ``folder`` (created if missing) for this process; raises :class:`RunLocked` naming a
    live holder. A folder held by the ``prour run`` that started this process is its runner's:
    the holder is returned as it is, and :func:`release` leaves that lock to its runner."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path, me = folder / LOCK_FILE, current_holder()
    while not _create(path, me):
        holder = read_holder(path)
        if holder is None:
            continue
        if holder.pid <= 0 and _age(path) < TORN_GRACE_S:
            time.sleep(0.05)  # its creator may be writing it right now
            continue
        if holder.pid == me.pid and holder.host == me.host:
            raise RunLocked(folder, holder)  # held by this very process: a nested second writer
        if _our_runner(holder) and holder_alive(holder):
            return holder  # our runner's folder: it holds it for the whole run
        if holder_alive(holder):
            raise RunLocked(folder, holder)
        logger.warning("taking over the lock of %s from a dead process (%s)", folder,
                       holder.describe())
        _remove_stale(path, holder)
    return me


def release(folder: str | Path, holder: Holder) -> None:
    """Remove the lock if it is still ``holder``'s and ``holder`` is this process (a runner's
    lock that a step wrote under stays its runner's)."""
    path = Path(folder) / LOCK_FILE
    if holder.pid == os.getpid() and read_holder(path) == holder:
        path.unlink(missing_ok=True)


@contextmanager
def run_lock(folder: str | Path) -> Iterator[Holder]:
    """Hold ``folder`` for the duration of the block (released on return, error or Ctrl-C)."""
    holder = acquire(folder)
    try:
        yield holder
    finally:
        release(folder, holder)


def _job_over(holder: Holder) -> bool:
    if holder.job == os.environ.get("SLURM_JOB_ID"):
        return holder.restart != (os.environ.get("SLURM_RESTART_COUNT") or None)
    return slurm_job_state(holder.job or "") == ""


def slurm_job_state(job: str) -> str | None:
    """The job's state as ``squeue`` lists it (``RUNNING``, ``PENDING`` ...); ``""`` when it has
    ended (an end state, or no longer listed); None when squeue cannot tell from here."""
    squeue = shutil.which("squeue")
    if squeue is None:
        return None
    try:
        done = subprocess.run([squeue, "-h", "-j", job, "-o", "%T"], capture_output=True,
                              text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:  # gone from the controller, or the controller is unreachable
        return "" if "invalid job id" in done.stderr.lower() else None
    state = done.stdout.strip().splitlines()[0] if done.stdout.strip() else ""
    return "" if state in ENDED_STATES else state


def unlock(folder: str | Path, *, force: bool = False) -> str:
    """Remove ``folder``'s lock when its holder cannot be running; returns what was checked.

    On this host the holder's PID (and start time) is checked: a live holder is refused. On
    another host the PID cannot be checked, so ``force`` is needed; a Slurm job recorded in the
    lock is still looked up with ``squeue`` and refused while listed. Raises
    :class:`UnlockRefused` naming what to do."""
    folder = Path(folder)
    path = folder / LOCK_FILE
    holder = read_holder(path)
    if holder is None:
        return f"{folder} is not locked (no {path})"
    here = socket.gethostname()
    checked = []
    if holder.host == here:
        if holder.pid > 0 and holder_alive(holder):
            raise UnlockRefused(f"{folder} is held by {holder.describe()}, which is running on "
                                f"this host; stop it (kill -INT {holder.pid}) instead of unlocking")
        checked.append(f"pid {holder.pid} is not running on {here}")
    else:
        if not force:
            raise UnlockRefused(
                f"{folder} is held by {holder.describe()}; {here} cannot check a process on "
                f"{holder.host}: make sure it has ended, then run "
                f"`prour unlock {shlex.quote(str(folder))} --force`")
        checked.append(f"pid {holder.pid} on {holder.host} not checked (another host; --force)")
    if holder.job:
        state = slurm_job_state(holder.job)
        if state:
            raise UnlockRefused(f"{folder} is held by {holder.describe()} and Slurm job "
                                f"{holder.job} is {state}; cancel it (scancel {holder.job}) or "
                                "wait for it to end")
        checked.append(f"Slurm job {holder.job} " + (
            "not checked (no squeue here)" if state is None else "has ended (not in squeue)"))
    _remove_stale(path, holder)
    newer = read_holder(path)
    if newer is not None:
        raise UnlockRefused(f"{folder} was locked again meanwhile by {newer.describe()}")
    return f"removed {path} of {holder.describe()}: " + "; ".join(checked)
