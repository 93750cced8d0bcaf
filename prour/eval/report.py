"""Reports of evaluation runs: markdown tables, ``report.json`` and PNG plots.

A *system* is one (run folder, method, attention variant). For each system the report gives
Pass@1 per domain and the unweighted average over domains, each with a paired task-bootstrap
interval (seeds are averaged within a task first), pass^k, the act / clarify / verify turn split,
wall-clock seconds, model calls, error, timeout and cut counts (cut: the episode reached
``env.max_steps`` and scores 0); a Pass@1, pass^k or difference cell whose episodes include
errored ones reads ``error (n/N)`` instead of a number; the agent turns by tag (question,
confirmation, verification, act) and the model calls by role; paired differences against a
baseline system on the same tasks and seeds, with Holm-adjusted p-values. Steps, seconds and calls are
means over a domain's episodes, then averaged over domains (like Pass@1). A system whose query
generator was swapped for the recipe's default is labelled ``method (generator NAME)``; a
training checkpoint is named by its training run and step (``method (generator RUN step N)``),
and a checkpoint sweep gets a table of Pass@1 by step and the success-versus-training-step
plot. An ``eval.sweep`` run (router.budget / router.every_n points) labels each point's systems
``method [budget=B every_n=N]`` and adds the trade-off figures (the prour paper's Figures 5 and
8: success versus decomposer calls per episode, one point per sweep value, one line per method
and domain) with their points in ``tradeoff.csv``. The uncertainty-over-steps figure (Figure 6)
holds the recorded AU/EU of the decomposer-routed methods and, once ``prour report RUN
--posthoc-uncertainty`` has run the decomposer over the other methods' episodes
(:mod:`prour.eval.posthoc`), their curves labelled ``(post-hoc)``.

With ``attention=True`` the ask-less tables follow (built by :mod:`prour.eval.attention.tables`
from the gated conversations): R, A, V, U, request statistics and cut conversations per (system,
domain, policy), asking efficiency over No-ask with intervals, equal-cost comparisons against
Budgeted mixtures (each family Holm-adjusted), and the reward-versus-attention plot. The human
burden study exports equal-count pairs for annotators and scores their answers
(:func:`prour.eval.attention.report.burden_study`).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from prour.env.domains import DOMAINS
from prour.eval.attention.report import attention_section, burden_study
from prour.eval.markdown import jsonable, md, pct, table
from prour.eval.metrics import AVERAGE, STEP_KINDS
from prour.eval.systems import (
    Comparison,
    System,
    SystemSummary,
    compare,
    error_cell,
    load_systems,
    posthoc_curves,
    summarize,
)
from prour.files import write_atomic

REPORT_FILE = "report.md"
REPORT_JSON = "report.json"
SUCCESS_PLOT = "success_vs_steps.png"
TRAINING_STEP_PLOT = "success_vs_training_step.png"
UNCERTAINTY_PLOT = "uncertainty_over_steps.png"
BUDGET_PLOT = "success_vs_calls_by_budget.png"  # Figure 5 (eval.sweep over router.budget)
FREQUENCY_PLOT = "success_vs_calls_by_every_n.png"  # Figure 8 (over router.every_n)
TRADEOFF_CSV = "tradeoff.csv"  # both figures' points


ERROR_NOTE = ("error (n/N): n of the cell's N episodes ended in an error, so it holds no "
              "measurement; rerun `prour eval` with the same recipe and folder to run them again.")


# ---- markdown ----------------------------------------------------------------------------


def main_table(summaries: Sequence[SystemSummary], domains: Sequence[str]) -> list[str]:
    """Pass@1 (%) per domain and average with intervals, then turns, seconds, calls, failures
    and cut episodes."""
    header = ["System", *domains, "Average", "Act", "Clarify", "Verify", "Total", "Seconds",
              "Calls", "Errors", "Timeouts", "Cut", "Episodes"]
    rows = []
    for s in summaries:
        if s.pass_at_1 is None:
            passes = ["–"] * (len(domains) + 1)
        else:
            passes = [error_cell(s.errored.get(d)) or (pct(s.pass_at_1[d]) if d in s.pass_at_1
                                                       else "–") for d in [*domains, AVERAGE]]
        rows.append([s.label, *passes,
                     *(_measured(s, s.steps[k]) for k in (*STEP_KINDS, "total")),
                     _measured(s, s.seconds), _calls_cell(s, s.model_calls, 1), s.errors,
                     s.timeouts, s.cut, s.episodes])
    return table(header, rows)


def _measured(summary: SystemSummary, value: float | None, digits: int = 2) -> str:
    """A mean per episode, or ``– (why)`` where the system's episodes measured none."""
    if value is None:
        return f"– ({summary.not_measured or 'not measured'})"
    return f"{value:.{digits}f}"


