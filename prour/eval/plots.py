"""PNG plots of evaluation reports: success versus interaction steps, and uncertainty over steps
(the prour paper's Figure 6). matplotlib is imported inside each function (Agg backend)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

UNCERTAINTY_KEYS = (("total", "Total uncertainty"), ("au", "AU (user side)"),
                    ("eu", "EU (world side)"))


@dataclass(frozen=True)
class SystemPoint:
    """One evaluated system: mean total steps per episode and average Pass@1 (%)."""

    label: str
    steps: float
    pass_at_1: float


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, out: str | Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120, bbox_inches="tight")
    _pyplot().close(fig)
    return out


def plot_success_vs_steps(points: Sequence[SystemPoint], out: str | Path) -> Path:
    """One marker per system: x = mean act+clarify+verify turns, y = average Pass@1 (%)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for point in points:
        ax.scatter(point.steps, point.pass_at_1, s=40)
        ax.annotate(point.label, (point.steps, point.pass_at_1), fontsize=7,
                    xytext=(4, 4), textcoords="offset points")
    ax.set_xlabel("total interaction steps per episode (act + clarify + verify)")
    ax.set_ylabel("average Pass@1 (%)")
    ax.set_title("Success versus interaction steps")
    ax.grid(alpha=0.3)
    return _save(fig, out)


def mean_curves(decisions: Sequence[Sequence[Mapping[str, Any]]], max_steps: int = 16,
                ) -> dict[str, list[float | None]]:
    """Mean AU, EU and total at each agent step 0..max_steps-1 over episodes' decision lists;
    None where no episode recorded a decision at that step."""
    curves: dict[str, list[float | None]] = {}
    for key, _ in UNCERTAINTY_KEYS:
        sums, counts = [0.0] * max_steps, [0] * max_steps
        for episode in decisions:
            for record in episode:
                step, value = record.get("step"), record.get(key)
                if value is not None and isinstance(step, int) and 0 <= step < max_steps:
                    sums[step] += float(value)
                    counts[step] += 1
        curves[key] = [s / c if c else None for s, c in zip(sums, counts)]
    return curves


def plot_uncertainty(curves: Mapping[str, Mapping[str, Sequence[float | None]]],
                     out: str | Path) -> Path:
    """Three panels (total, AU, EU), one line per system over agent steps (Figure 6 style)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8), sharex=True)
    for ax, (key, title) in zip(axes, UNCERTAINTY_KEYS):
        for label, by_key in curves.items():
            values = by_key.get(key) or []
            xs = [i + 1 for i, v in enumerate(values) if v is not None]
            ys = [v for v in values if v is not None]
            if xs:
                ax.plot(xs, ys, "-o", markersize=3, label=label)
        ax.set_title(title)
        ax.set_xlabel("agent step")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("nats")
    axes[0].legend(fontsize=7)
    return _save(fig, out)
