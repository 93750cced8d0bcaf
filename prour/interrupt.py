"""How every long ``prour`` command stops on SIGINT (Ctrl-C) and SIGTERM (``scancel``, a Slurm time
limit, preemption): both are handled alike.

- **Start-up** (imports, recipe, model load; no :func:`interruptible` block yet): one line, exit
  :data:`INTERRUPTED_EXIT`; no traceback.
- **First signal** inside an :func:`interruptible` block: the command says what it waits for (the
  requests in flight, the child processes it passed the signal on to) and that a second signal
  stops at once. New requests refuse to start (:class:`Stopping`), ``KeyboardInterrupt`` unwinds
  the block (or its ``stop`` event is set), then the block says what was saved, that a rerun
  resumes, releases what was registered with :func:`on_stop` (the run lock) and exits 130.
- **Second signal**: the same report, the child processes killed by PID, exit 130 at once.
- **The runner killed** (a step of ``prour run`` whose runner dies by SIGKILL): the step gets
  SIGTERM from the kernel (:func:`die_with_runner`) and stops as after a first signal.

Signals arriving within :data:`SAME_SIGNAL_S` of the first count as that one: Slurm signals every
process of a job and a parent passes the signal on too, so a child may receive both.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

INTERRUPTED_EXIT = 130
RUNNER_ENV = "PROUR_RUNNER_PID"  # set by `prour run` for its steps: its pid (die_with_runner)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
SAME_SIGNAL_S = 1.0
CHILD_GRACE_S = 3.0  # a child's time to stop on its own after a second signal, then SIGKILL
HANDLED = (signal.SIGINT, signal.SIGTERM)


class Stopping(BaseException):
    """Raised where new work (an HTTP request, an episode) would start after the first signal; a
    ``BaseException`` so that episode and retry handlers, which catch ``Exception``, let it by."""


@dataclass
class _Phase:
    saved: Callable[[], str]
    stop: threading.Event | None = None


@dataclass
class _Child:
    name: str
    kill: bool  # a server: not signalled at the first signal (its clients finish), SIGKILL at a
    # second; otherwise (a ``prour`` step) the signal is passed on each time
    process: subprocess.Popen | None = None

    def alive(self, pid: int) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return _state_of(pid) != "Z"  # a zombie has ended


@dataclass
class _State:
    installed: bool = False
    sigint_ignored: bool = False  # ignored by whoever started us: install() left it so
    signals: int = 0
    first_at: float = 0.0
    signum: int = 0
    phases: list[_Phase] = field(default_factory=list)
    cleanups: dict[int, tuple[str, Callable[[], None]]] = field(default_factory=dict)
    children: dict[int, _Child] = field(default_factory=dict)
    in_flight: int = 0
    last: _Phase | None = None  # the block that ended last: what it saved is still the report
    lock: threading.Lock = field(default_factory=threading.Lock)


_state = _State()


def install() -> None:
    """Handle SIGINT and SIGTERM in this process as this module says (main thread only;
    idempotent). ``prour``'s entry point calls it before anything heavy is imported."""
    if _state.installed or threading.current_thread() is not threading.main_thread():
        return
    for signum in HANDLED:
        if signum == signal.SIGINT and signal.getsignal(signum) == signal.SIG_IGN:
            _state.sigint_ignored = True
            continue  # ignored by whoever started us (nohup, a shell's background job): keep it
        signal.signal(signum, _on_signal)
    _state.installed = True


def reclaim() -> None:
    """Put this module's handlers back after a library replaced them (Ray's ``ray.init`` sets a
    C-level SIGTERM handler that aborts the process with a stack dump and exit 134): only where
    :func:`install` put them in place, and an ignored SIGINT stays ignored."""
    if not _state.installed or threading.current_thread() is not threading.main_thread():
        return
    for signum in HANDLED:
        if signum == signal.SIGINT and _state.sigint_ignored:
            continue
        signal.signal(signum, _on_signal)


def install_for_command() -> None:
    """:func:`install` when this process is the ``prour`` command itself (its console script or
    ``python -m prour.cli.main``), not a program that merely imports the CLI (a test runner);
    a step of ``prour run`` then also dies with its runner (:func:`die_with_runner`)."""
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if argv0 is not None and (argv0.name == "prour" or argv0.parts[-3:] == ("prour", "cli",
                                                                          "main.py")):
        install()
        die_with_runner()  # a step of `prour run`: SIGTERM when the runner dies


def stopping() -> bool:
    """Whether a stop was asked for (first signal received)."""
    return _state.signals > 0


def check() -> None:
    """Raise :class:`Stopping` after the first signal: call before starting a new piece of work."""
    if _state.signals > 0:
        raise Stopping(signal.Signals(_state.signum).name)


