"""Training instances and the order they are visited in: a seeded shuffle per epoch.

The order is a pure function of (seed, number of rows, step), so a resumed run visits exactly
the states an uninterrupted run would have, without storing the permutation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


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


def read_instances(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a split parquet file (the data stage's schema) as plain dicts."""
    from prour.data.dataset import read_rows

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"training data not found: {path} (run `prour extract` first, or set train.train_file)"
        )
    return read_rows(path)