def sweep_table(systems: Sequence[System], summaries: Sequence[SystemSummary]) -> list[str]:
    """One row per evaluated checkpoint: method, generator (training run), step, average Pass@1
    with its interval, episodes."""
    header = ["Method", "Generator", "Step", "Average Pass@1", "Episodes"]
    rows = []
    for system, s in zip(systems, summaries):
        if system.step is None:
            continue
        method = system.method if system.variant is None else f"{system.method} [{system.variant}]"
        average = error_cell(s.errored.get(AVERAGE)) or (
            pct(s.pass_at_1[AVERAGE]) if s.pass_at_1 is not None else f"– ({s.problem})")
        rows.append([method, system.checkpoint["name"], system.step, average, s.episodes])
    return table(header, rows)


def writers_table(systems: Sequence[System]) -> list[str]:
    """Who wrote each system's questions: the model folder or served id its episodes recorded
    (prour's methods: the generator or its checkpoint; ig-clarifier: its own trained clarifier;
    the other baselines: the agent backbone, or no model for templated questions)."""
    def cell(writers: list[str] | None) -> str:
        if writers is None:
            return "not recorded (results from before the record)"
        return ", ".join(f"`{w}`" for w in writers) if writers else "no model (none or templates)"

    return table(["System", "Questions written by"],
                 [[s.label, cell(s.question_writers)] for s in systems])


def router_table(summaries: Sequence[SystemSummary]) -> list[str]:
    """Decomposer (or LLM-router) budget and frequency (paper A.2.3) and the calls they allowed:
    one row per system that routes."""
    header = ["System", "Budget", "Every n", "Router calls / episode", "Skipped steps / episode"]
    shown = lambda values: ", ".join("unlimited" if v is None else str(v) for v in values)
    rows = [[s.label, shown(s.router["budget"]), shown(s.router["every_n"]),
             f"{s.router['calls_per_episode']:.2f}", f"{s.router['skipped_per_episode']:.2f}"]
            for s in summaries if s.router is not None]
    return table(header, rows)


TAG_NAMES = {"clarify": "Questions", "confirm": "Confirmations", "verify": "Verifications",
             "act": "Act"}


def turns_table(summaries: Sequence[SystemSummary]) -> list[str]:
    """Agent turns per episode by tag: questions to the user, confirmations, verifications,
    act turns (a verified step counts as a verification and an act turn)."""
    header = ["System", *TAG_NAMES.values()]
    rows = [[s.label, *(_measured(s, None if s.not_measured else s.turns.get(tag, 0.0))
                        for tag in TAG_NAMES)] for s in summaries]
    return table(header, rows)


def calls_table(summaries: Sequence[SystemSummary]) -> list[str]:
    """Mean model calls per episode by role (chat and score calls; 0 where a system has none)."""
    roles = sorted({role for s in summaries for role in s.calls_by_role})
    header = ["System", *roles, "Total"]
    rows = [[s.label, *(_measured(s, None if s.not_measured else s.calls_by_role.get(r, 0.0))
                        for r in roles),
             _calls_cell(s, s.model_calls, 2)] for s in summaries]
    return table(header, rows)


