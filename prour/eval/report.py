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
(:func:`burden_study`).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prour.config.eval import sweep_label
from prour.env.domains import DOMAINS
from prour.env.trajectory import is_cut
from prour.eval.harness import RESULTS_FILE, load_result_lines, result_key
from prour.eval.markdown import jsonable, pct, table
from prour.eval.metrics import AVERAGE, STEP_KINDS, compare_runs, domain_pass_at_1, pass_hat_k
from prour.eval.stats import BootstrapResult, holm_table
from prour.files import write_atomic

logger = logging.getLogger(__name__)

REPORT_FILE = "report.md"
REPORT_JSON = "report.json"
SUCCESS_PLOT = "success_vs_steps.png"
TRAINING_STEP_PLOT = "success_vs_training_step.png"
UNCERTAINTY_PLOT = "uncertainty_over_steps.png"
ATTENTION_PLOT = "reward_vs_attention.png"
BUDGET_PLOT = "success_vs_calls_by_budget.png"  # Figure 5 (eval.sweep over router.budget)
FREQUENCY_PLOT = "success_vs_calls_by_every_n.png"  # Figure 8 (over router.every_n)
TRADEOFF_CSV = "tradeoff.csv"  # both figures' points


@dataclass
class System:
    """The result lines of one method (and attention variant) in one run folder."""

    run: str
    method: str
    variant: str | None
    lines: list[dict[str, Any]] = field(default_factory=list)
    label: str = ""
    folder: Path | None = None

    @property
    def generator(self) -> str | None:
        """The query generator's name when the run swapped it for the recipe's default."""
        return next((line["generator"] for line in self.lines if line.get("generator")), None)

    @property
    def question_writers(self) -> list[str] | None:
        """The models that wrote this system's questions, as its episodes recorded them
        (``question_writer``); [] when it writes none with a model; None when its lines predate
        the record."""
        if not any("question_writer" in line for line in self.lines):
            return None
        return sorted({line["question_writer"] for line in self.lines
                       if line.get("question_writer")})

    @property
    def checkpoint(self) -> dict[str, Any] | None:
        """The training checkpoint the generator was (run name, step, folder), if any."""
        return next((line["checkpoint"] for line in self.lines if line.get("checkpoint")), None)

    @property
    def step(self) -> int | None:
        """The training step of the generator's checkpoint (None: not a checkpoint)."""
        return (self.checkpoint or {}).get("step")

    @property
    def sweep(self) -> dict[str, int | None] | None:
        """The eval.sweep point of the system's episodes (None: not part of a sweep)."""
        return next((line["sweep"] for line in self.lines if line.get("sweep")), None)

    @property
    def base_label(self) -> str:
        name = self.method if self.generator is None else \
            f"{self.method} (generator {self.generator})"
        name = name if self.variant is None else f"{name} [{self.variant}]"
        return name if self.sweep is None else f"{name} [{sweep_label(self.sweep)}]"

    @property
    def domains(self) -> list[str]:
        present = {line["domain"] for line in self.lines}
        return [d for d in DOMAINS if d in present] + sorted(present - set(DOMAINS))

    def rewards(self, domain: str) -> dict[str, dict[int, float]]:
        """task → seed → score (a reward of None counts 0: the episode failed or went unscored)."""
        table: dict[str, dict[int, float]] = {}
        for line in self.lines:
            if line["domain"] == domain:
                table.setdefault(line["task_id"], {})[int(line["seed"])] = float(line["score"])
        return table

    def by_domain(self) -> dict[str, dict[str, dict[int, float]]]:
        return {d: self.rewards(d) for d in self.domains}


