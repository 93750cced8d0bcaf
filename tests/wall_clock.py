"""Wall-clock bounds for tests that time a call: derived from the timeouts the call is configured
with, never a bare literal, so that a loaded 2-core CI machine does not fail them by chance.

A call whose configured worst case is ``worst_s`` (its timeouts times its attempts, plus its
back-off sleeps) may take :func:`bound` seconds: twice that, plus a fixed allowance for thread
start-up and scheduling. A test that checks "does not hang" keeps the bound below the hang it
provokes (``assert bound(...) < hang_s``).
"""

from __future__ import annotations

LOAD_FACTOR = 2.0  # the code's own waits may stretch this much on a loaded machine
LOAD_SLACK_S = 2.0  # threads, sockets and the scheduler on 2 shared cores


def bound(worst_s: float) -> float:
    """The longest a call whose configured worst case is ``worst_s`` seconds may take here."""
    return LOAD_FACTOR * worst_s + LOAD_SLACK_S


def retried_worst_s(timeout_s: float, attempts: int, backoff_s: float = 0.0) -> float:
    """Worst case of ``attempts`` tries of ``timeout_s`` each with exponential back-off
    (``backoff_s``, doubled after each failed try) between them."""
    return attempts * timeout_s + sum(backoff_s * 2**i for i in range(attempts - 1))
