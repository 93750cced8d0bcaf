"""PNG plots of evaluation reports: success versus interaction steps, success versus training
step (a checkpoint sweep), and uncertainty over steps (the prour paper's Figure 6), drawn with
the shared helpers of :mod:`prour.plots` (each PNG has its sidecar JSON of what was drawn).
Systems are told apart by marker and legend entry, never by text placed at the point (two
systems on one point would overprint).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prour.plots import MARKERS, padded_limits, pyplot, save_plot

UNCERTAINTY_KEYS = (("total", "Total uncertainty"), ("au", "AU (user side)"),
                    ("eu", "EU (world side)"))
PERCENT = (0.0, 100.0)
PERCENT_FRAMED = (-2.0, 102.0)  # lines at 0 or 100 % stay visible inside the frame


@dataclass(frozen=True)
class SystemPoint:
    """One evaluated system: mean total steps per episode and average Pass@1 (%) with its
    interval [low, high] (%; equal to ``pass_at_1`` when no interval is known)."""

    label: str
    steps: float
    pass_at_1: float
    low: float | None = None
    high: float | None = None


def plot_success_vs_steps(points: Sequence[SystemPoint], out: str | Path) -> Path:
    """One marker per system with its interval as a vertical error bar: x = mean
    act+clarify+verify turns, y = average Pass@1 (%); systems are named in the legend. Markers
    are open and shrink with the system's index, so systems on one point stay visible. A
    percentile interval that misses its estimate (a few draws) gets no bar on that side."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    series: dict[str, Any] = {}
    for i, point in enumerate(points):
        low = point.pass_at_1 if point.low is None else point.low
        high = point.pass_at_1 if point.high is None else point.high
        ax.errorbar(point.steps, point.pass_at_1,
                    yerr=[[max(0.0, point.pass_at_1 - low)], [max(0.0, high - point.pass_at_1)]],
                    fmt=MARKERS[i % len(MARKERS)], markersize=7 + 3 * (len(points) - 1 - i),
                    markerfacecolor="none", markeredgewidth=1.6, capsize=4, clip_on=False,
                    label=point.label)
        series[point.label] = {"x": [point.steps], "y": [point.pass_at_1],
                               "low": [low], "high": [high]}
    xs = [p.steps for p in points]
    ax.set_xlim(*padded_limits(xs, min_span=2.0, bounds=(0.0, math.inf)))
    ys = [v for p in points for v in (p.pass_at_1, p.low, p.high) if v is not None]
    ax.set_ylim(*padded_limits(ys, min_span=10.0, bounds=PERCENT))
    ax.set_xlabel("total interaction steps per episode (act + clarify + verify)")
    ax.set_ylabel("average Pass@1 (%)")
    ax.set_title("Success versus interaction steps")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    return save_plot(fig, out, series)


@dataclass(frozen=True)
class StepPoint:
    """Average Pass@1 (%) of one checkpoint with its interval [low, high] (%)."""

    step: int
    pass_at_1: float
    low: float
    high: float