def load_systems(run_dirs: Sequence[str | Path]) -> list[System]:
    """Systems of every run folder, in run order then first appearance (a checkpoint sweep's
    steps in step order); labels are made unique by prefixing the run folder's name where two
    runs share a method and generator."""
    from prour.eval.imported import imported_lines, is_imported_run

    systems: list[System] = []
    for run_dir in run_dirs:
        path = Path(run_dir) / RESULTS_FILE
        if is_imported_run(run_dir):
            lines = imported_lines(run_dir)
        elif path.is_file():
            lines = list(load_result_lines(path).values())
        else:
            raise FileNotFoundError(f"{run_dir} holds no {RESULTS_FILE}; run `prour eval` first "
                                    "(or `prour import tau2 ... --run-dir` for a tau2 run)")
        groups: dict[tuple[str, str | None, str | None, str | None], System] = {}
        for line in lines:
            key = (line["method"], line.get("variant"), line.get("generator"),
                   sweep_label(line.get("sweep")))
            if key not in groups:
                groups[key] = System(Path(run_dir).name, *key[:2], folder=Path(run_dir))
            groups[key].lines.append(line)
        systems.extend(sorted(groups.values(), key=_sweep_order(list(groups.values()))))
    counts: dict[str, int] = {}
    for system in systems:
        counts[system.base_label] = counts.get(system.base_label, 0) + 1
    for system in systems:
        repeated = counts[system.base_label] > 1
        system.label = f"{system.run}:{system.base_label}" if repeated else system.base_label
    return systems


def _sweep_order(systems: list[System]) -> Any:
    """Sort key: first appearance of (method, variant, training run), then training step."""
    def run_of(s: System) -> tuple:
        return (s.method, s.variant, (s.checkpoint or {}).get("name", s.generator))

    first: dict[tuple, int] = {}
    for i, s in enumerate(systems):
        first.setdefault(run_of(s), i)
    return lambda s: (first[run_of(s)], s.step or 0)


# ---- metrics ------------------------------------------------------------------------------


def _domain_mean(system: System, value: Any) -> float:
    """Mean of ``value(line)`` over each domain's episodes, then over domains."""
    means = []
    for domain in system.domains:
        values = [float(value(line)) for line in system.lines if line["domain"] == domain]
        means.append(sum(values) / len(values))
    return sum(means) / len(means)


@dataclass
class SystemSummary:
    """Every number the tables show for one system."""

    label: str
    episodes: int
    pass_at_1: dict[str, BootstrapResult] | None
    pass_hat: dict[str, dict[int, float]]
    steps: dict[str, float]
    seconds: float
    model_calls: float
    errors: int
    timeouts: int
    unscored: int
    cut: int = 0  # episodes that reached env.max_steps (termination max_steps; they score 0)
    # (errored, episodes) per domain and over all (AVERAGE): a cell with errored episodes shows
    # "error (n/N)", not a Pass@1 that counts them as failures
    errored: dict[str, tuple[int, int]] = field(default_factory=dict)
    problem: str | None = None
    router: dict[str, Any] | None = None  # router.budget / every_n and calls (router methods)
    turns: dict[str, float] = field(default_factory=dict)  # agent turns by tag, per episode
    # inferred tags (prour.eval.tags) per episode of an imported run; None for prour's runs
    inferred_turns: dict[str, float] | None = None
    # routes of the post-hoc decomposer pass per episode (act/clarify/verify) of an imported run
    posthoc_routes: dict[str, float] | None = None
    calls_by_role: dict[str, float] = field(default_factory=dict)  # model calls per episode


def summarize(system: System, n_boot: int = 10_000, ci: float = 0.95) -> SystemSummary:
    """Pass@1 with intervals, pass^k, turn split, seconds, calls and failure counts."""
    steps = {kind: _domain_mean(system, lambda line, k=kind: line["steps"][k]) for kind in STEP_KINDS}
    steps["total"] = sum(steps[k] for k in STEP_KINDS)
    summary = SystemSummary(
        label=system.label, episodes=len(system.lines), pass_at_1=None, pass_hat={},
        steps=steps, seconds=_domain_mean(system, lambda line: line["seconds"]),
        model_calls=_calls_mean(system),
        errors=sum(bool(line["error"]) for line in system.lines),
        timeouts=sum(bool(line["timeout"]) for line in system.lines),
        unscored=sum(bool(line["unscored"]) for line in system.lines),
        cut=sum(is_cut(line["termination"]) for line in system.lines),
        errored=error_counts(system), router=router_summary(system), turns=turn_tags(system),
        calls_by_role=role_calls(system), inferred_turns=inferred_tags(system),
        posthoc_routes=posthoc_routes(system))
    try:
        tables = system.by_domain()
        summary.pass_at_1 = domain_pass_at_1(tables, n_boot=n_boot, ci=ci)
        summary.pass_hat = _pass_hat(tables)
    except ValueError as exc:
        summary.problem = str(exc)
        logger.warning("%s: %s", system.label, exc)
    return summary


