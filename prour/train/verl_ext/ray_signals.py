"""Keeping prour's SIGINT/SIGTERM handling in a Ray driver (the CPU rehearsal's) from ``ray.init``
to the end of ``ray.shutdown``.

Ray's driver installs a C++ crash handler for SIGSEGV, SIGILL, SIGFPE, SIGABRT and SIGTERM at
``ray.init``, whose SIGTERM aborts the process with a stack dump and exit 134: :func:`init` takes
SIGTERM back right after (:func:`prour.interrupt.reclaim`), so a SIGTERM saves and exits 130. During
``ray.shutdown`` Ray uninstalls that handler by setting all five to their default action, whatever
is installed at that moment, and the shutdown takes about a second more. A SIGTERM in that second,
which is what Slurm's repeated SIGTERM sends, then killed the driver by signal after its
checkpoint was whole and its report printed (measured with Ray 2.60: a SIGTERM every 10 ms during
``ray.shutdown`` killed it with 143).

Ray skips the uninstall when its own "installed" flag is false, so :func:`shutdown` clears the
flag before ``ray.shutdown`` and does the uninstall's job itself afterwards for the four crash
signals. SIGTERM keeps prour's handler throughout: a signal then is one more request to stop,
counted as :mod:`prour.interrupt` counts them. Where a Ray build lacks the flag (another version),
the shutdown is Ray's own and the second then is as before.
"""

from __future__ import annotations

import ctypes
import signal
import threading
from typing import Any

from prour import interrupt

# ray::RayLog::is_failure_signal_handler_installed_, a static bool exported by ray/_raylet.so.
_INSTALLED_FLAG = "_ZN3ray6RayLog36is_failure_signal_handler_installed_E"
_CRASH_SIGNALS = (signal.SIGSEGV, signal.SIGILL, signal.SIGFPE, signal.SIGABRT)


def _installed_flag() -> ctypes.c_bool | None:
    """Ray's flag in the loaded ``_raylet`` library, or None where this build does not export it."""
    import ray._raylet

    try:
        return ctypes.c_bool.in_dll(ctypes.CDLL(ray._raylet.__file__), _INSTALLED_FLAG)
    except (OSError, ValueError):
        return None


def stop_asked() -> bool:
    """Whether SIGINT or SIGTERM asked this driver to stop (:func:`prour.interrupt.stopping`):
    its clean-up then waits on Ray only briefly, since in a Slurm job the same signal reached
    Ray's own processes, whose answers never come."""
    return interrupt.stopping()


def ray_ended() -> bool:
    """Whether the raylet of the Ray this driver started (``ray.init`` without an address) has
    ended: in a Slurm job the job's SIGTERM reaches Ray's own processes (GCS, raylet, workers)
    beside the driver, and the raylet goes first (the GCS and the autoscaler take seconds more
    to end on their own). False for a cluster the driver joined: it cannot tell."""
    from ray._private import ray_constants, worker

    node = getattr(worker, "_global_node", None)
    if node is None:
        return False
    raylets = node.all_processes.get(ray_constants.PROCESS_TYPE_RAYLET, [])
    return bool(raylets) and all(info.process.poll() is not None for info in raylets)


def stopped_with_ray() -> bool:
    """Whether the stop asked of this driver reached Ray's own processes too: inside a Slurm job,
    whose SIGTERM (scancel, a time limit, preemption) reaches every process of the job, or once
    the raylet has ended anyway. The clean-up then skips what would wait on them (the transfer
    queue's graceful close of its storage actors, which ``ray.shutdown`` ends anyway): with Ray
    2.60 that wait, beside ``ray.shutdown``'s own with a dead raylet, held the driver past
    Slurm's KillWait (30 s by default) on a busy node, which killed it before its report and
    exit 130."""
    import os

    return stop_asked() and (bool(os.environ.get("SLURM_JOB_ID")) or ray_ended())


def init(**kwargs: Any) -> None:
    """``ray.init(**kwargs)``, then prour's handlers back in place of Ray's."""
    import ray

    ray.init(**kwargs)
    interrupt.reclaim()


def shutdown() -> bool:
    """``ray.shutdown()`` without Ray putting SIGTERM's default action back on the way; prour's
    handlers are in place afterwards. True where the handler stayed in place throughout."""
    import ray

    flag = _installed_flag()
    kept = (flag is not None and flag.value
            and threading.current_thread() is threading.main_thread())  # signal.signal's rule
    if kept:
        flag.value = False  # Ray's uninstall is skipped: SIGTERM keeps the handler it has now
    try:
        ray.shutdown()
    finally:
        if kept:
            for signum in _CRASH_SIGNALS:  # what Ray's uninstall would have done for these
                signal.signal(signum, signal.SIG_DFL)
        interrupt.reclaim()
    return kept
