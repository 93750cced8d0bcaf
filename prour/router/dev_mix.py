"""The dev set's label mix (paper A.2.2: 60 clarify, 90 verify, 90 act).

The dev candidates (every decision state of the reserve-task trajectories, in a seeded order)
are annotated in that order; a state is kept while the quota of its label is open. The walk
stops when every quota is met or the candidates run out. Which states are kept is a function of
the candidate order and the labels alone (``corrected`` winning), so a reviewer's correction
changes the kept set the next time it is read, and annotating in chunks never changes it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prour.router.routing import ROUTES
from prour.router.thresholds import calibration_dir

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe

MIX_NAME = "dev_mix.json"
MIX_ORDER = ("clarify", "verify", "act")  # the order the paper states the mix in


@dataclass
class Mix:
    """The outcome of walking the candidates against the quotas.

    ``kept``: state ids kept, in candidate order; ``counts``: kept per route; ``pending``: the
    index of the first candidate the walk needs a label for (None: the walk ended);
    ``unusable``: candidates met with no usable label (left out); ``walked``: candidates read."""

    quotas: dict[str, int]
    kept: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ROUTES, 0))
    pending: int | None = None
    unusable: list[str] = field(default_factory=list)
    walked: int = 0

    @property
    def met(self) -> bool:
        return all(self.counts[name] >= want for name, want in self.quotas.items())

    def short(self) -> dict[str, int]:
        """Route -> states missing from its quota (only the short ones)."""
        return {name: self.quotas[name] - self.counts[name] for name in MIX_ORDER
                if name in self.quotas and self.counts[name] < self.quotas[name]}

    def line(self) -> str:
        """``dev mix: 60 clarify / 90 verify / 71 act (target 60/90/90; act short: ...)``."""
        order = [name for name in MIX_ORDER if name in self.quotas]
        reached = " / ".join(f"{self.counts[name]} {name}" for name in order)
        target = "/".join(str(self.quotas[name]) for name in order)
        short = self.short()
        why = ("" if not short else
               f"; {', '.join(short)} short: candidates ran out" if self.pending is None else
               f"; {', '.join(short)} short: candidates not labelled yet")
        return f"dev mix: {reached} (target {target}{why})"

    def to_dict(self) -> dict:
        return {"schema": "prour.dev-mix/1", "target": self.quotas, "reached": self.counts,
                "short": self.short(), "complete": self.pending is None,
                "candidates_walked": self.walked, "unusable": self.unusable,
                "kept": self.kept}


def fill_quotas(order: Sequence[str], labels: Mapping[str, str | None],
                quotas: Mapping[str, int]) -> Mix:
    """Walk ``order`` keeping a state while its label's quota is open.

    ``labels``: state id -> route, or None for a reply that is no label; an id missing from it
    is not annotated yet: the walk stops there (``pending``) unless every quota is met."""
    mix = Mix(dict(quotas))
    for index, state_id in enumerate(order):
        if mix.met:
            break
        if state_id not in labels:
            mix.pending = index
            break
        mix.walked = index + 1
        label = labels[state_id]
        if label is None:
            mix.unusable.append(state_id)
        elif mix.counts[label] < mix.quotas.get(label, 0):
            mix.counts[label] += 1
            mix.kept.append(state_id)
    return mix


def remaining(mix: Mix) -> int:
    """States still wanted: the sum of the open quotas."""
    return sum(mix.short().values())


def mix_path(recipe: Recipe) -> Path:
    """Where the dev labels' mix (target, reached, kept ids) is stored."""
    return calibration_dir(recipe) / MIX_NAME


def read_mix(recipe: Recipe) -> dict[str, Any]:
    """The stored mix record (:func:`mix_path`; empty when there is none or it is unreadable)."""
    try:
        record = json.loads(mix_path(recipe).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return record if isinstance(record, dict) else {}