def _calls_cell(summary: SystemSummary, calls: float | None, digits: int) -> str:
    """Model calls per episode; "not recorded" for an imported run (tau2 records no calls),
    ``– (why)`` where the episodes measured none."""
    if calls is not None and math.isnan(calls):
        return "not recorded"
    return _measured(summary, calls, digits)


INFERRED_NOTE = ("Inferred from what each agent turn did, by prour.eval.tags' rule (a write: a "
                 "call to a tool tau2 marks WRITE; a lookup: a READ call; a question: a message "
                 "to the user that asks; else a reply). No router took these turns, so the "
                 "Act/Clarify/Verify columns above count them all as Act. Post-hoc columns: "
                 "the routes the recipe's decomposer gives their first 16 decisions "
                 "(`prour report RUN --posthoc-uncertainty --posthoc-recipe R`).")


def inferred_table(summaries: Sequence[SystemSummary]) -> list[str]:
    """Inferred turn tags per episode of the imported systems, and their total."""
    from prour.eval.tags import INFERRED_TAGS

    shown = [s for s in summaries if s.inferred_turns is not None]
    routed = any(s.posthoc_routes is not None for s in shown)
    header = ["System", *(tag.capitalize() for tag in INFERRED_TAGS), "Total"]
    header += [f"Post-hoc {kind.capitalize()}" for kind in STEP_KINDS] if routed else []
    rows = []
    for s in shown:
        row = [s.label, *(f"{s.inferred_turns[t]:.2f}" for t in INFERRED_TAGS),
               f"{sum(s.inferred_turns.values()):.2f}"]
        if routed:
            row += [f"{s.posthoc_routes[k]:.2f}" if s.posthoc_routes else "–" for k in STEP_KINDS]
        rows.append(row)
    return table(header, rows)


def pass_hat_table(summaries: Sequence[SystemSummary], domains: Sequence[str]) -> list[str]:
    """pass^k (%) per domain and average for k = 1..n_seeds."""
    ks = sorted({k for s in summaries for by_k in s.pass_hat.values() for k in by_k})
    header = ["System", "Domain", *(f"pass^{k}" for k in ks)]
    rows = []
    for s in summaries:
        for domain in [*domains, AVERAGE]:
            if domain in s.pass_hat:
                values, errored = s.pass_hat[domain], error_cell(s.errored.get(domain))
                rows.append([s.label, domain, *(errored or (f"{100 * values[k]:.2f}" if k in values
                                                            else "–") for k in ks)])
    return table(header, rows)


def comparison_table(comparisons: Sequence[Comparison], domains: Sequence[str]) -> list[str]:
    header = ["System", "Baseline", *(f"Δ {d}" for d in domains), "Δ Average", "p (Holm, avg)"]
    rows = []
    for c in comparisons:
        if c.deltas is None:
            rows.append([c.label, c.baseline, *(["–"] * (len(domains) + 1)),
                         f"not comparable: {c.problem}"])
            continue
        cells = [error_cell(c.errored.get(d)) or (pct(c.deltas[d]) if d in c.deltas else "–")
                 for d in [*domains, AVERAGE]]
        rows.append([c.label, c.baseline, *cells, f"{c.holm.get(AVERAGE, math.nan):.4f}"])
    return table(header, rows)


# ---- the report ---------------------------------------------------------------------------


