"""Where a training step's time goes: phases as wall-clock intervals, and call counts.

Stdlib only. The local trainer and verl's agent loop take a step's phases from a
:class:`PhaseClock`; the reward records its scoring and responder calls on the clock it is given.
:mod:`prour.train.metrics` turns what a clock took into the step's metric keys.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar

PHASES = ("generation", "strict_user", "verifier", "prior", "posterior", "update", "waiting")
"""Where a training step's time goes: sampling the queries, the strict user's and the verifiers'
calls, scoring the priors and the posteriors with the policy, the optimizer update, and waiting
(the step's time that none of the others account for: parsing and selection, the attention
judge, scheduling, transfers, checkpoints)."""

CALL_KEYS = (
    "generation_tokens",
    "strict_user_calls",
    "strict_user_tokens",
    "verifier_calls",
    "verifier_tokens",
    "prior_requests",
    "posterior_requests",
)
"""Every step's counts beside the phase times: the tokens the policy generated; the responders'
chat requests (the strict user one per question, the verifier one per question and tool round)
and their tokens (prompt + reply, as the backend counted them); and the score requests of the
prior and posterior passes."""


class PhaseClock:
    """A step's phases as wall-clock intervals, and its call counts, recorded as they happen
    (thread-safe: a step's responder calls run side by side). :meth:`take` returns each phase's
    seconds, a second during which k phases ran shared equally among them, so that the phases
    together never count more time than passed; then it starts afresh."""

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self.now = now  # time.time where intervals of several processes are put together
        self._lock = threading.Lock()
        self._intervals: list[tuple[str, float, float]] = []
        self._counts: dict[str, int] = {}

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Record the block as an interval of ``phase`` (one of :data:`PHASES`)."""
        _check_phase(phase)
        start = self.now()
        try:
            yield
        finally:
            self.add_interval(phase, start, self.now())

    def add_interval(self, phase: str, start: float, end: float) -> None:
        """An interval of ``phase`` in :attr:`now`'s seconds."""
        _check_phase(phase)
        with self._lock:
            self._intervals.append((phase, start, end))

    def count(self, key: str, n: int) -> None:
        """Add ``n`` to the count ``key`` (one of :data:`CALL_KEYS`)."""
        if key not in CALL_KEYS:
            raise ValueError(f"unknown count {key!r}; counts are {', '.join(CALL_KEYS)}")
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + n

    def take(
        self, since: float | None = None, until: float | None = None
    ) -> tuple[dict[str, float], dict[str, int]]:
        """(seconds by phase, counts by key) since the last take; both start again at zero.
        ``since``/``until`` clip the intervals to a window (a step's own seconds, when work of
        another step overlaps it)."""
        intervals, counts = self.take_intervals()
        lo = -math.inf if since is None else since
        hi = math.inf if until is None else until
        clipped = [(p, max(start, lo), min(end, hi)) for p, start, end in intervals]
        return shared_seconds(clipped), counts

    def current(self) -> PhaseClock:
        """The clock :func:`clocking` set for this context, else this one."""
        return _clock_override.get() or self

    def take_intervals(self) -> tuple[list[tuple[str, float, float]], dict[str, int]]:
        """(the intervals, counts by key) since the last take, to be joined with others'."""
        with self._lock:
            intervals, counts = self._intervals, self._counts
            self._intervals, self._counts = [], {}
        return intervals, counts


_clock_override: ContextVar[PhaseClock | None] = ContextVar("prour_phase_clock", default=None)


@contextlib.contextmanager
def clocking(clock: PhaseClock) -> Iterator[None]:
    """Inside the block (this context and threads that copy it, e.g. ``asyncio.to_thread``),
    :func:`current_clock` is ``clock``: one verl session's own phases, apart from the others
    that share the worker's reward."""
    token = _clock_override.set(clock)
    try:
        yield
    finally:
        _clock_override.reset(token)


def current_clock(default: PhaseClock) -> PhaseClock:
    """The clock :func:`clocking` set, else ``default`` (the reward's own)."""
    return default.current()


def _check_phase(phase: str) -> None:
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}; phases are {', '.join(PHASES)}")


def shared_seconds(intervals: Sequence[tuple[str, float, float]]) -> dict[str, float]:
    """Seconds per phase of ``(phase, start, end)`` intervals: each stretch of time goes in equal
    parts to the phases running in it (a phase's own overlapping intervals count once), so the
    result sums to the length of the intervals' union."""
    events = sorted(
        [(start, 1, phase) for phase, start, end in intervals if end > start]
        + [(end, -1, phase) for phase, start, end in intervals if end > start]
    )
    out: dict[str, float] = {}
    running: dict[str, int] = {}
    last = events[0][0] if events else 0.0
    for moment, change, phase in events:
        active = [p for p, n in running.items() if n > 0]
        if active and moment > last:
            for p in active:
                out[p] = out.get(p, 0.0) + (moment - last) / len(active)
        last = moment
        running[phase] = running.get(phase, 0) + change
    return out