def _calls_mean(system: System) -> float:
    """Model calls per episode (domain mean); NaN when the episodes did not record them (an
    imported run)."""
    if any(line["model_calls_total"] is None for line in system.lines):
        return math.nan
    return _domain_mean(system, lambda line: line["model_calls_total"])


def inferred_tags(system: System) -> dict[str, float] | None:
    """Inferred turn tags (:data:`prour.eval.tags.INFERRED_TAGS`) per episode, domain mean, of a
    system whose episodes carry them (an imported run); None otherwise."""
    from prour.eval.tags import INFERRED_TAGS

    if not all("inferred_turns" in line for line in system.lines):
        return None
    return {tag: _domain_mean(system, lambda line, t=tag: line["inferred_turns"].count(t))
            for tag in INFERRED_TAGS}


def posthoc_routes(system: System) -> dict[str, float] | None:
    """Routes per episode (act, clarify, verify; mean over a domain's measured episodes, then
    over domains) the post-hoc decomposer pass gave an imported run's turns; None when it has
    not run or did not route (:mod:`prour.eval.posthoc`)."""
    from prour.eval.posthoc import load_posthoc

    if system.folder is None or not all("inferred_turns" in line for line in system.lines):
        return None
    measured = load_posthoc(system.folder)
    per_domain: dict[str, list[list[str]]] = {}
    for line in system.lines:
        records = measured.get(result_key(line["key"]))
        if records and all(r.get("route") for r in records):
            per_domain.setdefault(line["domain"], []).append([r["route"] for r in records])
    if not per_domain:
        return None
    means = [{kind: sum(e.count(kind) for e in episodes) / len(episodes) for kind in STEP_KINDS}
             for episodes in per_domain.values()]
    return {kind: sum(m[kind] for m in means) / len(means) for kind in STEP_KINDS}


def error_counts(system: System) -> dict[str, tuple[int, int]]:
    """(errored episodes, episodes) per domain, and over every domain under AVERAGE."""
    counts = {}
    for domain in system.domains:
        lines = [line for line in system.lines if line["domain"] == domain]
        counts[domain] = (sum(bool(line["error"]) for line in lines), len(lines))
    counts[AVERAGE] = (sum(n for n, _ in counts.values()), sum(t for _, t in counts.values()))
    return counts


def error_cell(counts: tuple[int, int] | None) -> str | None:
    """``error (n/N)`` when a cell's episodes include errored ones, else None (a measurement)."""
    if counts is None or counts[0] == 0:
        return None
    return f"error ({counts[0]}/{counts[1]})"


ERROR_NOTE = ("error (n/N): n of the cell's N episodes ended in an error, so it holds no "
              "measurement; rerun `prour eval` with the same recipe and folder to run them again.")


def turn_tags(system: System) -> dict[str, float]:
    """Agent turns per episode by tag (question, confirmation, verification, act; domain mean).
    Result lines written before turn tags were recorded count from their act / clarify / verify
    split."""
    from prour.eval.agent import TURN_TAGS

    def count(line: dict[str, Any], tag: str) -> int:
        turns = line.get("turns")
        return turns.count(tag) if turns is not None else line["steps"].get(tag, 0)

    return {tag: _domain_mean(system, lambda line, t=tag: count(line, t)) for tag in TURN_TAGS}


def role_of(call_key: str) -> str:
    """``decomposer.chat`` → ``decomposer``: the model role of a model-call counter."""
    return call_key.rsplit(".", 1)[0]


def role_calls(system: System) -> dict[str, float]:
    """Model calls (chat and score) per episode by role, domain mean; every role any episode
    used is listed."""
    roles = sorted({role_of(k) for line in system.lines for k in line["model_calls"]})
    per_role = lambda line, role: sum(n for k, n in line["model_calls"].items()
                                      if role_of(k) == role)
    return {role: _domain_mean(system, lambda line, r=role: per_role(line, r)) for role in roles}