def write_report(run_dirs: Sequence[str | Path], out_dir: str | Path | None = None,
                 attention: bool = False, baseline: str | None = None, n_boot: int = 10_000,
                 ci: float = 0.95, accounting: str | None = None, lam: float | None = None,
                 burden_pairs: int = 0, annotations: str | Path | None = None,
                 ) -> dict[str, Path]:
    """Write ``report.md``, ``report.json`` and the plots; returns the written paths by name.

    With ``attention``, ``burden_pairs`` > 0 also exports that many pairs for the human burden
    study and ``annotations`` (the annotators' answers on pairs exported before) adds their
    agreement with the cost ranking (see :func:`burden_study`).
    """
    if (burden_pairs or annotations) and not attention:
        raise ValueError("--burden-pairs and --annotations belong to the attention report; "
                         "add --attention")
    systems = load_systems(run_dirs)
    if not systems:
        skipped = (f" ({len(systems.skipped)} skipped: the first, {systems.skipped[0]})"
                   if systems.skipped else "")
        raise ValueError(f"no result lines in {', '.join(map(str, run_dirs))}{skipped}")
    out = Path(out_dir) if out_dir is not None else Path(run_dirs[0]) / "report"
    out.mkdir(parents=True, exist_ok=True)
    domains = [d for d in DOMAINS if any(d in s.domains for s in systems)]
    summaries = [summarize(s, n_boot, ci) for s in systems]
    comparisons = compare(systems, baseline, n_boot, ci)
    written = _plots(systems, summaries, out)
    lines = _header(run_dirs, systems, ci, n_boot) + skipped_lines(systems.skipped)
    lines += ["## Question writers", "", *writers_table(systems), ""]
    lines += ["## Pass@1 (%) and interaction cost", ""]
    lines += main_table(summaries, domains) + [""]
    if any(s.errors for s in summaries):
        lines += [ERROR_NOTE, ""]
    lines += [f"- {md(s.label)}: {md(s.problem)}" for s in summaries if s.problem]
    if any(s.step is not None for s in systems):
        lines += ["## Pass@1 (%) by training step (checkpoint sweep)", "",
                  *sweep_table(systems, summaries), ""]
    if any(s.router is not None for s in summaries):
        lines += ["", "## Router budget and frequency (router.budget, router.every_n)", "",
                  *router_table(summaries)]
    lines += ["", "## Agent turns per episode by tag", "", *turns_table(summaries), "",
              "## Model calls per episode by role", "", *calls_table(summaries), ""]
    if any(s.inferred_turns is not None for s in summaries):
        lines += ["## Inferred turn tags per episode (imported runs)", "",
                  *inferred_table(summaries), "", INFERRED_NOTE, ""]
    lines += ["## pass^k (%)", "", *pass_hat_table(summaries, domains), ""]
    if comparisons:
        lines += ["## Paired differences in Pass@1 (percentage points)", "",
                  *comparison_table(comparisons, domains), ""]
    payload: dict[str, Any] = {"skipped_lines": systems.skipped,
                               "systems": [jsonable(asdict(s)) for s in summaries],
                               "question_writers": {s.label: s.question_writers for s in systems},
                               "comparisons": [jsonable(asdict(c)) for c in comparisons]}
    if attention:
        section, data, plot = attention_section(systems, out, n_boot, ci, accounting, lam)
        lines += section
        payload["attention"] = data
        if plot is not None:
            written["attention_plot"] = plot
    if burden_pairs or annotations:
        section, data, files = burden_study(systems, out, burden_pairs, annotations, accounting,
                                            n_boot, ci)
        lines += section
        payload["burden"] = data
        written.update(files)
    for name, path in written.items():
        if path.suffix == ".png":
            lines.append(f"![{name}]({path.name})")
    written["markdown"] = out / REPORT_FILE
    write_atomic(written["markdown"], "\n".join(lines) + "\n")
    written["json"] = out / REPORT_JSON
    write_atomic(written["json"], json.dumps(payload, indent=2) + "\n")
    return written


def skipped_lines(skipped: Sequence[str]) -> list[str]:
    """The report's paragraph on result lines left out: how many, and each (file, line, key
    and why); none when every line was read."""
    if not skipped:
        return []
    note = (f"Skipped {len(skipped)} result line(s) the report cannot read (not counted in any "
            "table below):")
    return [note, "", *(f"- {md(line)}" for line in skipped), ""]


