"""The training progress bar: steps done, ETA and the latest mean reward, on a terminal only.

In a log file (stderr not a terminal) nothing is drawn; the trainer's log line per step is the
record there. On a terminal, log lines written to stderr go above the bar instead of through it.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Self


class StepProgress:
    """``with StepProgress(total, done) as bar: ... bar.advance(step, reward)``."""

    def __init__(self, total: int, done: int = 0, enabled: bool | None = None,
                 console: Any = None):
        self.total, self.done = total, done
        self.enabled = (sys.stderr.isatty() if enabled is None else enabled) and done < total
        self.console = console
        self._swapped: list[tuple[logging.StreamHandler, Any]] = []

    def __enter__(self) -> Self:
        if not self.enabled:
            return self
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        original = sys.stderr
        self._bar = Progress(
            TextColumn("[bold]training[/bold] {task.description}"), BarColumn(),
            MofNCompleteColumn(), TextColumn("elapsed"), TimeElapsedColumn(), TextColumn("ETA"),
            TimeRemainingColumn(), console=self.console or Console(stderr=True),
        )
        self._task = self._bar.add_task("steps", total=self.total, completed=self.done)
        self._bar.start()
        self._route_logging(original)
        return self

    def _route_logging(self, original: Any) -> None:
        """Point stderr log handlers at rich's stderr proxy, which prints above the bar."""
        if sys.stderr is original:
            return
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is original:
                self._swapped.append((handler, original))
                handler.setStream(sys.stderr)

    def advance(self, step: int, reward: float | None) -> None:
        """Step ``step`` finished with mean reward ``reward`` (None: no sample got one)."""
        if self.enabled:
            shown = "–" if reward is None else f"{reward:.3f}"
            self._bar.update(self._task, completed=step, description=f"reward {shown}")

    def __exit__(self, *exc: object) -> None:
        if not self.enabled:
            return
        for handler, stream in self._swapped:
            handler.setStream(stream)
        self._bar.stop()
