"""The scripted parts of the CPU verl harness; the harness itself is the package's rehearsal
entry (:mod:`prour.train.verl_ext.rehearsal`, whose docstring says what is verl's and what stands
in). The frozen responder here is a scripted strict user."""

from __future__ import annotations

import itertools

SCORE_MARK = "size M"  # in every responder answer: tells a posterior prompt from a prior one
ANSWERS = ("Blue, size M.", "The grey one, size M.", "It does not matter, size M.")


class StrictUser:
    """The frozen responder: a scripted strict user that can be taken down."""

    def __init__(self) -> None:
        self.down = False
        self._answers = itertools.cycle(ANSWERS)

    def __call__(self, _prompt: str) -> str:
        if self.down:
            raise ConnectionError("responder endpoint unreachable")
        return next(self._answers)