def _header(run_dirs: Sequence[str | Path], systems: Sequence[System], ci: float,
            n_boot: int) -> list[str]:
    from prour.eval.imported import imported_header

    lines = ["# Evaluation report", ""]
    for run_dir in run_dirs:
        mine = [s for s in systems if s.folder == Path(run_dir)]
        if any("imported" in line for s in mine for line in s.lines):
            lines += [md(line) for line in
                      imported_header(run_dir, [line for s in mine for line in s.lines])]
            continue
        record = _provenance(Path(run_dir))
        commit = ((record.get("git") or {}).get("commit") or "")[:12]
        lines.append(md(f"- run `{run_dir}`" + (f" (commit {commit})" if commit else "") + ": "
                        + _protocol_line(record, mine)))
        lines += [f"  - task set {note}" for note in _task_sets(record, mine)]
    for run_dir in run_dirs:
        block = _protocol_block(Path(run_dir))
        if block:
            lines += ["", md(f"Protocol of `{run_dir}`:"), *(f"- {md(line)}" for line in block)]
    note = (f"Intervals: {100 * ci:.0f}% paired task bootstrap ({n_boot} draws); seeds are "
            "averaged within each task. Average: unweighted mean over domains.")
    lines += ["", note, ""]
    return lines


def _protocol_block(run_dir: Path) -> list[str]:
    """The Protocol lines (:func:`prour.eval.protocol.protocol_block`) of the recipe the eval run
    saved (``recipe.resolved.yaml``); none when it has none or it no longer reads."""
    from prour.eval.protocol import protocol_block
    from prour.recipes import load_recipe
    from prour.section import ConfigError

    path = run_dir / "recipe.resolved.yaml"
    if not path.is_file():
        return []
    try:
        return protocol_block(load_recipe(path))
    except (ConfigError, ValueError) as exc:
        return [f"unknown: the saved recipe {path} does not read ({exc})"]