def plot_success_vs_training_step(curves: Mapping[str, Sequence[StepPoint]], out: str | Path,
                                  references: Mapping[str, StepPoint] | None = None) -> Path:
    """Pass@1 (%) with its interval as error bars against the checkpoint's training step, one
    line per system; systems that use no checkpoint (``references``, e.g. ``base``) are dashed
    horizontal lines, their interval given in the legend (a band would cover the panel). Lines
    are nudged apart sideways (a few % of a step; the sidecar keeps the true steps) so equal
    values stay visible; the legend sits below the axes."""
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    steps = sorted({p.step for points in curves.values() for p in points})
    nudge = 0.06 * min((b - a for a, b in itertools.pairwise(steps)), default=1)
    series: dict[str, Any] = {}
    for i, (label, points) in enumerate(curves.items()):
        points = sorted(points, key=lambda p: p.step)
        shift = (i - (len(curves) - 1) / 2) * nudge
        ax.errorbar([p.step + shift for p in points], [p.pass_at_1 for p in points],
                    yerr=[[max(0.0, p.pass_at_1 - p.low) for p in points],
                          [max(0.0, p.high - p.pass_at_1) for p in points]],
                    fmt="-" + MARKERS[i % len(MARKERS)], markerfacecolor="none", capsize=4,
                    clip_on=False, label=label)
        series[label] = {"x": [p.step for p in points], "y": [p.pass_at_1 for p in points],
                         "low": [p.low for p in points], "high": [p.high for p in points]}
    xlim = padded_limits(steps, min_span=2.0, bounds=(0.0, math.inf))
    for j, (label, ref) in enumerate((references or {}).items()):
        ax.axhline(ref.pass_at_1, linestyle="--", linewidth=1.0, zorder=1,
                   color=f"C{(len(curves) + j) % 10}",
                   label=f"{label}: {ref.pass_at_1:.1f} [{ref.low:.1f}, {ref.high:.1f}] "
                         "(no checkpoint)")
        series[label] = {"x": list(xlim), "y": [ref.pass_at_1] * 2, "low": [ref.low] * 2,
                         "high": [ref.high] * 2, "reference": True}
    ax.set_xlim(*xlim)
    ys = [v for s in series.values() if not s.get("reference") for key in ("y", "low", "high")
          for v in s[key]] + [s["y"][0] for s in series.values() if s.get("reference")]
    ax.set_ylim(*padded_limits(ys, min_span=10.0, bounds=PERCENT_FRAMED))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("training step of the query generator checkpoint")
    ax.set_ylabel("average Pass@1 (%)")
    ax.set_title("Success versus training step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2,
              frameon=False)  # below the axes: full-height error bars leave no free corner
    return save_plot(fig, out, series)


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
    """Three panels (total, AU, EU), one line per system over agent steps (Figure 6 style);
    each panel's y axis spans at least 0.1 nats and starts no lower than 0."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8), sharex=True)
    series: dict[str, Any] = {}
    for ax, (key, title) in zip(axes, UNCERTAINTY_KEYS):
        drawn: list[float] = []
        for i, (label, by_key) in enumerate(curves.items()):
            values = by_key.get(key) or []
            xs = [step + 1 for step, v in enumerate(values) if v is not None]
            ys = [float(v) for v in values if v is not None]
            if xs:
                ax.plot(xs, ys, "-" + MARKERS[i % len(MARKERS)], markersize=3, label=label)
                series.setdefault(key, {})[label] = {"x": xs, "y": ys}
                drawn += ys
        ax.set_ylim(*padded_limits(drawn, min_span=0.1, bounds=(0.0, math.inf)))
        ax.set_title(title)
        ax.set_xlabel("agent step")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("nats")
    axes[0].legend(fontsize=7)
    return save_plot(fig, out, series)


def plot_tradeoff(rows: Sequence[Mapping[str, Any]], key: str, name: str,
                  out: str | Path) -> Path:
    """Success (%) against mean decomposer calls per episode (the prour paper's Figures 5 and
    8): one line per (method, other sweep key's value, domain) through the points of ``key``
    (``budget`` or ``every_n``) in value order, each point's value in the legend order."""
    plt = pyplot()
    other = "every_n" if key == "budget" else "budget"
    lines: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        label = f"{row['method']} {row['domain']}"
        if len({r[other] for r in rows}) > 1:
            label += f" ({other}={'inf' if row[other] is None else row[other]})"
        lines.setdefault(label, []).append(row)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    series: dict[str, Any] = {}
    order = lambda r: (r[key] is None, r[key] if isinstance(r[key], int) else 0)
    for i, (label, points) in enumerate(lines.items()):
        points = sorted(points, key=order)
        xs = [float(p["decomposer_calls"]) for p in points]
        ys = [float(p["success"]) for p in points]
        values = ["inf" if p[key] is None else p[key] for p in points]
        ax.plot(xs, ys, "-" + MARKERS[i % len(MARKERS)], markerfacecolor="none", clip_on=False,
                label=f"{label}: {name} " + ", ".join(map(str, values)))
        series[label] = {"x": xs, "y": ys, name: values}
    xs = [v for s in series.values() for v in s["x"]]
    ax.set_xlim(*padded_limits(xs, min_span=1.0, bounds=(0.0, math.inf)))
    ax.set_ylim(*padded_limits([v for s in series.values() for v in s["y"]], min_span=10.0,
                               bounds=PERCENT_FRAMED))
    ax.set_xlabel("decomposer calls per episode")
    ax.set_ylabel("success (%)")
    ax.set_title(f"Success versus decomposer calls ({name} sweep)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=1, frameon=False)
    return save_plot(fig, out, series)