def router_summary(system: System) -> dict[str, Any] | None:
    """The router settings of a system's episodes (``router.budget``, ``router.every_n``; several
    values are listed) and its router calls and skipped steps per episode (domain mean); None
    when no episode ran a router."""
    records = [line.get("router") for line in system.lines]
    if not any(records):
        return None
    count = lambda key: _domain_mean(system, lambda line: (line.get("router") or {}).get(key, 0))
    settings = lambda key: sorted({r[key] for r in records if r}, key=lambda v: (v is None, v))
    return {"budget": settings("budget"), "every_n": settings("every_n"),
            "calls_per_episode": count("calls"), "skipped_per_episode": count("skipped")}


def _pass_hat(tables: dict[str, dict[str, dict[int, float]]]) -> dict[str, dict[int, float]]:
    """pass^k for k = 1..n_seeds per domain, and the mean over domains."""
    n = min(len({s for row in t.values() for s in row}) for t in tables.values())
    out = {d: {k: pass_hat_k(t, k) for k in range(1, n + 1)} for d, t in tables.items()}
    out[AVERAGE] = {k: sum(out[d][k] for d in tables) / len(tables) for k in range(1, n + 1)}
    return out


@dataclass
class Comparison:
    """Paired Pass@1 difference (system − baseline) per domain and averaged."""

    label: str
    baseline: str
    deltas: dict[str, BootstrapResult] | None
    holm: dict[str, float] = field(default_factory=dict)
    problem: str | None = None
    errored: dict[str, tuple[int, int]] = field(default_factory=dict)  # both systems together


def compare(systems: Sequence[System], baseline: str | None, n_boot: int = 10_000,
            ci: float = 0.95) -> list[Comparison]:
    """Every system against the baseline (default: the first), on identical tasks and seeds."""
    if len(systems) < 2:
        return []
    base = _find(systems, baseline) if baseline else systems[0]
    out = []
    for system in systems:
        if system is base:
            continue
        mine, theirs = error_counts(system), error_counts(base)
        errored = {d: (mine[d][0] + theirs[d][0], mine[d][1] + theirs[d][1])
                   for d in mine if d in theirs}
        try:
            deltas = compare_runs(system.by_domain(), base.by_domain(), n_boot=n_boot, ci=ci)
            out.append(Comparison(system.label, base.label, deltas, errored=errored))
        except ValueError as exc:
            out.append(Comparison(system.label, base.label, None, problem=str(exc)))
    family = {(i, d): c.deltas[d] for i, c in enumerate(out) if c.deltas for d in c.deltas}
    for (i, domain), p in holm_table(family).items():
        out[i].holm[domain] = p
    return out


def _find(systems: Sequence[System], label: str) -> System:
    for system in systems:
        if label in (system.label, system.base_label):
            return system
    raise ValueError(f"baseline {label!r} is not among the systems: "
                     f"{', '.join(s.label for s in systems)}")


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
        rows.append([s.label, *passes, *(f"{s.steps[k]:.2f}" for k in (*STEP_KINDS, "total")),
                     f"{s.seconds:.2f}", _calls_cell(s.model_calls, 1), s.errors, s.timeouts, s.cut,
                     s.episodes])
    return table(header, rows)


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
    rows = [[s.label, *(f"{s.turns.get(tag, 0.0):.2f}" for tag in TAG_NAMES)] for s in summaries]
    return table(header, rows)


def calls_table(summaries: Sequence[SystemSummary]) -> list[str]:
    """Mean model calls per episode by role (chat and score calls; 0 where a system has none)."""
    roles = sorted({role for s in summaries for role in s.calls_by_role})
    header = ["System", *roles, "Total"]
    rows = [[s.label, *(f"{s.calls_by_role.get(r, 0.0):.2f}" for r in roles),
             _calls_cell(s.model_calls, 2)] for s in summaries]
    return table(header, rows)