def _provenance(run_dir: Path) -> dict[str, Any]:
    """The run's ``provenance.json`` (empty when missing or unreadable)."""
    try:
        return json.loads((run_dir / "provenance.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _protocol_line(record: dict[str, Any], systems: Sequence[System]) -> str:
    """``protocol `paper` (split base); seeds 0, 1, 2; tasks: retail 114, airline 50``: the
    protocol and split the run was started with, the seeds and tasks its result lines hold."""
    lines = [line for s in systems for line in s.lines]
    seeds = sorted({int(line["seed"]) for line in lines})
    present = {line["domain"] for line in lines}
    counts = [f"{d} {len({line['task_id'] for line in lines if line['domain'] == d})}"
              for d in [d for d in DOMAINS if d in present] + sorted(present - set(DOMAINS))]
    protocol = record.get("protocol") or "none"
    split = record.get("split") or "?"
    return (f"protocol `{protocol}` (split {split}); seeds {', '.join(map(str, seeds))}; "
            f"tasks: {', '.join(counts)}")


def _task_sets(record: dict[str, Any], systems: Sequence[System]) -> list[str]:
    """Where a packaged split's tasks come from and which it leaves out, per domain the run's
    result lines hold (:func:`prour.env.domains.task_set_note`); none for tau2's own splits."""
    from prour.env.domains import task_set_note

    split = record.get("split")
    present = {line["domain"] for s in systems for line in s.lines}
    notes = []
    for domain in [d for d in DOMAINS if d in present] + sorted(present - set(DOMAINS)):
        try:
            note = task_set_note(domain, split) if split else None
        except ValueError:  # a domain no longer registered: nothing known about its split
            note = None
        notes += [note] if note else []
    return notes


def _plots(systems: Sequence[System], summaries: Sequence[SystemSummary],
           out: Path) -> dict[str, Path]:
    from prour.eval.plots import SystemPoint, mean_curves, plot_success_vs_steps, plot_uncertainty

    points = [SystemPoint(s.label, s.steps["total"], 100 * average.estimate,
                          100 * average.low, 100 * average.high)
              for s in summaries
              if s.pass_at_1 is not None and not error_cell(s.errored.get(AVERAGE))
              for average in [s.pass_at_1[AVERAGE]]]  # an errored system holds no measurement
    written = {}
    if points:
        written["success_vs_steps"] = plot_success_vs_steps(points, out / SUCCESS_PLOT)
    if any(s.step is not None for s in systems):
        written["success_vs_training_step"] = _training_step_plot(systems, summaries, out)
    curves = {s.label: mean_curves([line["decisions"] for line in s.lines]) for s in systems}
    curves = {k: v for k, v in curves.items() if any(x is not None for x in v["total"])}
    curves.update(posthoc_curves(systems, set(curves)))
    if curves:
        written["uncertainty_over_steps"] = plot_uncertainty(curves, out / UNCERTAINTY_PLOT)
    if any(s.sweep is not None for s in systems):
        written.update(_tradeoff_plots(systems, out))
    return written


def tradeoff_series(systems: Sequence[System]) -> list[dict[str, Any]]:
    """One row per (method, domain, sweep point) of the eval.sweep systems: the point's
    router.budget and router.every_n, its episodes, mean decomposer (router) calls per episode
    and success rate (%) over its episodes (the prour paper's Figures 5 and 8)."""
    rows = []
    for system in systems:
        if system.sweep is None:
            continue
        for domain in system.domains:
            lines = [line for line in system.lines if line["domain"] == domain]
            calls = [(line.get("router") or {}).get("calls", 0) for line in lines]
            rows.append({"method": system.method, "variant": system.variant, "domain": domain,
                         "label": system.label,
                         "budget": system.sweep.get("router.budget", "recipe"),
                         "every_n": system.sweep.get("router.every_n", "recipe"),
                         "episodes": len(lines),
                         "decomposer_calls": sum(calls) / len(lines),
                         "success": 100 * sum(bool(line["success"]) for line in lines)
                         / len(lines)})
    return rows


def _tradeoff_plots(systems: Sequence[System], out: Path) -> dict[str, Path]:
    """Figures 5 (by router.budget) and 8 (by router.every_n), their series as CSV beside."""
    from prour.eval.plots import plot_tradeoff

    rows = tradeoff_series(systems)
    written: dict[str, Path] = {}
    csv_path = out / TRADEOFF_CSV
    header = ["method", "variant", "domain", "budget", "every_n", "episodes",
              "decomposer_calls", "success"]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, header, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:  # an unlimited budget reads "inf"
        writer.writerow({**row, "budget": "inf" if row["budget"] is None else row["budget"]})
    write_atomic(csv_path, buffer.getvalue())
    written["tradeoff_csv"] = csv_path
    for key, name, plot in (("budget", "router.budget", BUDGET_PLOT),
                            ("every_n", "router.every_n", FREQUENCY_PLOT)):
        written[f"tradeoff_{key}"] = plot_tradeoff(rows, key, name, out / plot)
    return written


def _training_step_plot(systems: Sequence[System], summaries: Sequence[SystemSummary],
                        out: Path) -> Path:
    """Pass@1 against training step, one line per (method, variant, training run); systems of
    the same runs that use no checkpoint are drawn as reference lines. A system with errored
    episodes holds no measurement and is left out (the tables say ``error (n/N)``)."""
    from prour.eval.plots import StepPoint, plot_success_vs_training_step

    curves: dict[str, list[StepPoint]] = {}
    references: dict[str, StepPoint] = {}
    runs = {s.run for s in systems if s.step is not None}
    for system, summary in zip(systems, summaries):
        if summary.pass_at_1 is None or system.run not in runs \
                or error_cell(summary.errored.get(AVERAGE)):
            continue
        average = summary.pass_at_1[AVERAGE]
        point = StepPoint(system.step or 0, 100 * average.estimate, 100 * average.low,
                          100 * average.high)
        if system.step is None:
            references[system.label] = point
            continue
        name = system.method if system.variant is None else f"{system.method} [{system.variant}]"
        curves.setdefault(f"{name} ({system.checkpoint['name']})", []).append(point)
    return plot_success_vs_training_step(curves, out / TRAINING_STEP_PLOT, references)
