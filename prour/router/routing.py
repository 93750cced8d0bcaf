"""AU-first routing (paper Eq. 6) and the per-episode decomposer budget (paper A.2.3)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np
from numpy.typing import ArrayLike

if TYPE_CHECKING:  # pragma: no cover
    from prour.config.router import RouterConfig

Route = Literal["act", "clarify", "verify"]
ROUTES: tuple[str, ...] = ("act", "clarify", "verify")


class HasUncertainty(Protocol):
    au: float
    eu: float


def check_route(value: str, key: str = "route") -> str:
    """Return ``value`` if it is one of the three route names, else raise naming ``key``."""
    if value not in ROUTES:
        raise ValueError(f"{key} must be one of {', '.join(ROUTES)}; got {value!r}")
    return value


def route(uncertainty: HasUncertainty, tau_au: float, tau_eu: float) -> str:
    """AU >= τ_AU → clarify; else EU >= τ_EU → verify; else act."""
    if uncertainty.au >= tau_au:
        return "clarify"
    if uncertainty.eu >= tau_eu:
        return "verify"
    return "act"


def route_many(au: ArrayLike, eu: ArrayLike, tau_au: float, tau_eu: float) -> np.ndarray:
    """Vectorized :func:`route`: arrays [N] of AU and EU -> array [N] of route names."""
    au_arr, eu_arr = np.asarray(au, dtype=np.float64), np.asarray(eu, dtype=np.float64)
    return np.where(au_arr >= tau_au, "clarify", np.where(eu_arr >= tau_eu, "verify", "act"))


@dataclass
class DecomposerBudget:
    """When to run the decomposer within one episode.

    ``every_n``: run at decision steps 0, n, 2n, ...; ``max_calls``: at most this many runs per
    episode (None: unlimited). Steps where it does not run go to the base agent (route ``act``).
    Both come from the recipe (:func:`episode_budget`; defaults in ``router``).
    """

    max_calls: int | None
    every_n: int
    steps: int = 0
    calls: int = 0
    skipped: int = 0

    def __post_init__(self) -> None:
        if self.every_n < 1:
            raise ValueError(f"every_n must be >= 1, got {self.every_n}")
        if self.max_calls is not None and self.max_calls < 0:
            raise ValueError(f"max_calls must be None or >= 0, got {self.max_calls}")

    @property
    def exhausted(self) -> bool:
        return self.max_calls is not None and self.calls >= self.max_calls

    def allow(self) -> bool:
        """Advance one decision step; True (and one call charged) if the decomposer runs now."""
        index = self.steps
        self.steps += 1
        if self.exhausted or index % self.every_n:
            self.skipped += 1
            return False
        self.calls += 1
        return True


def episode_budget(router: RouterConfig) -> DecomposerBudget:
    """A fresh per-episode budget from ``router.budget`` and ``router.every_n``."""
    return DecomposerBudget(max_calls=router.budget, every_n=router.every_n)
