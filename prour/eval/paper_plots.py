"""The figures of :mod:`prour.eval.paper`: the run's curves with the paper's published values
drawn apart from them (black stars or black dotted lines, labelled ``paper``). Each PNG gets the
sidecar of :mod:`prour.plots`: ``series`` maps a panel to its drawn series (``source`` ``run``
or ``paper``) and ``missing`` lists what the run lacks, which the picture also prints under the
axes (a panel with no run data says so where the curves would be)."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prour.eval.paper import FIGURE4_KEYS, Item, SweepPoint, paper_value, paper_values
from prour.plots import MARKERS, padded_limits, pyplot, save_plot

PAPER_STYLE = {"color": "black", "marker": "*", "markersize": 13, "linestyle": "--",
               "linewidth": 1.0, "zorder": 5}
PAPER_LINE = {"color": "black", "linestyle": ":", "linewidth": 1.4, "zorder": 4}


def _no_run_data(ax: Any) -> None:
    ax.text(0.5, 0.5, "no data from this run\n(what is missing: below)", ha="center",
            va="center", transform=ax.transAxes, fontsize=9, color="#a33")


def _finish(fig: Any, item: Item, out: Path, series: dict[str, Any]) -> Path:
    """Print what is missing under the axes and save the PNG with its sidecar."""
    if item.missing:
        wrapped = [textwrap.fill(f"missing: {line}", 150) for line in item.missing]
        fig.text(0.01, 0.0, "\n".join(wrapped), ha="left", va="top", fontsize=7, color="#a33")
    return save_plot(fig, out, {**series, "missing": list(item.missing)})


def _legend(ax: Any) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="best")


# ---- Figure 4 ------------------------------------------------------------------------------


def plot_training(records: Sequence[Mapping[str, Any]], item: Item, out: Path) -> Path:
    """(a) prior and posterior log-likelihood, (b) mean reward overall and per mode, over
    training steps; the paper's final reward as a dotted line."""
    from prour.train.report import series as logged

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    drawn: dict[str, Any] = {}
    for ax, (panel, keys) in zip(axes, FIGURE4_KEYS.items()):
        drawn[panel] = {}
        for i, (key, label) in enumerate(keys):
            xs, ys = logged(records, key)
            if xs:
                ax.plot(xs, ys, "-" + MARKERS[i], markersize=4, label=f"this run: {label}")
                drawn[panel][label] = {"key": key, "x": xs, "y": ys, "source": "run"}
        if not drawn[panel]:
            _no_run_data(ax)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    final = paper_value("figure4", metric="reward")
    axes[1].axhline(final.value, **PAPER_LINE,
                    label=f"paper: ≈{final.text} after {final.at['step']:,} steps")
    drawn["reward"]["paper"] = {"x": [final.at["step"]], "y": [final.value], "source": "paper",
                                "drawn": "horizontal line"}
    values = [y for s in drawn["reward"].values() for y in s["y"]]
    axes[1].set_ylim(*padded_limits(values, min_span=0.2))
    axes[0].set_title("(a) log-likelihood of the target")
    axes[0].set_ylabel("mean log-prob (nats)")
    axes[1].set_title("(b) reward R = ℓ_post − ℓ_prior")
    axes[1].set_ylabel("mean reward")
    for ax in axes:
        _legend(ax)
    return _finish(fig, item, out, drawn)


# ---- Figures 5 and 8 -----------------------------------------------------------------------

SWEEP_PANELS = {"budget": (("pass_at_1", "average Pass@1 (%)"), ("steps", "total steps")),
                "every_n": (("pass_at_1", "average Pass@1 (%)"), ("steps", "total steps"),
                            ("seconds", "wall-clock seconds"))}
POINT_FIELD = {"pass_at_1": "success", "steps": "steps", "seconds": "seconds"}


def _positions(points: Sequence[SweepPoint], name: str, key: str) -> dict[int | None, int]:
    """Sweep value → x position (values in order, an unlimited budget last), the paper's
    values included."""
    values = {p.value for p in points} | {v.at[name] for v in paper_values(key) if name in v.at}
    ordered = sorted(values, key=lambda v: (v is None, v or 0))
    return {v: i for i, v in enumerate(ordered)}


def _run_lines(ax: Any, points: Sequence[SweepPoint], metric: str,
               where: Mapping[int | None, int]) -> dict[str, Any]:
    """One line per method through its measured points, in sweep-value order."""
    drawn: dict[str, Any] = {}
    methods = list(dict.fromkeys(p.method for p in points))
    for i, method in enumerate(methods):
        mine = [p for p in points if p.method == method
                and getattr(p, POINT_FIELD[metric]) is not None]
        mine.sort(key=lambda p: where[p.value])
        if not mine:
            continue
        ys = [float(getattr(p, POINT_FIELD[metric])) for p in mine]
        ax.plot([where[p.value] for p in mine], ys, "-" + MARKERS[i % len(MARKERS)],
                markerfacecolor="none", label=f"this run: {method}")
        drawn[method] = {"x": ["unlimited" if p.value is None else p.value for p in mine],
                         "y": ys, "folder": [p.folder for p in mine], "source": "run"}
    return drawn


