"""How a served model's client retries, and what its requests cost in errors and retries.

A request that fails in a way worth retrying (a 5xx, 408 or 429 answer, a timeout, a connection
refused or cut mid-reply) is tried again after a wait that doubles with each retry and is spread
by *equal jitter*: retry ``k`` waits ``base * 2**(k-1) * (1 + u) / 2`` seconds for a uniform
``u`` in [0, 1), so between half and all of the plain exponential wait, and clients that failed
together do not come back together. Two budgets bound the retries of one request: their number
(``models.<role>.max_retries``) and, when set, the seconds from its first attempt
(``models.<role>.retry_budget_s``): no attempt outlives that budget and no retry starts that
could not begin inside it.

Each client counts its attempts under a label (the role it was built for) in this process's
tally: :func:`snapshot` before a run and :func:`since` after it give what the run cost, which
``prour eval`` prints, the eval queue records in ``queue.jsonl`` and the local trainer writes
into each step's metrics line.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

FAILURE_KINDS = ("http", "timeout", "connection")
"""How an attempt can fail and be retried: a retryable HTTP status, no answer within the time
limit, a connection refused or closed before the reply was whole."""

_NAMES = {"http": "HTTP error", "timeout": "timeout", "connection": "dropped connection"}


def backoff_delay(retry: int, base_s: float, u: float) -> float:
    """Seconds to wait before retry ``retry`` (1 for the first): the exponential wait
    ``base_s * 2**(retry - 1)`` scaled by ``(1 + u) / 2`` (equal jitter, ``u`` in [0, 1))."""
    if retry < 1:
        raise ValueError(f"retry counts from 1, got {retry}")
    if not 0.0 <= u < 1.0:
        raise ValueError(f"u must be in [0, 1), got {u}")
    return base_s * 2 ** (retry - 1) * (1.0 + u) / 2.0


def stop_reason(retries_done: int, max_retries: int, elapsed_s: float, delay_s: float,
                budget_s: float | None) -> str | None:
    """Why a failed request is not retried again, or None to retry it: its ``max_retries`` are
    used, or the retry would start (after ``delay_s`` more) past ``budget_s`` seconds from its
    first attempt."""
    if retries_done >= max_retries:
        return f"max_retries={max_retries} used"
    if budget_s is not None and elapsed_s + delay_s >= budget_s:
        return f"retry_budget_s={budget_s:g} spent ({elapsed_s:.1f} s)"
    return None


@dataclass
class RequestCounts:
    """What one client's requests cost: ``requests`` asked of it, ``attempts`` sent, those that
    failed by kind (``http``, ``timeout``, ``connection``), ``retries`` made and requests that
    failed for good (``gave_up``: their budget spent)."""

    requests: int = 0
    attempts: int = 0
    http: int = 0
    timeout: int = 0
    connection: int = 0
    retries: int = 0
    gave_up: int = 0

    @property
    def failed(self) -> int:
        """Attempts that failed, every kind together."""
        return self.http + self.timeout + self.connection

    @property
    def error_share(self) -> float | None:
        """Failed attempts over attempts; None without an attempt."""
        return self.failed / self.attempts if self.attempts else None

    def minus(self, before: RequestCounts) -> RequestCounts:
        """The counts since ``before`` (an earlier copy of the same tally)."""
        return RequestCounts(**{f.name: getattr(self, f.name) - getattr(before, f.name)
                                for f in fields(self)})

    def record(self) -> dict[str, Any]:
        """The counts as a JSON object, with the failed attempts and their share."""
        share = self.error_share
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "failed": self.failed,
                "error_share": round(share, 4) if share is not None else None}

    def text(self) -> str:
        """One line: attempts, failures by kind and their share, retries, requests given up."""
        share = self.error_share
        kinds = ", ".join(f"{n} {_NAMES[k]}{'s' if n != 1 else ''}"
                          for k in FAILURE_KINDS if (n := getattr(self, k)))
        failed = (f"{self.failed} failed ({share:.1%}: {kinds})" if self.failed else
                  "0 failed" if share is not None else "0 failed (–: no attempt)")
        return (f"{self.attempts} attempt(s) for {self.requests} request(s), {failed}, "
                f"{self.retries} retried, {self.gave_up} given up")


_tally: dict[str, RequestCounts] = {}
_lock = threading.Lock()


def count(label: str, **add: int) -> None:
    """Add to the counts of ``label`` (``requests=1``, ``attempts=1``, ``timeout=1``, ...)."""
    with _lock:
        counts = _tally.setdefault(label, RequestCounts())
        for name, n in add.items():
            setattr(counts, name, getattr(counts, name) + n)


def snapshot() -> dict[str, RequestCounts]:
    """A copy of this process's counts by label, to subtract from later ones."""
    with _lock:
        return {label: replace(counts) for label, counts in _tally.items()}


def since(before: Mapping[str, RequestCounts]) -> dict[str, RequestCounts]:
    """The counts by label since ``before`` (a :func:`snapshot`), labels without an attempt
    since then left out."""
    out = {}
    for label, counts in snapshot().items():
        delta = counts.minus(before.get(label, RequestCounts()))
        if delta.attempts or delta.requests:
            out[label] = delta
    return dict(sorted(out.items()))


def step_metrics(counts: Mapping[str, RequestCounts]) -> dict[str, float | int | None]:
    """Flat metrics of a training step: per label ``<label>_http_attempts``, ``_http_failed``,
    ``_http_retries``, ``_http_gave_up`` and ``_http_error_share`` (None without an attempt)."""
    out: dict[str, float | int | None] = {}
    for label, c in counts.items():
        share = c.error_share
        out.update({f"{label}_http_attempts": c.attempts, f"{label}_http_failed": c.failed,
                    f"{label}_http_retries": c.retries, f"{label}_http_gave_up": c.gave_up,
                    f"{label}_http_error_share": round(share, 4) if share is not None else None})
    return out
