"""Training instances and the order they are visited in: a seeded shuffle per epoch.

The order is a pure function of (seed, number of rows, step), so a resumed run visits exactly
the states an uninterrupted run would have, without storing the permutation.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)


class DataOrder:
    """Which rows step ``k`` trains on: ``size`` consecutive positions of the epoch permutations."""

    def __init__(self, n_rows: int, seed: int):
        if n_rows < 1:
            raise ValueError("the training set is empty")
        self.n_rows = n_rows
        self.seed = seed
        self._epochs: dict[int, tuple[int, ...]] = {}

    def permutation(self, epoch: int) -> tuple[int, ...]:
        """The row order of one epoch (a fresh shuffle per epoch, seeded by (seed, epoch))."""
        if epoch not in self._epochs:
            if len(self._epochs) > 4:
                self._epochs.clear()
            rng = np.random.default_rng([self.seed, epoch])
            self._epochs[epoch] = tuple(int(i) for i in rng.permutation(self.n_rows))
        return self._epochs[epoch]

    def position(self, step: int, size: int) -> tuple[int, int]:
        """(epoch, offset) of the first row of ``step``; an epoch's tail continues into the next."""
        start = step * size
        return start // self.n_rows, start % self.n_rows

    def indices(self, step: int, size: int) -> list[int]:
        """Row indices of the ``size`` states of training step ``step`` (0-based)."""
        start = step * size
        return [
            self.permutation(p // self.n_rows)[p % self.n_rows] for p in range(start, start + size)
        ]


def row_mode(row: dict[str, Any]) -> str | None:
    """The belief mode (clarify / verify) of a dataset row's state, None when it names none."""
    return (row.get("extra_info") or {}).get("mode")


def keep_modes(rows: list[dict[str, Any]], modes: Collection[str] | None,
               where: str = "the training data") -> list[dict[str, Any]]:
    """The rows whose state has one of ``modes`` (``train.modes``; None: every row, as read).

    Both backends train on what this keeps: the local trainer on its rows, verl's dataset on the
    rows of its files (:mod:`prour.train.verl_ext.dataset`). A filter that keeps nothing of a
    non-empty file says so in the log (the local trainer then saves the untrained policy, as for
    an empty file; verl refuses an empty dataset)."""
    if modes is None:
        return rows
    kept = [row for row in rows if row_mode(row) in set(modes)]
    if rows and not kept:
        found = sorted({str(row_mode(row)) for row in rows})
        logger.warning("train.modes=%s keeps none of the %d states of %s (their modes: %s)",
                       list(modes), len(rows), where, ", ".join(found))
    return kept


def read_instances(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a split parquet file (the data stage's schema) as plain dicts."""
    from prour.data.dataset import read_rows

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"training data not found: {path} (run `prour extract` first, or set train.train_file)"
        )
    return read_rows(path)