def _calls_cell(calls: float, digits: int) -> str:
    """Model calls per episode; "not recorded" for an imported run (tau2 records no calls)."""
    return "not recorded" if math.isnan(calls) else f"{calls:.{digits}f}"


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
        raise ValueError(f"no result lines in {', '.join(map(str, run_dirs))}")
    out = Path(out_dir) if out_dir is not None else Path(run_dirs[0]) / "report"
    out.mkdir(parents=True, exist_ok=True)
    domains = [d for d in DOMAINS if any(d in s.domains for s in systems)]
    summaries = [summarize(s, n_boot, ci) for s in systems]
    comparisons = compare(systems, baseline, n_boot, ci)
    written = _plots(systems, summaries, out)
    lines = _header(run_dirs, systems, ci, n_boot)
    lines += ["## Question writers", "", *writers_table(systems), ""]
    lines += ["## Pass@1 (%) and interaction cost", ""]
    lines += main_table(summaries, domains) + [""]
    if any(s.errors for s in summaries):
        lines += [ERROR_NOTE, ""]
    lines += [f"- {s.label}: {s.problem}" for s in summaries if s.problem]
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
    payload: dict[str, Any] = {"systems": [jsonable(asdict(s)) for s in summaries],
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


def _header(run_dirs: Sequence[str | Path], systems: Sequence[System], ci: float,
            n_boot: int) -> list[str]:
    from prour.eval.imported import imported_header

    lines = ["# Evaluation report", ""]
    for run_dir in run_dirs:
        mine = [s for s in systems if s.folder == Path(run_dir)]
        if any("imported" in line for s in mine for line in s.lines):
            lines += imported_header(run_dir, [line for s in mine for line in s.lines])
            continue
        record = _provenance(Path(run_dir))
        commit = ((record.get("git") or {}).get("commit") or "")[:12]
        lines.append(f"- run `{run_dir}`" + (f" (commit {commit})" if commit else "") + ": "
                     + _protocol_line(record, [s for s in systems if s.folder == Path(run_dir)]))
    for run_dir in run_dirs:
        block = _protocol_block(Path(run_dir))
        if block:
            lines += ["", f"Protocol of `{run_dir}`:", *(f"- {line}" for line in block)]
    note = (f"Intervals: {100 * ci:.0f}% paired task bootstrap ({n_boot} draws); seeds are "
            "averaged within each task. Average: unweighted mean over domains.")
    lines += ["", note, ""]
    return lines


def _protocol_block(run_dir: Path) -> list[str]:
    """The Protocol lines (:func:`prour.protocol.protocol_block`) of the recipe the eval run
    saved (``recipe.resolved.yaml``); none when it has none or it no longer reads."""
    from prour.protocol import protocol_block
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
    curves.update(_posthoc_curves(systems, set(curves)))
    if curves:
        written["uncertainty_over_steps"] = plot_uncertainty(curves, out / UNCERTAINTY_PLOT)
    if any(s.sweep is not None for s in systems):
        written.update(_tradeoff_plots(systems, out))
    return written


def _posthoc_curves(systems: Sequence[System], recorded: set[str]) -> dict[str, Any]:
    """``label (post-hoc)`` curves of systems without recorded AU/EU, from the run folder's
    post-hoc decomposer pass (:mod:`prour.eval.posthoc`; none when it has not run)."""
    from prour.eval.plots import mean_curves
    from prour.eval.posthoc import load_posthoc

    measured: dict[Path, dict[str, list[dict[str, Any]]]] = {}
    out = {}
    for system in systems:
        if system.label in recorded or system.folder is None:
            continue
        if system.folder not in measured:
            measured[system.folder] = load_posthoc(system.folder)
        episodes = [measured[system.folder][result_key(line["key"])] for line in system.lines
                    if result_key(line["key"]) in measured[system.folder]]
        if episodes:
            out[f"{system.label} (post-hoc)"] = mean_curves(episodes)
    return out


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


# ---- attention protocol -------------------------------------------------------------------


def _model_label(system: System, several_runs: bool) -> str:
    return f"{system.run}:{system.method}" if several_runs else system.method


def conversation_records(systems: Sequence[System], transcripts: bool = False) -> list[Any]:
    """One :class:`ConversationRecord` per gated episode: model = method, method = policy;
    with ``transcripts``, each carries the dialogue as the user saw it (from the episodes)."""
    from prour.eval.attention.analysis import ConversationRecord

    several = len({s.run for s in systems}) > 1
    records = []
    for system in systems:
        seen = _user_views(system) if transcripts else {}
        for line in system.lines:
            block = line.get("attention")
            if not block:
                continue
            records.append(ConversationRecord(
                method=line["variant"], model=_model_label(system, several),
                domain=line["domain"], task_id=line["task_id"], seed=int(line["seed"]),
                reward=float(line["score"]), requests=block["requests"],
                fallback=block["fallbacks"] > 0, cut=is_cut(line["termination"]),
                transcript=seen.get(tuple(line["key"]))))
    return records


def _user_views(system: System) -> dict[tuple, list[dict[str, Any]]]:
    """Episode key → the messages its user saw, from the run folder's episodes."""
    from prour.env.trajectory import read_trajectories, user_view
    from prour.eval.harness import EPISODES_FILE

    if system.folder is None:
        return {}
    path = system.folder / EPISODES_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{system.folder} holds no {EPISODES_FILE}: the burden study "
                                "shows annotators the conversations it stores")
    return {t.key: user_view(t.messages, t.steps)
            for t in read_trajectories(path, on_error="skip")}


