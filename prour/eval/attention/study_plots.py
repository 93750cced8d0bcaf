"""Drawing the Ask-Less study report's figures (the series of :mod:`study_figures`). Each PNG is
written by :func:`prour.plots.save_plot` with its sidecar JSON: ``series`` as drawn (``source``
``run`` or ``paper``) and ``missing``, what the run lacks, which the picture also prints under
its axes. The paper's points are drawn hollow with dashed lines in the colour of the backbone
whose paper model they are."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prour.eval.attention.study_items import StudyItem
from prour.plots import padded_limits, pyplot, save_plot

PAPER_MEAN = ("paper points: the mean of the listed cells of the model's table (Tables 29-36) "
              "over the three tau domains retail, airline and telecom only (the paper's figure "
              "averages four domains); No-ask at A = 0")
PAPER_CELL = ("paper points: the listed cell of this domain in the model's table (Tables 29-36); "
              "No-ask at A = 0")
SHAPES = {"no-ask": "s", "budgeted": "o", "unrestricted": "D", "frugal": "^",
          "voi-gate-as-run": "v", "budgeted+mgr": "P"}


def shape(label: str) -> str:
    return SHAPES.get(label.split("@")[0].split("(")[0], "X")


def _no_data(ax: Any) -> None:
    ax.text(0.5, 0.5, "no data from this run\n(what is missing: below)", ha="center",
            va="center", transform=ax.transAxes, fontsize=9, color="#a33")


def _finish(fig: Any, item: StudyItem, out: Path, series: dict[str, Any]) -> Path:
    """Print what is missing under the axes; save the PNG and its sidecar."""
    if item.missing:
        shown = item.missing[:8] + ([f"... and {len(item.missing) - 8} more"]
                                    if len(item.missing) > 8 else [])
        text = "\n".join(textwrap.fill(f"missing: {m}", 140) for m in shown)
        fig.text(0.01, -0.02, text, ha="left", va="top", fontsize=7, color="#a33")
    return save_plot(fig, out, {**series, "missing": list(item.missing)})


def _legend(ax: Any, outside: bool = True) -> None:
    """The legend, right of the axes (or inside, in its lower right corner)."""
    if not ax.get_legend_handles_labels()[0]:
        return
    if outside:
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    else:
        ax.legend(fontsize=6, loc="lower right")


def _points(ax: Any, points: Sequence[Mapping[str, Any]], color: str, label: str,
            line: bool, published: bool = False) -> dict[str, Any]:
    """Draw points (a connected path or markers); returns their series."""
    xs, ys = [p["A"] for p in points], [p["R"] for p in points]
    if line and points:
        ax.plot(xs, ys, "--" if published else "-", color=color, linewidth=1.0 if published else 1.5,
                label=label)
    for p in points:
        ax.plot(p["A"], p["R"], shape(p["label"]), color=color, markersize=7,
                markerfacecolor="none" if published else color,
                label=None if line else f"{p['label']} ({label})")
    series = {"x": xs, "y": ys, "labels": [p["label"] for p in points],
              "source": "paper" if published else "run"}
    if published:
        series["cells"] = [c for p in points for c in p["cells"]]
    return series


def _draw_backbones(ax: Any, entries: Mapping[str, Mapping[str, Any]], path_key: str,
                    note: str) -> dict[str, Any]:
    """Every backbone's path and markers, and its paper model's points (``note``: how those
    were computed, kept in the sidecar)."""
    series: dict[str, Any] = {}
    for i, (backbone, entry) in enumerate(entries.items()):
        color = f"C{i % 10}"
        series[backbone] = _points(ax, entry[path_key], color, backbone, True)
        if entry["markers"]:
            series[f"{backbone}: markers"] = _points(ax, entry["markers"], color, backbone,
                                                     False)
        if entry["paper"]:
            on_path = [p for p in entry["paper"] if p["label"].startswith(("no-ask", "budgeted@",
                                                                          "unrestricted"))]
            others = [p for p in entry["paper"] if p not in on_path]
            name = f"paper: {entry['model']} ({backbone})"
            series[name] = {**_points(ax, on_path, color, name, True, published=True), "note": note}
            if others:
                series[f"{name} markers"] = {**_points(ax, others, color, name, False,
                                                       published=True), "note": note}
    return series


def _limits(ax: Any, series: Mapping[str, Any]) -> None:
    xs = [x for s in series.values() for x in s["x"]]
    ys = [y for s in series.values() for y in s["y"]]
    ax.set_xlim(*padded_limits(xs, min_span=0.5))  # A >= 0: the pad keeps No-ask whole
    ax.set_ylim(*padded_limits(ys, min_span=0.1))


def plot_figure3(drawn: Mapping[str, Any], item: StudyItem, out: Path) -> Path:
    fig, ax = pyplot().subplots(figsize=(7.5, 5.2))
    series = _draw_backbones(ax, drawn, "path", PAPER_MEAN)
    if not series:
        _no_data(ax)
    _limits(ax, series)
    ax.set_xlabel("user-attention cost A per session (prour scale)")
    ax.set_ylabel("reward R")
    ax.set_title("No-ask (square) → Budgeted N=1-3 (dots) → Unrestricted (diamond)")
    ax.grid(alpha=0.3)
    _legend(ax)
    return _finish(fig, item, out, series)


def plot_figure5(drawn: Mapping[str, Any], item: StudyItem, out: Path) -> Path:
    domains = list(drawn) or ["(no domain)"]
    fig, axes = pyplot().subplots(1, len(domains), figsize=(5.2 * len(domains), 4.4),
                                  squeeze=False)
    series: dict[str, Any] = {}
    for ax, domain in zip(axes[0], domains):
        series[domain] = _draw_backbones(ax, drawn.get(domain, {}), "curve", PAPER_CELL)
        if not series[domain]:
            _no_data(ax)
        _limits(ax, series[domain])
        ax.set_title(domain)
        ax.set_xlabel("cost A per session")
        ax.grid(alpha=0.3)
    _legend(axes[0][-1])
    axes[0][0].set_ylabel("reward R")
    return _finish(fig, item, out, series)


PANEL_TITLES = {"saved": "(a) attention cost saved (%)",
                "value": "(b) change in judged value (Ṽ points)",
                "reward": "(c) ΔR at equal cost (points)"}


def plot_figure4(data: Mapping[str, Any], item: StudyItem, out: Path) -> Path:
    """Three forest panels: one row per backbone, the all-backbone diamond last, the paper's
    all-model value as a black hollow diamond beside it."""
    rows = list(data["backbones"])
    fig, axes = pyplot().subplots(1, 3, figsize=(13, 1.2 + 0.5 * max(len(rows), 2)),
                                  sharey=True)
    series: dict[str, Any] = {}
    for ax, (key, title) in zip(axes, PANEL_TITLES.items()):
        series[key] = {}
        for y, backbone in enumerate(reversed(rows)):
            result = data["backbones"][backbone][key]
            if result is None or result["estimate"] is None:
                continue
            low, high = result["low"], result["high"]
            err = [[max(0.0, result["estimate"] - low)], [max(0.0, high - result["estimate"])]] \
                if low is not None else None  # a percentile interval may miss its estimate
            ax.errorbar(result["estimate"], y, xerr=err, fmt="D" if y == 0 else "o",
                        color="C0", markersize=8 if y == 0 else 5, capsize=3)
            series[key][backbone] = {**result, "y": y, "source": "run"}
        paper = data["paper"].get(key)
        if paper is not None:
            ax.plot(paper["estimate"], -0.35, "D", color="black", markerfacecolor="none",
                    markersize=9, label="paper: all eight models")
            series[key]["paper"] = {**paper, "y": -0.35, "source": "paper"}
        if not any(v.get("source") == "run" for v in series[key].values()):
            _no_data(ax)
        ax.axvline(0.0, color="grey", linewidth=0.8)
        ax.set_title(title)
        ax.grid(alpha=0.3, axis="x")
        _legend(ax, outside=False)
    axes[0].set_yticks(range(len(rows)), list(reversed(rows)) or [""])
    axes[0].set_ylim(-0.8, max(len(rows), 1) - 0.4)
    return _finish(fig, item, out, series)


def plot_figure6(drawn: Mapping[str, Any], item: StudyItem, out: Path) -> Path:
    """Bars of asking efficiency per backbone (Budgeted N=3 beside Unrestricted), with 95%
    intervals; both bars hatched where Unrestricted shows no clear gain over No-ask."""
    backbones = list(drawn)
    fig, ax = pyplot().subplots(figsize=(max(6.0, 1.6 * len(backbones) + 2), 4.4))
    series: dict[str, Any] = {}
    for i, backbone in enumerate(backbones):
        entry = drawn[backbone]
        series[backbone] = {"hatched": entry["hatched"]}
        for offset, (policy, color) in zip((-0.2, 0.2), (("budgeted@3", "C0"),
                                                          ("unrestricted", "C3"))):
            value = entry.get(policy) or {}
            if value.get("estimate") is None:
                continue
            err = None if value.get("low") is None else [
                [max(0.0, value["estimate"] - value["low"])],
                [max(0.0, value["high"] - value["estimate"])]]
            ax.bar(i + offset, value["estimate"], 0.38, color=color, yerr=err, capsize=3,
                   hatch="//" if entry["hatched"] else None, edgecolor="black",
                   label=policy if i == 0 else None)
            series[backbone][policy] = {k: value.get(k) for k in ("estimate", "low", "high")}
    if not backbones:
        _no_data(ax)
    ax.set_xticks(range(len(backbones)), backbones or [""])
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_ylabel("(R − R_no-ask) / A")
    ax.set_title("Asking efficiency (hatched: Unrestricted gains nothing clear over No-ask)")
    ax.grid(alpha=0.3, axis="y")
    _legend(ax)
    return _finish(fig, item, out, series)


def plot_figure7(drawn: Mapping[str, Any], item: StudyItem, out: Path) -> Path:
    """One panel per backbone: U(λ) per policy on a log λ axis; the paper's U at λ = 0.03."""
    backbones = list(drawn) or ["(no backbone)"]
    fig, axes = pyplot().subplots(1, len(backbones), figsize=(5.5 * len(backbones), 4.4),
                                  squeeze=False)
    series: dict[str, Any] = {}
    for ax, backbone in zip(axes[0], backbones):
        entry = drawn.get(backbone, {"lines": {}, "paper": {}})
        series[backbone] = {}
        for i, (label, line) in enumerate(entry["lines"].items()):
            ax.plot(line["x"], line["y"], "-", color=f"C{i % 10}", label=label, linewidth=1.3)
            series[backbone][label] = {"x": line["x"], "y": line["y"], "source": "run"}
        for k, (label, value) in enumerate(entry["paper"].items()):
            ax.plot(0.03, value["U"], "*", color="black", markersize=10,
                    label=None if k else f"paper: {entry.get('model')}, U at λ = 0.03")
            series[backbone][f"paper: {label}"] = {"x": [0.03], "y": [value["U"]],
                                                   "cells": value["cells"], "source": "paper"}
        if not entry["lines"]:
            _no_data(ax)
        ax.axvline(0.03, color="grey", linestyle="--", linewidth=1.0)
        ax.set_xscale("log")
        ax.set_xlim(1e-3, 1.0)
        ax.set_xlabel("λ (attention price)")
        ax.set_title(backbone + (f" (paper: {entry.get('model')})" if entry.get("model")
                                 else ""))
        ax.grid(alpha=0.3)
        if entry["paper"] and ax is not axes[0][-1]:
            stars = [(h, t) for h, t in zip(*ax.get_legend_handles_labels())
                     if t.startswith("paper")]
            ax.legend(*zip(*stars), fontsize=6, loc="lower left")
    _legend(axes[0][-1])
    axes[0][0].set_ylabel("utility U = R − λ·A")
    return _finish(fig, item, out, series)


