"""The training report: curves of a training run's step metrics as PNGs (with the sidecar series
of :mod:`prour.plots`) and a markdown summary.

Both backends are read: the local trainer's ``metrics.jsonl`` (one flat JSON object per step)
and verl's file logger (``{"step": N, "data": {...}}`` per step, in ``metrics.jsonl`` and, after
each resume, ``metrics.from_step_N.jsonl``). verl's names are mapped onto the local ones
(:data:`VERL_NAMES`; the shared diagnostics arrive as ``training/prour/<name>``), so one report
reads both. Call :func:`write_training_report` (``prour report DIR`` / ``prour train report DIR``).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prour.files import write_atomic
from prour.markdown import md, table
from prour.train.metrics import METRICS_FILE, PHASE_KEYS, PHASES, SEGMENT_PREFIX, STEP_TIME_KEY

logger = logging.getLogger(__name__)

VERL_PREFIX = "training/prour/"
VERL_NAMES = {
    "actor/entropy": "entropy",
    "actor/pg_clipfrac": "pg_clipfrac",
    "actor/pg_clipfrac_lower": "pg_clipfrac_lower",
    "actor/pg_loss": "pg_loss",
    "actor/ppo_kl": "ppo_kl",
    "actor/grad_norm": "grad_norm",
    "actor/lr": "lr",
    "perf/throughput": "throughput_tokens_per_s",
    "response_length/mean": "response_length_mean",
    "timing_s/step": "time_step_s",
}
"""verl's step-metric names → the local trainer's (``training/prour/`` is stripped)."""

REPORT_DIR = "report"
REWARD_PLOT = "training_reward.png"
CURVES_PLOT = "training_curves.png"
TIME_PLOT = "training_time.png"
REPORT_FILE = "training_report.md"
REPORT_JSON = "training_report.json"


@dataclass(frozen=True)
class Panel:
    """One panel of the report: its title, y label, the (key, legend label) series it draws and
    the least y span it shows (equal values do not give a hair-thin axis); with ``relative``
    that span is a share of the largest absolute value drawn."""

    name: str
    title: str
    ylabel: str
    series: tuple[tuple[str, str], ...]
    min_span: float
    bounds: tuple[float, float] | None = None
    tick_format: str | None = None  # e.g. "%.3g" for the learning rate (no offset text)
    relative: bool = False


FRACTION = (-0.02, 1.02)  # fractions: 0 and 1 stay visible inside the frame


REWARD_PANEL = Panel(
    "reward", "Mean reward by mode (all samples that got a reward)", "reward",
    (("reward_mean", "all"), ("reward_mean_clarify", "clarify"),
     ("reward_mean_verify", "verify")), 0.1)
CURVE_PANELS = (
    Panel("samples", "Sampled outputs by kind", "fraction of samples",
          (("ask_fraction", "ask (valid question)"), ("none_fraction", "none (NO)"),
           ("invalid_fraction", "invalid"), ("failed_fraction", "failed (responder/scoring)")),
          0.1, FRACTION),
    Panel("belief", "Prior and posterior log-prob of the target", "mean log-prob (nats)",
          (("prior_mean", "prior"), ("post_mean", "posterior")), 0.1),
    Panel("reward_terms", "Attention-aware reward terms", "mean",
          (("ig_mean", "information gain"), ("attention_cost_mean", "attention cost")),
          0.1),
    Panel("entropy", "Policy entropy", "nats per token", (("entropy", "entropy"),), 0.1,
          (0.0, math.inf)),
    Panel("clip", "Clip fraction", "fraction of tokens",
          (("pg_clipfrac", "clipped (upper)"), ("pg_clipfrac_lower", "clipped (lower)")),
          0.05, FRACTION),
    Panel("grad_norm", "Gradient norm (before clipping)", "L2 norm",
          (("grad_norm", "grad norm"),), 0.1, (0.0, math.inf)),
    Panel("lr", "Learning rate", "lr", (("lr", "lr"),), 0.5, (0.0, math.inf), "%.3g",
          relative=True),
    Panel("throughput", "Tokens per second", "tokens/s",
          (("throughput_tokens_per_s", "step (prompt + response, per GPU)"),
           ("rollout_tokens_per_s", "rollout (generated)"),
           ("update_tokens_per_s", "update")), 1.0, (0.0, math.inf)),
)
PANELS = (REWARD_PANEL, *CURVE_PANELS)


# ---- reading -------------------------------------------------------------------------------


def canonical(record: Mapping[str, Any]) -> dict[str, Any]:
    """One step's metrics under the local trainer's names, from either backend's line."""
    data = record.get("data")
    if not isinstance(data, Mapping):  # the local trainer's flat line
        return dict(record)
    out: dict[str, Any] = {"step": record.get("step")}
    for key, value in data.items():
        if key.startswith(VERL_PREFIX):
            out[key[len(VERL_PREFIX):]] = value
        else:
            out[VERL_NAMES.get(key, key)] = value
    return out


