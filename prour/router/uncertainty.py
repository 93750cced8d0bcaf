"""Aleatoric / epistemic split of next-action uncertainty (paper 3.2, Eq. 4-5), in nats.

``probs`` has shape [K, C]: row k is the next-action distribution over the shared candidate set C
under goal interpretation k. EU is the mean row entropy (what stays uncertain once the goal is
fixed); AU is the mutual information H(mean row) - EU (how much the goals disagree).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

ROW_SUM_ATOL = 1e-6


@dataclass(frozen=True)
class Uncertainty:
    """AU (mutual information), EU (mean conditional entropy) and total = H(p̄) = AU + EU, nats."""

    au: float
    eu: float
    total: float

    def to_dict(self) -> dict[str, float]:
        return {"au": self.au, "eu": self.eu, "total": self.total}


def entropy(probs: np.ndarray) -> np.ndarray:
    """Shannon entropy in nats along the last axis, with 0·log 0 taken as 0. [..., C] -> [...]."""
    safe = np.where(probs > 0, probs, 1.0)
    return -np.sum(np.where(probs > 0, probs * np.log(safe), 0.0), axis=-1)


def _finite_matrix(values: ArrayLike, name: str) -> np.ndarray:
    """``values`` as a float64 [K, C] array with K, C >= 1 and no NaN or infinity."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 2 or array.shape[0] < 1 or array.shape[1] < 1:
        raise ValueError(f"{name} must have shape [K, C] with K, C >= 1, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return array


def _as_distributions(probs: ArrayLike) -> np.ndarray:
    """Check that ``probs`` is a [K, C] array of finite, non-negative rows summing to one."""
    array = _finite_matrix(probs, "probs")
    if np.any(array < 0):
        row = int(np.argwhere(array < 0)[0][0])
        raise ValueError(f"probs row {row} has negative entries: {array[row].tolist()}")
    sums = array.sum(axis=1)
    bad = np.flatnonzero(np.abs(sums - 1.0) > ROW_SUM_ATOL)
    if bad.size:
        row = int(bad[0])
        raise ValueError(
            f"each row of probs must sum to 1 (±{ROW_SUM_ATOL}); row {row} sums to {sums[row]!r}"
        )
    return array


def decompose(probs: ArrayLike) -> Uncertainty:
    """Split the entropy of the mean action distribution into AU + EU. probs: [K, C] rows."""
    array = _as_distributions(probs)
    eu = float(np.mean(entropy(array)))
    total = float(entropy(array.mean(axis=0)))
    au = max(total - eu, 0.0)  # mutual information is >= 0; clip float round-off only
    return Uncertainty(au=au, eu=eu, total=total)


def softmax_over_candidates(loglik: ArrayLike) -> np.ndarray:
    """Normalize summed log-likelihoods [K, C] over the candidate axis into distributions [K, C]."""
    array = _finite_matrix(loglik, "loglik")
    shifted = array - array.max(axis=1, keepdims=True)
    weights = np.exp(shifted)
    return weights / weights.sum(axis=1, keepdims=True)