def plot_figure8(drawn: Mapping[str, Any], item: StudyItem, out: Path) -> Path:
    """Grouped bars per domain, one bar per backbone: messages per session (top) and reward
    gain over No-ask in points (bottom, the paper model's gain as a black star)."""
    backbones = list(drawn)
    domains = list(dict.fromkeys(d for e in drawn.values() for d in e))
    fig, axes = pyplot().subplots(2, 1, figsize=(max(6.0, 2.4 * len(domains) + 2), 7.0),
                                  sharex=True)
    width = 0.8 / max(len(backbones), 1)
    series: dict[str, Any] = {"messages": {}, "gain": {}}
    for ax, key in zip(axes, ("messages", "gain")):
        for i, backbone in enumerate(backbones):
            offset = (i - (len(backbones) - 1) / 2) * width
            field = "requests" if key == "messages" else "gain"
            xs = [j for j, d in enumerate(domains) if drawn[backbone][d][field] is not None]
            ys = [drawn[backbone][domains[j]][field] for j in xs]
            ax.bar([x + offset for x in xs], ys, width * 0.95, color=f"C{i % 10}",
                   label=backbone)
            series[key][backbone] = {"x": [domains[j] for j in xs], "y": ys, "source": "run"}
            if key == "gain":
                paper = [(j, drawn[backbone][d]["paper_gain"]) for j, d in enumerate(domains)
                         if drawn[backbone][d]["paper_gain"]]
                if paper:
                    name = f"paper: {paper[0][1]['model']} ({backbone})"
                    ax.plot([j + offset for j, _ in paper], [p["gain"] for _, p in paper], "*",
                            color="black", markersize=9, label=name)
                    series[key][name] = {
                        "x": [domains[j] for j, _ in paper], "y": [p["gain"] for _, p in paper],
                        "cells": [c for _, p in paper for c in p["cells"]], "source": "paper"}
        if not backbones:
            _no_data(ax)
        ax.axhline(0.0, color="grey", linewidth=0.8)
        ax.grid(alpha=0.3, axis="y")
        _legend(ax)
    axes[0].set_ylabel("discretionary messages per session")
    axes[0].set_title("Unrestricted: asking frequency (top) and reward gain over No-ask (bottom)")
    axes[1].set_ylabel("R gain over No-ask (points)")
    axes[1].set_xticks(range(len(domains)), domains or [""])
    return _finish(fig, item, out, series)