def _paper_marks(ax: Any, key: str, name: str, metric: str,
                 where: Mapping[int | None, int]) -> dict[str, Any]:
    """The paper's values of one panel: stars at their sweep value, a dotted line where the
    text gives no value."""
    drawn: dict[str, Any] = {}
    found = paper_values(key, metric=metric)
    placed = sorted((v for v in found if name in v.at), key=lambda v: where[v.at[name]])
    target = ax.twinx() if metric == "seconds" and placed else ax  # paper seconds: own scale
    if placed:
        ys = [v.value for v in placed]
        target.plot([where[v.at[name]] for v in placed], ys, **PAPER_STYLE, label="paper")
        drawn["paper"] = {"x": [v.at[name] for v in placed], "y": ys, "source": "paper"}
        if target is not ax:
            target.set_ylabel("paper: wall-clock seconds (right axis)")
            target.set_ylim(*padded_limits(ys, min_span=10.0, bounds=(0.0, math.inf)))
            target.legend(fontsize=7, loc="lower right")
    for v in (v for v in found if name not in v.at):
        ax.axhline(v.value, **PAPER_LINE, label=f"paper: {v.shown()} at a {name} it does "
                                                f"not state")
        drawn[f"paper ({v.id})"] = {"x": [], "y": [v.value], "source": "paper",
                                    "drawn": "horizontal line"}
    return drawn


def plot_sweep(points: Sequence[SweepPoint], name: str, item: Item, out: Path) -> Path:
    """Figure 5 (``budget``) or 8 (``every_n``): per panel, the run's methods over the sweep
    values (the main evaluation's point among them) and the paper's points."""
    plt = pyplot()
    panels = SWEEP_PANELS[name]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2))
    where = _positions(points, name, item.key)
    series: dict[str, Any] = {}
    for ax, (metric, ylabel) in zip(axes, panels):
        series[metric] = _run_lines(ax, points, metric, where)
        if not series[metric]:
            _no_run_data(ax)
        series[metric].update(_paper_marks(ax, item.key, name, metric, where))
        ax.set_xticks(list(where.values()),
                      ["unlimited" if v is None else str(v) for v in where])
        ax.set_xlim(-0.5, max(len(where) - 0.5, 0.5))
        ax.set_xlabel(f"router.{name}")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        _legend(ax)
    fig.suptitle(item.title, fontsize=10)
    return _finish(fig, item, out, series)


# ---- Figure 6 ------------------------------------------------------------------------------