@contextmanager
def request() -> Iterator[None]:
    """One request to a server (or one model call) in flight; refuses to start once stopping."""
    check()
    with _state.lock:
        _state.in_flight += 1
    try:
        yield
    finally:
        with _state.lock:
            _state.in_flight -= 1


def in_flight() -> int:
    """Requests started through :func:`request` and not yet ended."""
    return _state.in_flight


@contextmanager
def interruptible(saved: Callable[[], str], *, stop: threading.Event | None = None
                  ) -> Iterator[None]:
    """The long part of a command. ``saved()`` says what is on disk and how a rerun resumes (e.g.
    ``12 trajectories saved in run/x.jsonl; rerun `prour collect` ...``). A signal raises
    ``KeyboardInterrupt`` inside the block, which then ends with the report and
    ``SystemExit(130)``. With ``stop`` (a command whose normal end is a signal, ``prour serve``)
    the first signal only sets the event and the block ends as its loop returns. The handlers
    are those :func:`install` put in place (the CLI does); elsewhere (a test calling a command in
    process) Python's own ``KeyboardInterrupt`` on SIGINT ends the block the same way."""
    phase = _Phase(saved=saved, stop=stop)
    _state.phases.append(phase)
    try:
        yield
    except (KeyboardInterrupt, Stopping):
        _finish("interrupted")
        if _state.installed:  # the prour process itself (a test runner keeps its own handlers)
            atexit.register(_ignore_sigterm)
        raise SystemExit(INTERRUPTED_EXIT) from None
    finally:
        _state.phases.remove(phase)
        _state.last = phase


@contextmanager
def on_stop(what: str, release: Callable[[], None]) -> Iterator[None]:
    """Run ``release`` (idempotent; e.g. the run lock) when an interrupted command ends, before its
    report names ``what`` as released; the caller still releases it on a normal end."""
    key = id(release)
    _state.cleanups[key] = (what, release)
    try:
        yield
    finally:
        _state.cleanups.pop(key, None)


@contextmanager
def child(process: subprocess.Popen, name: str, *, kill: bool = False) -> Iterator[None]:
    """A child process that gets the signal passed on (to its process group when it leads one,
    as with ``start_new_session=True``, so a terminal's Ctrl-C reaches it once, through us). When
    the block is left after a signal, it first waits for the child to end (the child reports and
    releases its own lock; a second signal cuts that short). A ``kill`` child (a vLLM server) is
    not signalled at the first signal, so the requests in flight can end, and is killed at a
    second; another (a ``prour`` step) gets the second signal too and :data:`CHILD_GRACE_S` to
    report before it is killed."""
    track_child(process.pid, name, kill=kill, process=process)
    try:
        yield
    finally:
        if stopping():
            process.wait()
        untrack_child(process.pid)


def track_child(pid: int, name: str, *, kill: bool = False,
                process: subprocess.Popen | None = None) -> None:
    """:func:`child` for a process whose life does not fit one block (untrack when it is gone)."""
    _state.children[pid] = _Child(name=name, kill=kill, process=process)


def untrack_child(pid: int) -> None:
    _state.children.pop(pid, None)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    now = time.monotonic()
    if _state.signals and now - _state.first_at < SAME_SIGNAL_S:
        return  # the same stop, delivered twice (Slurm and a parent both signal us)
    if _state.signals and signum == signal.SIGTERM and os.environ.get("SLURM_JOB_ID"):
        # Slurm signals every process of a job step, and may do so more than once, seconds apart
        # on a busy node; its KillWait then ends the job. A repeated SIGTERM inside a job is
        # that repetition, not a person asking to stop at once (Ctrl-C still is).
        return
    _state.signals += 1
    name = signal.Signals(signum).name
    if _state.signals > 1:
        _stop_at_once(name)
    _state.first_at, _state.signum = now, signum
    _send_children(signum)
    if not _state.phases:
        when = ("after its work was saved" if _state.last
                else "during start-up: stopped before any work began")
        _say(f"{name} received {when}; exit {INTERRUPTED_EXIT}")
        raise SystemExit(INTERRUPTED_EXIT)
    _say(f"{name} received: stopping; {_waiting()}; send it again (or Ctrl-C) to stop at once")
    phase = _state.phases[-1]
    if phase.stop is not None:
        phase.stop.set()
        return
    raise KeyboardInterrupt


