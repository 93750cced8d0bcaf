"""One writer per run folder: ``<folder>/.prour.lock`` holds the PID, host, command and start time
of the command writing there. A second command on the folder refuses, naming the holder; a lock
whose process is gone (same host, PID not alive) is taken over with a log line. The lock is
released when the command ends, normally, on an error or on Ctrl-C.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

LOCK_FILE = ".prour.lock"
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

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host} since {self.since}: {self.command}"


class RunLocked(RuntimeError):
    """The folder is held by another live command."""

    def __init__(self, folder: Path, holder: Holder):
        self.folder, self.holder = folder, holder
        super().__init__(
            f"{folder} is in use by {holder.describe()} (lock {folder / LOCK_FILE}; "
            "wait for that command to end, or stop it)"
        )


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
                  since=time.strftime("%Y-%m-%dT%H:%M:%S%z"), started=_process_start(pid))


def holder_alive(holder: Holder) -> bool:
    """Whether the holder's process still runs; a holder on another host counts as alive (its
    PID cannot be checked from here)."""
    if holder.host != socket.gethostname():
        return True
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
    with os.fdopen(fd, "w") as handle:
        json.dump(asdict(holder), handle)
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


def acquire(folder: str | Path) -> Holder:
    """Lock ``folder`` (created if missing) for this process; raises :class:`RunLocked` naming a
    live holder."""
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
        if holder_alive(holder):
            raise RunLocked(folder, holder)
        logger.warning("taking over the lock of %s from a dead process (%s)", folder,
                       holder.describe())
        _remove_stale(path, holder)
    return me


def release(folder: str | Path, holder: Holder) -> None:
    """Remove the lock if it is still ``holder``'s."""
    path = Path(folder) / LOCK_FILE
    if read_holder(path) == holder:
        path.unlink(missing_ok=True)


@contextmanager
def run_lock(folder: str | Path) -> Iterator[Holder]:
    """Hold ``folder`` for the duration of the block (released on return, error or Ctrl-C)."""
    holder = acquire(folder)
    try:
        yield holder
    finally:
        release(folder, holder)