def _cost_settings(systems: Sequence[System], accounting: str | None,
                   lam: float | None) -> tuple[str, float, Any]:
    """Accounting, λ and weights: the arguments, else those the runs were made with."""
    from prour.config.attention import DEFAULT_LAMBDA, CostWeights

    block = next((line["attention"] for s in systems for line in s.lines
                  if line.get("attention")), {})
    weights = CostWeights(**block["weights"]) if block.get("weights") else CostWeights()
    return (accounting or block.get("accounting", "full"),
            lam if lam is not None else block.get("lam", DEFAULT_LAMBDA), weights)


def attention_section(systems: Sequence[System], out: Path, n_boot: int, ci: float,
                      accounting: str | None, lam: float | None,
                      ) -> tuple[list[str], dict[str, Any], Path | None]:
    """Markdown lines, JSON data and the reward-versus-attention plot of the gated runs (the
    tables: :mod:`prour.eval.attention.tables`)."""
    from prour.eval.attention.tables import attention_tables

    records = conversation_records(systems)
    if not records:
        return ["## Attention", "", "No run used an attention policy.", ""], {}, None
    accounting, lam, weights = _cost_settings(systems, accounting, lam)
    return attention_tables(records, accounting, lam, weights, n_boot, ci, out / ATTENTION_PLOT)


# ---- human burden study -------------------------------------------------------------------


def burden_study(systems: Sequence[System], out: Path, n_pairs: int,
                 annotations: str | Path | None, accounting: str | None, n_boot: int,
                 ci: float) -> tuple[list[str], dict[str, Any], dict[str, Path]]:
    """The human burden study (ask-less paper, Table 4) in two passes: export ``n_pairs``
    equal-count pairs to ``OUT/burden/``, then, given the annotators' answers, their agreement
    with the cost ranking stored in ``pairs_key.jsonl``. Returns markdown, JSON and files."""
    if n_pairs and annotations:
        raise ValueError("export the pairs (--burden-pairs) and score the answers "
                         "(--annotations) in separate runs: the answers refer to pairs already "
                         "exported, which a new export would replace")
    if n_pairs < 0:
        raise ValueError(f"--burden-pairs must be >= 0, got {n_pairs}")
    from prour.eval.attention.tables import (
        BURDEN_DIR,
        BURDEN_KEY,
        agreement_section,
        export_section,
    )

    if annotations is None:
        accounting, _, weights = _cost_settings(systems, accounting, None)
        return export_section(conversation_records(systems, transcripts=True), out / BURDEN_DIR,
                              n_pairs, accounting, weights)
    return agreement_section(out / BURDEN_DIR / BURDEN_KEY, Path(annotations), n_boot, ci)