def _ignore_sigterm() -> None:
    """At exit after an interruption (atexit: the threads are joined, a second signal until then
    still stops at once), ignore SIGTERM for the rest of the interpreter's teardown (a second or
    more): Python puts the default action back for the signals it handles as it finalizes, so
    Slurm repeating its SIGTERM then would turn exit 130 into death by signal. What was saved is
    on disk and reported already."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _waiting() -> str:
    parts = []
    if _state.in_flight:
        parts.append(f"{_state.in_flight} request(s) in flight")
    steps = {pid: c for pid, c in _state.children.items() if not c.kill}
    if steps:
        names = ", ".join(f"{c.name} (pid {pid})" for pid, c in steps.items())
        parts.append(f"{len(steps)} child process(es) to stop: {names}")
    if not parts:
        return "nothing in flight"
    return "waiting for " + " and ".join(parts)


def _stop_at_once(name: str) -> None:
    """Second signal: release, report, kill what is left of the children, exit 130 now."""
    _finish(f"stopped at once ({name} again)")
    _end_children()
    sys.stderr.flush()
    os._exit(INTERRUPTED_EXIT)


def _finish(how: str) -> None:
    """Release what :func:`on_stop` registered, then say what was saved and what was released."""
    released = []
    for what, release in list(_state.cleanups.values()):
        try:
            release()
        except Exception as exc:  # noqa: BLE001 - the report must still come out
            _say(f"could not release {what}: {exc}")
            continue
        released.append(what)
    _state.cleanups.clear()
    phase = _state.phases[-1] if _state.phases else _state.last
    try:
        saved = phase.saved() if phase else "nothing saved yet"
    except Exception as exc:  # noqa: BLE001
        saved = f"(could not count what was saved: {exc})"
    tail = f"; released {', '.join(released)}" if released else ""
    _say(f"{how}: {saved}{tail}; exit {INTERRUPTED_EXIT}")


def _send_children(signum: int) -> None:
    """Pass the first signal on to the ``prour`` children; servers keep serving them meanwhile
    (their owner stops them as its block unwinds)."""
    for pid, entry in list(_state.children.items()):
        if not entry.kill:
            _signal(pid, signum)


def _end_children() -> None:
    """Kill servers now; give ``prour`` children the signal again and a moment to report."""
    others = []
    for pid, entry in list(_state.children.items()):
        if entry.kill:
            _signal(pid, signal.SIGKILL)
        else:
            _signal(pid, _state.signum or signal.SIGTERM)
            others.append(pid)
    deadline = time.monotonic() + CHILD_GRACE_S
    while others and time.monotonic() < deadline:
        others = [pid for pid in others if _state.children[pid].alive(pid)]
        time.sleep(0.05)
    for pid in others:
        _signal(pid, signal.SIGKILL)


def _signal(pid: int, signum: int) -> None:
    """Signal ``pid``'s process group when it leads one (``start_new_session``), else ``pid``."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _state_of(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _say(line: str) -> None:
    try:
        sys.stderr.write(f"\n{line}\n" if line else "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # stderr closed: nothing to tell


# ---- a step of `prour run` dies with it ---------------------------------------------------------
# The runner starts each step in a session of its own; killed by SIGKILL (kill -9, the OOM killer),
# it used to leave the step running as an orphan that held its folder's lock and kept writing
# beside a rerun. The runner puts its pid in the step's environment (RUNNER_ENV); the step's entry
# asks the kernel for SIGTERM when its parent dies (prctl PR_SET_PDEATHSIG, Linux), then checks
# that the runner is still its parent (it may have died before the request). SIGTERM ends the step
# as scancel does: it saves, says so, frees its lock and exits 130; a rerun resumes it.
# The step asks for itself, not the runner between fork and exec (preexec_fn): that runs Python in
# the fork of a process with threads (the runner's output tees), which Python documents as unsafe.
# The kernel, not a thread polling the parent: no thread, no polling delay. The kernel signals when
# the thread that started the child ends: the runner starts its steps from its main thread. The
# variable is taken out of the environment as it is read: the step's own children (a trainer, Ray,
# a nested prour) do not take the runner for their parent.

_runner: int | None = None


def step_env() -> dict[str, str]:
    """What ``prour run`` adds to a step's environment: its own pid."""
    return {RUNNER_ENV: str(os.getpid())}


def runner_pid() -> int | None:
    """The pid of the ``prour run`` that started this process (None: no runner did)."""
    return _runner


def _parent_death_signal(signum: int) -> bool:
    """Ask the kernel for ``signum`` when this process's parent dies; False where it cannot."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_runner(signum: int = signal.SIGTERM) -> int | None:
    """In a step that ``prour run`` started: remember the runner, die with it (``signum`` when it
    dies; at once when it is gone already). Returns the runner's pid (None: not a step)."""
    global _runner
    value = os.environ.pop(RUNNER_ENV, None)
    if not value or not value.isdigit():
        return None
    _runner = int(value)
    _parent_death_signal(signum)
    if os.getppid() != _runner:  # it died before the kernel was asked: stop as it would have
        os.kill(os.getpid(), signum)
    return _runner