def metrics_files(output_dir: str | Path) -> list[tuple[int, Path]]:
    """``(start step, file)`` of a run's metrics files in order: ``metrics.jsonl`` (start 0),
    then the segments verl wrote after each resume."""
    root = Path(output_dir)
    files = [(0, root / METRICS_FILE)] if (root / METRICS_FILE).is_file() else []
    for path in root.glob(f"{SEGMENT_PREFIX}*.jsonl"):
        start = path.name[len(SEGMENT_PREFIX):-len(".jsonl")]
        if start.isdigit():
            files.append((int(start), path))
    return sorted(files)


class MetricsRecords(list):
    """Step records read from a run's metrics files; ``skipped`` names each line left out
    (``file:line: why``): cut by a kill, not JSON, not an object, or without an integer step."""

    def __init__(self, records: Sequence[dict[str, Any]] = (), skipped: Sequence[str] = ()):
        super().__init__(records)
        self.skipped: list[str] = list(skipped)


def _record_problem(line: str) -> tuple[dict[str, Any] | None, str | None]:
    """(record under the local names, None), or (None, why the line is no step record)."""
    try:
        value = json.loads(line)
    except ValueError as exc:
        return None, f"not valid JSON ({exc})"
    if not isinstance(value, dict):
        return None, f"expected a JSON object, got {type(value).__name__}"
    record = canonical(value)
    step = record.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return None, f"no step number (`step` is {step!r})"
    return record, None


def read_metrics(output_dir: str | Path) -> MetricsRecords:
    """Every step's metrics, oldest first, under the local names. A segment that starts at
    step N replaces what earlier files logged after N (steps redone after a resume). A line that
    is no step record (cut by a kill, corrupt) is skipped with a warning naming its file and
    line, and listed in ``.skipped``: the report says how many and which."""
    files = metrics_files(output_dir)
    if not files:
        raise FileNotFoundError(f"{output_dir} holds no {METRICS_FILE}: not a training output "
                                "folder (train.output_dir), or no step has finished yet")
    steps: dict[int, dict[str, Any]] = {}
    skipped: list[str] = []
    for start, path in files:
        steps = {s: r for s, r in steps.items() if s <= start}
        for number, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
            if not raw.strip():
                continue
            line = raw.decode("utf-8", errors="replace")
            record, problem = _record_problem(line)
            if record is None:
                skipped.append(f"{path}:{number}: {problem}")
                logger.warning("skipping corrupt metrics line %s", skipped[-1])
                continue
            steps[record["step"]] = record
    return MetricsRecords([steps[s] for s in sorted(steps)], skipped)


