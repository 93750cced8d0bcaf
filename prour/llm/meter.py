"""Counting a caller's chat requests and tokens without threading a counter through every layer.

A caller that wants to know what the responders it calls cost (the reward, per training step)
opens :func:`metering` with a callback; the responders report each batched chat call through
:func:`record` and the callback receives ``(requests, tokens)``. Outside ``metering`` a record
goes nowhere. The callback is held in a context variable, so it follows the caller into threads
started with :func:`contextvars.copy_context` (the reward's responder timeout does so).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar

from prour.llm.base import Completion

Sink = Callable[[int, int], None]

_sink: ContextVar[Sink | None] = ContextVar("prour_llm_meter", default=None)


@contextlib.contextmanager
def metering(sink: Sink) -> Iterator[None]:
    """Send every :func:`record` made inside the block (this context) to ``sink``."""
    token = _sink.set(sink)
    try:
        yield
    finally:
        _sink.reset(token)


def record(requests: int, outputs: Sequence[Sequence[Completion]] = ()) -> None:
    """One batched chat call of ``requests`` requests (failed ones too: they cost time) and, when
    it returned, its results, whose prompt and generated tokens count as the backend counted
    them."""
    sink = _sink.get()
    if sink is None:
        return
    tokens = sum(c.prompt_tokens + c.completion_tokens for out in outputs for c in out)
    sink(requests, tokens)
