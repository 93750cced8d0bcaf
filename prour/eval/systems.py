"""The systems of evaluation runs and the numbers the report shows for each.

A *system* is one (run folder, method, attention variant): :func:`load_systems` groups a run's
result lines into systems, :func:`summarize` computes a system's Pass@1 with intervals, pass^k,
turn split, seconds, calls and failure counts, and :func:`compare` pairs each system with a
baseline on the same tasks and seeds. The report (:mod:`prour.eval.report`) and the paper beside
the run (:mod:`prour.eval.paper`) lay them out.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
)

from prour.config.eval import sweep_label
from prour.env.domains import DOMAINS
from prour.env.trajectory import is_cut
from prour.eval.harness import RESULTS_FILE, load_result_lines, result_key
from prour.eval.metrics import AVERAGE, STEP_KINDS, compare_runs, domain_pass_at_1, pass_hat_k
from prour.eval.stats import BootstrapResult, holm_table

logger = logging.getLogger(__name__)


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


# ---- the result lines a report reads ----------------------------------------------------


def _finite(value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


Finite = Annotated[float, AfterValidator(_finite)]
Count = Annotated[float, AfterValidator(_finite), Field(ge=0)]


class _Fields(BaseModel):
    model_config = ConfigDict(extra="allow")


class _Steps(_Fields):
    act: Count
    clarify: Count
    verify: Count


class _Decision(_Fields):
    au: Finite | None = None
    eu: Finite | None = None
    total: Finite | None = None


class _Router(_Fields):
    calls: Count = 0
    skipped: Count = 0
    budget: int | None = None
    every_n: int | None = None


class _Checkpoint(_Fields):
    name: str
    step: int | None = None


class _Imported(_Fields):
    sha256: str
    source: str
    agent_implementation: str
    user_implementation: str


class ReportLine(_Fields):
    """The fields of a result line (:func:`prour.eval.results.result_line`) that the report
    reads, with their types: a line that does not fit is skipped, named by file, line and
    dotted key, and counted in the report."""

    method: str
    variant: str | None = None
    generator: str | None = None
    sweep: dict[Annotated[str, StringConstraints(pattern=r"^[a-z_]+\.[a-z_]+$")],
                int | None] | None = None
    domain: str
    task_id: str
    seed: int
    score: Annotated[float, AfterValidator(_finite), Field(ge=0, le=1)]
    success: bool
    error: bool
    timeout: bool
    unscored: bool
    termination: str | None
    steps: _Steps
    turns: list[str] | None = None
    seconds: Count
    model_calls: dict[str, Count]
    model_calls_total: Count | None
    decisions: list[_Decision]
    router: _Router | None = None
    checkpoint: _Checkpoint | None = None
    question_writer: str | None = None
    inferred_turns: list[str] | None = None
    imported: _Imported | None = None


def checked_line(line: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """(the line with its report fields in their types, None), or (None, ``key.sub: why``)."""
    try:
        model = ReportLine.model_validate(line)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "<line>"
        got = "" if err["type"] == "missing" else f" (got {err.get('input')!r:.60})"
        return None, f"{where}: {err['msg'].removeprefix('Value error, ')}{got}"
    return {**line, **model.model_dump(exclude_unset=True)}, None


class Systems(list):
    """The systems of some run folders; ``skipped`` names each result line left out
    (``file:line: key: why``), which the report counts and lists."""

    def __init__(self, systems: Sequence[System] = (), skipped: Sequence[str] = ()):
        super().__init__(systems)
        self.skipped: list[str] = list(skipped)


def _usable_lines(path: Path, skipped: list[str]) -> list[dict[str, Any]]:
    """The result lines of ``path`` the report can read; the others go to ``skipped``."""
    loaded = load_result_lines(path)
    skipped += loaded.skipped
    lines = []
    for key, line in loaded.items():
        fitted, problem = checked_line(line)
        if fitted is None:
            skipped.append(f"{path}:{loaded.line_numbers.get(key, '?')}: {problem}")
            logger.warning("skipping result line %s", skipped[-1])
            continue
        lines.append(fitted)
    return lines


def load_systems(run_dirs: Sequence[str | Path]) -> Systems:
    """Systems of every run folder, in run order then first appearance (a checkpoint sweep's
    steps in step order); labels are made unique by prefixing the run folder's name where two
    runs share a method and generator. Result lines the report cannot read are left out and
    named in ``.skipped``."""
    from prour.eval.imported import imported_lines, is_imported_run

    systems = Systems()
    for run_dir in run_dirs:
        path = Path(run_dir) / RESULTS_FILE
        if is_imported_run(run_dir):
            lines = imported_lines(run_dir)
        elif path.is_file():
            lines = _usable_lines(path, systems.skipped)
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


def domain_mean(system: System, value: Any) -> float:
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
    steps: dict[str, float | None]  # None: not measured (see not_measured)
    seconds: float | None
    model_calls: float | None  # NaN: not recorded (an imported run); None: not measured
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
    # why steps, seconds and calls are missing (every episode errored); None: they were measured
    not_measured: str | None = None


def unmeasured(system: System) -> str | None:
    """Why a system's steps, seconds and calls were not measured (None: they were): every one of
    its episodes errored, so their counts say how far each got before the error, not what the
    method costs."""
    n = len(system.lines)
    if n and all(line["error"] for line in system.lines):
        return f"all {n} episodes errored" if n > 1 else "its one episode errored"
    return None


def summarize(system: System, n_boot: int = 10_000, ci: float = 0.95) -> SystemSummary:
    """Pass@1 with intervals, pass^k, turn split, seconds, calls and failure counts. A system
    whose every episode errored has no steps, seconds or calls (None; ``not_measured`` says
    why): the tables show them as missing, not as the zeros its episodes recorded."""
    missing = unmeasured(system)
    steps: dict[str, float | None] = {
        kind: None if missing else domain_mean(system, lambda line, k=kind: line["steps"][k])
        for kind in STEP_KINDS}
    steps["total"] = None if missing else sum(steps[k] or 0.0 for k in STEP_KINDS)
    summary = SystemSummary(
        label=system.label, episodes=len(system.lines), pass_at_1=None, pass_hat={},
        steps=steps,
        seconds=None if missing else domain_mean(system, lambda line: line["seconds"]),
        model_calls=None if missing else _calls_mean(system), not_measured=missing,
        errors=sum(bool(line["error"]) for line in system.lines),
        timeouts=sum(bool(line["timeout"]) for line in system.lines),
        unscored=sum(bool(line["unscored"]) for line in system.lines),
        cut=sum(is_cut(line["termination"]) for line in system.lines),
        errored=error_counts(system), router=router_summary(system),
        turns={} if missing else turn_tags(system),
        calls_by_role={} if missing else role_calls(system), inferred_turns=inferred_tags(system),
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
    return domain_mean(system, lambda line: line["model_calls_total"])


def inferred_tags(system: System) -> dict[str, float] | None:
    """Inferred turn tags (:data:`prour.eval.tags.INFERRED_TAGS`) per episode, domain mean, of a
    system whose episodes carry them (an imported run); None otherwise."""
    from prour.eval.tags import INFERRED_TAGS

    if not all("inferred_turns" in line for line in system.lines):
        return None
    return {tag: domain_mean(system, lambda line, t=tag: line["inferred_turns"].count(t))
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


def turn_tags(system: System) -> dict[str, float]:
    """Agent turns per episode by tag (question, confirmation, verification, act; domain mean).
    Result lines written before turn tags were recorded count from their act / clarify / verify
    split."""
    from prour.eval.agent import TURN_TAGS

    def count(line: dict[str, Any], tag: str) -> int:
        turns = line.get("turns")
        return turns.count(tag) if turns is not None else line["steps"].get(tag, 0)

    return {tag: domain_mean(system, lambda line, t=tag: count(line, t)) for tag in TURN_TAGS}


def role_of(call_key: str) -> str:
    """``decomposer.chat`` → ``decomposer``: the model role of a model-call counter."""
    return call_key.rsplit(".", 1)[0]


def role_calls(system: System) -> dict[str, float]:
    """Model calls (chat and score) per episode by role, domain mean; every role any episode
    used is listed."""
    roles = sorted({role_of(k) for line in system.lines for k in line["model_calls"]})
    per_role = lambda line, role: sum(n for k, n in line["model_calls"].items()
                                      if role_of(k) == role)
    return {role: domain_mean(system, lambda line, r=role: per_role(line, r)) for role in roles}


def router_summary(system: System) -> dict[str, Any] | None:
    """The router settings of a system's episodes (``router.budget``, ``router.every_n``; several
    values are listed) and its router calls and skipped steps per episode (domain mean); None
    when no episode ran a router."""
    records = [line.get("router") for line in system.lines]
    if not any(records):
        return None
    count = lambda key: domain_mean(system, lambda line: (line.get("router") or {}).get(key, 0))
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


def posthoc_curves(systems: Sequence[System], recorded: set[str]) -> dict[str, Any]:
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