def _skipped_lines(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The report's line on metrics lines left out (none when every line read)."""
    skipped = getattr(records, "skipped", [])
    if not skipped:
        return []
    shown = "; ".join(skipped[:5]) + ("; …" if len(skipped) > 5 else "")
    return [md(f"- skipped {len(skipped)} line(s) that hold no step record: {shown}")]


def series(records: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the steps where ``key`` has a finite number."""
    xs, ys = [], []
    for record in records:
        value = record.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) \
                and math.isfinite(value):
            xs.append(int(record["step"]))
            ys.append(float(value))
    return xs, ys


# ---- plotting ------------------------------------------------------------------------------


def _draw(ax: Any, panel: Panel, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One panel's lines; returns its series as drawn (label → key, x, y)."""
    from matplotlib.ticker import MaxNLocator

    from prour.plots import MARKERS, padded_limits

    drawn: dict[str, Any] = {}
    for i, (key, label) in enumerate(panel.series):
        xs, ys = series(records, key)
        if xs:
            ax.plot(xs, ys, "-" + MARKERS[i % len(MARKERS)], markersize=4, label=label)
            drawn[label] = {"key": key, "x": xs, "y": ys}
    steps = [x for s in drawn.values() for x in s["x"]]
    ax.set_xlim(*padded_limits(steps, min_span=2.0, bounds=(0.0, math.inf)))
    values = [y for s in drawn.values() for y in s["y"]]
    span = panel.min_span * max((abs(v) for v in values), default=1.0) if panel.relative \
        else panel.min_span
    ax.set_ylim(*padded_limits(values, span or panel.min_span, bounds=panel.bounds))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if panel.tick_format:
        from matplotlib.ticker import FormatStrFormatter

        ax.yaxis.set_major_formatter(FormatStrFormatter(panel.tick_format))
    ax.set_title(panel.title, fontsize=9)
    ax.set_xlabel("training step", fontsize=8)
    ax.set_ylabel(panel.ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=7, loc="best")
    return drawn


def has_data(panel: Panel, records: Sequence[Mapping[str, Any]]) -> bool:
    return any(series(records, key)[0] for key, _ in panel.series)


def plot_reward(records: Sequence[Mapping[str, Any]], out: str | Path) -> Path:
    """Mean reward over training steps: all samples, clarify states, verify states (Figure 4)."""
    from prour.plots import pyplot, save_plot

    fig, ax = pyplot().subplots(figsize=(6.5, 4.2))
    drawn = _draw(ax, REWARD_PANEL, records)
    ax.set_title("Mean reward over training", fontsize=10)
    return save_plot(fig, out, {REWARD_PANEL.name: drawn})


def plot_curves(records: Sequence[Mapping[str, Any]], panels: Sequence[Panel],
                out: str | Path) -> Path:
    """The diagnostics' panels on a grid (four per row)."""
    from prour.plots import pyplot, save_plot

    columns = min(4, len(panels))
    rows = math.ceil(len(panels) / columns)
    fig, axes = pyplot().subplots(rows, columns, figsize=(4.2 * columns, 3.4 * rows),
                                  squeeze=False)
    drawn = {}
    for ax, panel in zip(axes.flat, panels):
        drawn[panel.name] = _draw(ax, panel, records)
    for ax in list(axes.flat)[len(panels):]:
        ax.remove()
    fig.tight_layout()
    return save_plot(fig, out, drawn)


def timed_steps(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The steps that logged every phase's seconds and the step's (runs before the phase keys
    have none)."""
    return [r for r in records
            if all(isinstance(r.get(k), (int, float)) for k in (*PHASE_KEYS, STEP_TIME_KEY))]


def phase_shares(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Each phase's seconds over the timed steps and its share of their total step time; the
    phases of a step add up to it (``waiting`` is the rest), so the shares sum to 1."""
    timed = timed_steps(records)
    total = sum(float(r[STEP_TIME_KEY]) for r in timed)
    seconds = {p: sum(float(r[f"time_{p}_s"]) for r in timed) for p in PHASES}
    return {"steps": len(timed), "step_seconds": total,
            "phases": {p: {"seconds": v, "share": v / total if total > 0 else None}
                       for p, v in seconds.items()}}


def share_line(shares: Mapping[str, Any]) -> str | None:
    """One line of :func:`phase_shares`: mean step seconds and every phase's share (None without
    timed steps)."""
    if not shares["steps"] or not shares["step_seconds"]:
        return None
    parts = ", ".join(f"{phase} {100 * e['share']:.1f}%" for phase, e in shares["phases"].items())
    mean = shares["step_seconds"] / shares["steps"]
    return f"time per step: {_fmt(mean)} s over {shares['steps']} steps: {parts}"


def plot_times(records: Sequence[Mapping[str, Any]], out: str | Path) -> Path:
    """Seconds per training step, stacked by phase (generation at the bottom, waiting on top)."""
    from matplotlib.ticker import MaxNLocator

    from prour.plots import padded_limits, pyplot, save_plot

    timed = timed_steps(records)
    steps = [int(r["step"]) for r in timed]
    fig, ax = pyplot().subplots(figsize=(7.5, 4.2))
    bottom = [0.0] * len(timed)
    drawn: dict[str, Any] = {}
    for phase in PHASES:
        key = f"time_{phase}_s"
        heights = [float(r[key]) for r in timed]
        label = phase.replace("_", " ")
        ax.bar(steps, heights, bottom=bottom, width=0.8, label=label)
        drawn[label] = {"key": key, "x": steps, "y": heights}
        bottom = [b + h for b, h in zip(bottom, heights)]
    drawn["step"] = {"key": STEP_TIME_KEY, "x": steps, "y": [float(r[STEP_TIME_KEY]) for r in timed]}
    ax.set_xlim(*padded_limits(steps, min_span=2.0, bounds=(0.0, math.inf)))
    ax.set_ylim(0.0, max(bottom, default=1.0) * 1.08 or 1.0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("Time per training step by phase", fontsize=10)
    ax.set_xlabel("training step", fontsize=8)
    ax.set_ylabel("seconds", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_plot(fig, out, {"time": drawn})


# ---- the report ----------------------------------------------------------------------------


def _fmt(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.3e}"


def summary_rows(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """First, last, min and max of every series the report knows, with its step count."""
    rows = []
    for panel in PANELS:
        for key, label in panel.series:
            xs, ys = series(records, key)
            rows.append({"panel": panel.name, "key": key, "label": label, "steps": len(xs),
                         "first": ys[0] if ys else None, "last": ys[-1] if ys else None,
                         "min": min(ys) if ys else None, "max": max(ys) if ys else None})
    return rows


def _markdown(output_dir: Path, records: Sequence[Mapping[str, Any]],
              rows: Sequence[Mapping[str, Any]], plots: Mapping[str, Path]) -> str:
    files = ", ".join(p.name for _, p in metrics_files(output_dir))
    first, last = records[0]["step"], records[-1]["step"]
    reward = next(r for r in rows if r["key"] == "reward_mean")
    lines = ["# Training report", "", md(f"- run: `{output_dir}` ({files})"),
             f"- steps logged: {len(records)} (step {first} to {last})", *_skipped_lines(records),
             "",
             f"Mean reward: first step {_fmt(reward['first'])}, last step {_fmt(reward['last'])}.",
             "",
             *table(["Panel", "Series", "Key", "Steps", "First", "Last", "Min", "Max"],
                    [[r["panel"], r["label"], f"`{r['key']}`", r["steps"], _fmt(r["first"]),
                      _fmt(r["last"]), _fmt(r["min"]), _fmt(r["max"])] for r in rows
                     if r["steps"]])]
    missing = [f"`{r['key']}`" for r in rows if not r["steps"]]
    if missing:
        lines += ["", f"Not logged by this run: {', '.join(missing)}."]
    shares = phase_shares(records)
    if shares["steps"]:
        mean = shares["step_seconds"] / shares["steps"]
        lines += ["", "## Where the time goes", "",
                  (f"{shares['steps']} timed steps, {_fmt(shares['step_seconds'])} s in all "
                   f"({_fmt(mean)} s per step)."), "",
                  *table(["Phase", "Seconds", "Share"],
                         [[phase, _fmt(entry["seconds"]),
                           "–" if entry["share"] is None else f"{100 * entry['share']:.1f}%"]
                          for phase, entry in shares["phases"].items()])]
    lines += ["", *(f"![{name}]({path.name})" for name, path in plots.items())]
    return "\n".join(lines) + "\n"


def write_training_report(output_dir: str | Path,
                          out_dir: str | Path | None = None) -> dict[str, Path]:
    """Plots and markdown of a training run's metrics (default folder ``<output_dir>/report``);
    returns the written paths by name: ``reward_plot``, ``curves_plot`` (when any diagnostic
    was logged), ``time_plot`` (when the steps logged their phase times; the markdown and the
    JSON's ``time`` give each phase's share), ``markdown``, ``json``."""
    output_dir = Path(output_dir)
    records = read_metrics(output_dir)
    if not records:
        skipped = f" ({len(records.skipped)} line(s) skipped, first {records.skipped[0]})" \
            if records.skipped else ""
        raise ValueError(f"{output_dir}: the metrics files hold no complete step{skipped}")
    out = Path(out_dir) if out_dir is not None else output_dir / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    written = {"reward_plot": plot_reward(records, out / REWARD_PLOT)}
    panels = [p for p in CURVE_PANELS if has_data(p, records)]
    if panels:
        written["curves_plot"] = plot_curves(records, panels, out / CURVES_PLOT)
    if timed_steps(records):
        written["time_plot"] = plot_times(records, out / TIME_PLOT)
    rows = summary_rows(records)
    markdown = out / REPORT_FILE
    write_atomic(markdown, _markdown(output_dir, records, rows, dict(written)))
    payload = out / REPORT_JSON
    write_atomic(payload, json.dumps({"output_dir": str(output_dir), "steps": len(records),
                                      "skipped_lines": records.skipped,
                                      "series": rows, "time": phase_shares(records)},
                                     indent=2) + "\n")
    return {**written, "markdown": markdown, "json": payload}


def is_training_folder(path: str | Path) -> bool:
    """Whether ``path`` holds a training run's metrics (local or verl)."""
    return bool(metrics_files(path))