def plot_uncertainty(curves: Mapping[str, Mapping[str, Sequence[float | None]]], item: Item,
                     out: Path) -> Path:
    """Total, AU and EU per agent step, one line per system; the paper's Prour values as stars
    (total and EU: first and last of the 16 steps)."""
    from matplotlib.ticker import MaxNLocator

    from prour.eval.plots import UNCERTAINTY_KEYS

    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.0), sharex=True)
    series: dict[str, Any] = {}
    for ax, (key, title) in zip(axes, UNCERTAINTY_KEYS):
        series[key] = {}
        for i, (label, by_key) in enumerate(curves.items()):
            values = by_key.get(key) or []
            xs = [step + 1 for step, v in enumerate(values) if v is not None]
            if xs:
                ys = [float(v) for v in values if v is not None]
                ax.plot(xs, ys, "-" + MARKERS[i % len(MARKERS)], markersize=3,
                        label=f"this run: {label}")
                series[key][label] = {"x": xs, "y": ys, "source": "run"}
        if not series[key]:
            _no_run_data(ax)
        paper = sorted(paper_values("figure6", metric=key), key=lambda v: v.at["step"])
        if paper:
            ax.plot([v.at["step"] for v in paper], [v.value for v in paper], **PAPER_STYLE,
                    label="paper: Prour")
            series[key]["paper: Prour"] = {"x": [v.at["step"] for v in paper],
                                           "y": [v.value for v in paper], "source": "paper"}
        drawn = [y for s in series[key].values() for y in s["y"]]
        ax.set_ylim(*padded_limits(drawn, min_span=0.1, bounds=(0.0, math.inf)))
        ax.set_title(title)
        ax.set_xlabel("agent step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("nats")
    axes[0].legend(fontsize=7)
    return _finish(fig, item, out, series)


# ---- Figure 7 ------------------------------------------------------------------------------

ROUTERS = (("decomposer", "calibrated decomposer"), ("llm_router", "prompted LLM router"))


def plot_router_f1(drawn: Mapping[str, float], item: Item, out: Path) -> Path:
    """Held-out macro-F1 (%) per router: the run's bar beside the paper's (hatched, black)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    series: dict[str, Any] = {"macro_f1": {}}
    run = {"x": [], "y": [], "source": "run"}
    paper = {"x": [], "y": [], "source": "paper"}
    for i, (label, name) in enumerate(ROUTERS):
        if label in drawn:
            ax.bar(i - 0.2, drawn[label], 0.38, color="C0",
                   label="this run" if not run["x"] else None)
            ax.text(i - 0.2, drawn[label] + 1, f"{drawn[label]:.2f}", ha="center", fontsize=8)
            run["x"].append(label)
            run["y"].append(drawn[label])
        else:
            ax.text(i - 0.2, 2, "no run value", ha="center", fontsize=8, color="#a33",
                    rotation=90)
        value = paper_value("figure7", metric="macro_f1", label=label)
        ax.bar(i + 0.2, value.value, 0.38, color="white", edgecolor="black", hatch="//",
               label="paper" if not paper["x"] else None)
        ax.text(i + 0.2, value.value + 1, value.text, ha="center", fontsize=8)
        paper["x"].append(label)
        paper["y"].append(value.value)
    series["macro_f1"] = {"this run": run, "paper": paper}
    ax.set_xticks(range(len(ROUTERS)), [name for _, name in ROUTERS])
    ax.set_ylim(0, 105)
    ax.set_ylabel("held-out macro-F1 (%)")
    ax.set_title("Routing macro-F1 on the held-out states")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, loc="upper right")
    return _finish(fig, item, out, series)


# ---- Figure 2 ------------------------------------------------------------------------------

SIDE_COLOURS = {"world": "C0", "user": "C1"}


def plot_sources(drawn: Mapping[str, Any], labels: Mapping[str, Any], item: Item,
                 out: Path) -> Path:
    """(a) the world and user sides' share of the events: the run's bars beside the paper's
    (hatched, black); (b) the run's events per source, coloured by side. ``labels``: the labels
    file the counts come from (:func:`prour.data.taxonomy_labels.drawn_from`), kept in the
    sidecar so that a later report can tell whether they changed."""
    from prour.data.taxonomy_labels import side_of

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [1, 1.6]})
    run: dict[str, Any] = {"x": [], "y": [], "events": [], "source": "run"}
    paper: dict[str, Any] = {"x": [], "y": [], "events": [], "source": "paper"}
    for i, side in enumerate(("world", "user")):
        if drawn:
            share = drawn["shares"][side]
            axes[0].bar(i - 0.2, share, 0.38, color=SIDE_COLOURS[side],
                        label="this run" if not run["x"] else None)
            axes[0].text(i - 0.2, share + 1.5, f"{share:.1f}", ha="center", fontsize=8)
            run["x"].append(side)
            run["y"].append(share)
            run["events"].append(drawn["events"][side])
        share = paper_value("figure2", metric="share", label=side)
        events = paper_value("table5", metric="events", label=side)
        axes[0].bar(i + 0.2, share.value, 0.38, color="white", edgecolor="black", hatch="//",
                    label="paper" if not paper["x"] else None)
        axes[0].text(i + 0.2, share.value + 1.5, share.text, ha="center", fontsize=8)
        paper["x"].append(side)
        paper["y"].append(share.value)
        paper["events"].append(int(events.value))
    if not drawn:
        _no_run_data(axes[0])
    axes[0].set_xticks([0, 1], ["world side\n(epistemic)", "user side\n(aleatoric)"])
    axes[0].set_ylim(0, 105)
    axes[0].set_ylabel("share of the events (%)")
    axes[0].set_title("(a) where the missing information lives")
    axes[0].grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8, loc="upper right")
    sources: dict[str, Any] = {}
    if drawn:
        names = list(drawn["sources"])
        counts = [drawn["sources"][name] for name in names]
        axes[1].bar(range(len(names)), counts,
                    color=[SIDE_COLOURS[side_of(name)] for name in names])
        axes[1].set_xticks(range(len(names)), names, rotation=20)
        axes[1].set_ylim(0, max(max(counts), 1) * 1.15)
        sources["this run"] = {"x": names, "y": counts,
                               "side": [side_of(name) for name in names], "source": "run"}
    else:
        _no_run_data(axes[1])
    axes[1].set_ylabel("events")
    axes[1].set_title("(b) this run's events per source (the paper's per-case counts: not in "
                      "our copy)", fontsize=9)
    axes[1].grid(alpha=0.3, axis="y")
    fig.suptitle(item.title, fontsize=10)
    return _finish(fig, item, out, {"share": {"this run": run, "paper": paper},
                                    "sources": sources, "labels": dict(labels)})
