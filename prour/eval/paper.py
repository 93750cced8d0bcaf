"""The paper beside the run: every table and figure of the Prour paper that a run of the chain can
produce (Table 1, Table 5, Table 6, Figure 2, Figures 4 to 8), each with the run's numbers next
to the values the paper's text states (:data:`VALUES_FILE`, shipped with the package: each value
with its source, our reading of the claim, and the paper's exact words).

``prour report EVAL_DIR`` writes them under ``<report dir>/paper/``
(:func:`prour.eval.paper_report.write_paper_report`): ``table1.md``, ``table5.md``,
``table6.md``, one PNG per figure with its sidecar series (:mod:`prour.eval.paper_plots`),
``summary.txt`` (what the terminal shows) and ``index.html``, one ``<section>`` per item.
The evidence beyond the eval folder comes from the run folder its saved recipe names
(``EVAL_DIR/recipe.resolved.yaml`` → ``run_dir``, or ``--run-dir``): training metrics
(``train.output_dir``), the router evidence of calibration
(:func:`prour.router.pipeline.router_evidence_path`), the trade-off sweep folders
(:data:`prour.config.eval.TRADEOFF_FOLDERS`) and the taxonomy's reviewed labels
(:mod:`prour.eval.paper_taxonomy`). What the run lacks for an item is said in its
file and section, with the step or recipe key that makes it; nothing unmeasured reads 0.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prour.config import Recipe
from prour.config.eval import TRADEOFF_FOLDERS, TRADEOFF_SWEEPS
from prour.env.domains import DOMAINS
from prour.eval.markdown import pct
from prour.eval.metrics import AVERAGE, STEP_KINDS
from prour.eval.run_evidence import RunEvidence
from prour.eval.systems import (
    System,
    SystemSummary,
    domain_mean,
    error_cell,
    error_counts,
    load_systems,
    posthoc_curves,
    router_summary,
)

VALUES_FILE = "paper_values.yaml"
PAPER_DIR = "paper"
SUMMARY_FILE = "summary.txt"
INDEX_FILE = "index.html"
FILES = {"table1": "table1.md", "table2": "table2.md", "table3": "table3.md",
         "table4": "table4.md", "table5": "table5.md", "table6": "table6.md",
         "table7": "table7.md",
         "figure2": "figure2_sources.png", "figure4": "figure4_training.png",
         "figure5": "figure5_budget.png", "figure6": "figure6_uncertainty.png",
         "figure7": "figure7_router_f1.png", "figure8": "figure8_frequency.png"}
TITLES = {"table1": "Table 1: main results (Pass@1 and interaction steps)",
          "table2": "Table 2: the query generator varied alone",
          "table3": "Table 3: agent backbones under the query generators",
          "table4": "Table 4: transfer to τ³-bench",
          "table7": "Table 7: GLM-4-32B as agent and decomposer, with model-matched thresholds",
          "table5": "Table 5: uncertainty events of the decision steps, by source",
          "figure2": "Figure 2: where the missing information lives, world side against user side",
          "table6": "Table 6: routing F1 after calibration (dev set)",
          "figure4": "Figure 4: prior and posterior log-likelihood, reward over training",
          "figure5": "Figure 5: success and steps against the decomposer-call budget",
          "figure6": "Figure 6: AU, EU and total uncertainty over the first 16 steps",
          "figure7": "Figure 7: held-out routing macro-F1, decomposer against LLM router",
          "figure8": "Figure 8: success, steps and wall-clock against invocation frequency"}
UNITS = {"%": " %", "steps": " steps", "s": " s", "states": " states", "events": " events"}


# ---- the paper's values ------------------------------------------------------------------


@dataclass(frozen=True)
class PaperValue:
    """One number the paper's text states (an entry of :data:`VALUES_FILE`)."""

    id: str
    item: str
    metric: str
    text: str  # as the paper writes it
    unit: str
    source: str
    claim: str
    phrase: str
    method: str | None = None
    model: str | None = None
    domain: str | None = None
    label: str | None = None
    at: dict[str, int] = field(default_factory=dict)

    @property
    def value(self) -> float:
        return float(self.text.replace(",", ""))

    def shown(self) -> str:
        """``28.17 %``, ``21.33 steps``, ``0.714``."""
        return self.text + UNITS.get(self.unit, "")


@functools.cache
def paper_data() -> dict[str, Any]:
    """The parsed data file (package data beside this module)."""
    from importlib.resources import files

    import yaml

    return yaml.safe_load((files("prour.eval") / VALUES_FILE).read_text(encoding="utf-8"))


def paper_values(item: str | None = None, **where: str | None) -> list[PaperValue]:
    """The paper's values, of one item and matching every ``where`` field when given."""
    found = []
    for entry in paper_data()["values"]:
        value = PaperValue(**{("text" if k == "value" else k): v for k, v in entry.items()})
        if (item is None or value.item == item) and all(getattr(value, k) == v
                                                        for k, v in where.items()):
            found.append(value)
    return found


def paper_value(item: str, **where: str | None) -> PaperValue | None:
    """The one value of ``item`` matching ``where`` (None: the text states none)."""
    found = paper_values(item, **where)
    if len(found) > 1:
        raise ValueError(f"{VALUES_FILE}: {len(found)} values match {item} {where}")
    return found[0] if found else None


def paper_methods() -> dict[str, str]:
    """prour method → the paper's name for it."""
    return dict(paper_data()["methods"])


def paper_note(item: str) -> str | None:
    """What the paper says about ``item`` without a number (None: nothing)."""
    return paper_data().get("notes", {}).get(item)


# ---- one item of the paper beside the run ------------------------------------------------


@dataclass
class Item:
    """A table or figure: the run's rows beside the paper's, what is missing and why."""

    key: str
    header: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    text: list[str] = field(default_factory=list)  # one terminal line per row
    missing: list[str] = field(default_factory=list)  # what the run lacks, what makes it
    notes: list[str] = field(default_factory=list)

    @property
    def title(self) -> str:
        return TITLES[self.key]

    @property
    def file(self) -> str:
        return FILES[self.key]

    @property
    def paper(self) -> list[PaperValue]:
        return paper_values(self.key)


def _f(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


# ---- Table 1 -----------------------------------------------------------------------------


def _pass_cell(summary: SystemSummary, domain: str, interval: bool = True) -> str:
    """Pass@1 (%) of one domain or the average: ``error (n/N)`` where episodes errored."""
    if summary.pass_at_1 is None:
        return f"– ({summary.problem})"
    errored = error_cell(summary.errored.get(domain))
    if errored or domain not in summary.pass_at_1:
        return errored or "– (not run on this domain)"
    result = summary.pass_at_1[domain]
    return pct(result) if interval else f"{100 * result.estimate:.2f}"


def _paper_row(method: str, domains: Sequence[str]) -> list[str]:
    name = paper_methods()[method]
    cell = lambda metric, domain: (v.text if (v := paper_value(
        "table1", method=method, metric=metric, domain=domain)) else "–")
    return [method, f"paper ({name})", *(cell("pass_at_1", d) for d in [*domains, AVERAGE]),
            "–", "–", "–", cell("steps", AVERAGE)]


def _paper_text(method: str) -> str:
    found = paper_values("table1", method=method)
    shown = lambda v: (f"{v.domain} {v.text} %" if v.metric == "pass_at_1"
                       else f"total steps {v.text}")
    return ", ".join(map(shown, found)) or "no number in the text"


def table1_item(systems: Sequence[System], summaries: Sequence[SystemSummary]) -> Item:
    """One row per system of the main evaluation (sweep points excluded) and, under each
    method the paper reports, the paper's row; then the paper's methods the run did not
    evaluate."""
    present = {d for s in systems for d in s.domains}
    paper_domains = {v.domain for v in paper_values("table1")} - {AVERAGE}
    domains = [d for d in DOMAINS if d in present | paper_domains]
    item = Item("table1", header=["System", "Source", *domains, "Average", "Act", "Clarify",
                                  "Verify", "Total steps"])
    methods, evaluated = paper_methods(), set()
    for system, s in zip(systems, summaries):
        if system.sweep is not None:
            continue
        evaluated.add(system.method)
        steps = [_f(s.steps[k]) for k in (*STEP_KINDS, "total")]
        item.rows.append([s.label, "this run", *(_pass_cell(s, d) for d in [*domains, AVERAGE]),
                          *steps])
        item.text.append(
            f"{s.label}: " + ", ".join(f"{d} {_pass_cell(s, d, False)}" for d in
                                       [*domains, AVERAGE])
            + f" %; steps {'/'.join(steps[:3])} = {steps[3]} (act/clarify/verify)"
            + (f" | paper: {_paper_text(system.method)}" if system.method in methods else ""))
        if system.method in methods:
            item.rows.append(_paper_row(system.method, domains))
    for method in methods:
        if method in evaluated or not paper_values("table1", method=method):
            continue
        item.rows += [[method, "this run", "not evaluated", *["–"] * (len(domains) + 4)],
                      _paper_row(method, domains)]
        item.text.append(f"{method}: not evaluated in this run | paper: {_paper_text(method)}")
        item.missing.append(f"{method} ({methods[method]}): not evaluated in this run; "
                            f"add `{method}` to eval.methods")
    item.notes.append("–: the paper's text states no number for this cell (the cells of its "
                      "Table 1 are not in our copy); a run cell `error (n/N)` holds errored "
                      "episodes, not a measurement.")
    item.notes += _task_sets(systems)
    item.notes += _ig_clarifier_backbone(systems)
    return item


def _ig_clarifier_backbone(systems: Sequence[System]) -> list[str]:
    """Which model wrote IG-Clarifier's questions, beside the paper's Qwen3-8B backbone."""
    writers = sorted({w for s in systems if s.method == "ig-clarifier" and s.sweep is None
                      for w in (s.question_writers or [])})
    if not writers:
        return []
    note = ("ig-clarifier: the paper reimplements every baseline on the Qwen3-8B backbone "
            f"(A.2.1); this run's IG-Clarifier questions were written by {', '.join(writers)}, "
            "its clarifier trained from models.generator as prour's is: on the paper's "
            "2 x 80 GiB node a Qwen3-8B policy's training does not fit beside the 8B responders "
            "(recipes/paper.yaml, the comment above eval.methods).")
    return [note]


def _task_sets(systems: Sequence[System]) -> list[str]:
    """The tasks each run folder ran, beside the paper's τ-bench v1 test tasks: the split its
    provenance names and, for a split prour ships, its source and exclusions."""
    from prour.env.domains import task_set_note

    notes = []
    for folder in dict.fromkeys(s.folder for s in systems if s.folder is not None):
        try:
            split = json.loads((folder / "provenance.json").read_text()).get("split")
        except (OSError, json.JSONDecodeError):
            split = None
        if not split:
            notes.append(f"Tasks of `{folder}`: unknown (its provenance.json names no split).")
            continue
        ran = {d for s in systems if s.folder == folder for d in s.domains}
        sets = []
        for domain in [d for d in DOMAINS if d in ran] + sorted(ran - set(DOMAINS)):
            try:
                sets.append(task_set_note(domain, split))
            except ValueError:  # a domain no longer registered
                sets.append(None)
        told = "; ".join(note for note in sets if note)
        base = (" (τ-bench v1's test tasks with tau2's corrections; protocol `v1-test` runs "
                "v1's own)" if split == "base" else "")
        notes.append(f"Tasks of `{folder}`: split `{split}`" + (f": {told}." if told
                                                                else f"{base}."))
    return notes


# ---- router evidence: Table 6 and Figure 7 -------------------------------------------------


def read_router_evidence(evidence: RunEvidence) -> tuple[dict[str, Any] | None, str | None]:
    """The calibration's router evidence, or None and what is missing."""
    if evidence.recipe is None:
        return None, evidence.problem
    path = evidence.router_evidence()
    if not path.is_file():
        return None, (f"{path} is missing: the chain's `heldout` step writes it (`prour "
                      "calibrate --recipe R --stage evaluate`, after `search`)")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return None, f"{path} does not read ({exc}): run the `heldout` step again"
    if data.get("schema") != "prour.router-evidence/1":
        return None, f"{path} has schema {data.get('schema')!r}, not prour.router-evidence/1"
    return data, None


def _scores_problem(scores: dict[str, Any] | None, what: str) -> str | None:
    if scores is None:
        return f"{what}: not recorded"
    return f"{what}: lacking: {scores['lacking']}" if "lacking" in scores else None


def _paper_model_row(model: str) -> list[str]:
    get = lambda metric: (v.text if (v := paper_value("table6", model=model, metric=metric))
                          else "–")
    return [model, "paper", "–", "–", "–", "–", get("macro_f1"), get("tau_au"), get("tau_eu")]


def _class_f1(value: float | None) -> str:
    """A per-class F1; None: no dev state holds that label (not a measured 0)."""
    return "no label" if value is None else f"{value:.3f}"


def table6_item(data: dict[str, Any] | None, problem: str | None) -> Item:
    """The run's dev scores (per-class and macro F1, thresholds) beside the paper's models."""
    item = Item("table6", header=["Decomposer", "Source", "States", "Act F1", "Clarify F1",
                                  "Verify F1", "Macro-F1", "τ_AU", "τ_EU"])
    models = list(dict.fromkeys(v.model for v in paper_values("table6") if v.model))
    paper = "; ".join(f"{row[0]} macro-F1 {row[6]}, τ ({row[7]}, {row[8]})"
                      for row in map(_paper_model_row, models))
    if data is None:
        item.missing.append(problem)
        item.rows.append(["–", "this run", "missing", *["–"] * 6])
        item.text.append(f"this run: missing | paper: {paper}")
    else:
        dev, tau = data["dev"], data.get("thresholds") or {}
        taus = [_f(tau.get("tau_au")), _f(tau.get("tau_eu"))]
        lacking = _scores_problem(dev, "dev scores")
        if lacking:
            item.missing.append(f"{lacking} (the `search` step's dev states)")
            item.rows.append([data["decomposer_model"], "this run (dev)", "lacking",
                              *["–"] * 4, *taus])
        else:
            f1 = [_class_f1(dev["per_class_f1"].get(k)) for k in ("act", "clarify", "verify")]
            item.rows.append([data["decomposer_model"], "this run (dev)", str(dev["states"]),
                              *f1, _f(dev["macro_f1"], 3), *taus])
            item.notes += [f"dev: {note}" for note in dev.get("notes", [])]
        run = item.rows[-1]
        item.text.append(f"this run ({run[0]}, {run[2]} dev states): act/clarify/verify F1 "
                         f"{'/'.join(run[3:6])}, macro-F1 {run[6]}, τ ({taus[0]}, {taus[1]}) "
                         f"| paper: {paper}")
        item.notes.append(dev_mix_line(data.get("dev_mix")))
    item.rows += [_paper_model_row(m) for m in models]
    item.notes.append("–: the paper's text states no number for this cell (the per-class cells "
                      "of its Table 6 are not in our copy).")
    return item


def dev_mix_line(mix: dict[str, Any] | None) -> str:
    """The dev states the search used, by label, beside the paper's mix."""
    paper = ", ".join(f"{v.text} {v.label}" for v in paper_values("table6", metric="mix"))
    if mix is None:
        return ("dev mix: not recorded (router_evidence.json's dev_mix is null: the dev states "
                f"were not walked against router.calibration.dev_mix) | paper: {paper}")
    order = [k for k in ("clarify", "verify", "act") if k in mix.get("target", {})]
    used = " / ".join(f"{mix.get('used', {}).get(k, 0)} {k}" for k in order)
    target = " / ".join(str(mix["target"][k]) for k in order)
    short = ", ".join(f"{k} {n}" for k, n in (mix.get("short") or {}).items())
    walk = "complete" if mix.get("complete") else "not complete (candidates still unlabelled)"
    return (f"dev mix used: {used} (target {target}; short: {short or 'none'}; policy "
            f"`{mix.get('policy')}`; walk {walk}) | paper: {paper}")


def figure7_item(data: dict[str, Any] | None, problem: str | None,
                 ) -> tuple[Item, dict[str, float]]:
    """Held-out macro-F1 (%) of the decomposer and the LLM router beside the paper's; returns
    the item and the run's drawn values (label → %)."""
    item = Item("figure7", header=["Router", "States", "Invalid", "Macro-F1 (%)",
                                   "Paper macro-F1 (%)"])
    drawn: dict[str, float] = {}
    held = (data or {}).get("heldout") or {}
    for label, name in (("decomposer", "calibrated decomposer"), ("llm_router", "LLM router")):
        paper = paper_value("figure7", metric="macro_f1", label=label)
        scores = held.get(label)
        lacking = problem if data is None else _scores_problem(scores, f"held-out {name}")
        if lacking:
            item.missing.append(lacking)
            item.rows.append([name, "–", "–", "missing" if data is None else "lacking",
                              paper.text])
        else:
            drawn[label] = 100 * float(scores["macro_f1"])
            item.notes += [f"held-out {name}: {note}" for note in scores.get("notes", [])]
            item.rows.append([name, str(scores["states"]), str(scores.get("invalid", "–")),
                              _f(drawn[label]), paper.text])
        run = f"{item.rows[-1][3]} % on {item.rows[-1][1]} states" if label in drawn \
            else item.rows[-1][3]
        item.text.append(f"{name}: held-out macro-F1 {run} | paper: {paper.shown()}")
    states = paper_value("figure7", metric="states")
    item.notes.append(f"paper: {states.shown()} held-out airline decision steps.")
    item.missing = list(dict.fromkeys(item.missing))
    return item, drawn


# ---- Figure 4: training ------------------------------------------------------------------

FIGURE4_KEYS = {"belief": (("prior_mean", "prior ℓ_prior"), ("post_mean", "posterior ℓ_post")),
                "reward": (("reward_mean", "all samples"), ("reward_mean_clarify", "clarify"),
                           ("reward_mean_verify", "verify"))}


def figure4_item(evidence: RunEvidence) -> tuple[Item, list[dict[str, Any]]]:
    """The training metrics' prior/posterior and reward curves (first, last per key)."""
    from prour.train.report import read_metrics, series

    item = Item("figure4", header=["Series", "Key", "Steps", "First", "Last", "Paper"])
    if evidence.recipe is None:
        item.missing.append(evidence.problem)
        return item, []
    folder = evidence.metrics_dir()
    try:
        records = read_metrics(folder)
    except FileNotFoundError:
        item.missing.append(f"{folder} holds no metrics.jsonl (train.output_dir): the chain's "
                            "`train` step writes it (`prour train --recipe R`)")
        return item, []
    final = paper_value("figure4", metric="reward")
    for panel, keys in FIGURE4_KEYS.items():
        for key, label in keys:
            xs, ys = series(records, key)
            paper = f"{final.shown()} at step {final.at['step']:,}" if key == "reward_mean" \
                else "–"
            if xs:
                item.rows.append([label, key, str(len(xs)), f"{ys[0]:.4g} (step {xs[0]})",
                                  f"{ys[-1]:.4g} (step {xs[-1]})", paper])
            else:
                item.missing.append(f"{folder}: no step logged `{key}` ({panel} panel)")
                item.rows.append([label, key, "0", "not logged", "not logged", paper])
            item.text.append(f"{key}: {item.rows[-1][3]} → {item.rows[-1][4]}"
                             + (f" | paper: ≈{paper}" if paper != "–" else ""))
    item.notes.append(posterior_line(records))
    return item, records


def posterior_line(records: Sequence[dict[str, Any]]) -> str:
    """At how many logged steps the posterior log-likelihood is above the prior."""
    pairs = [(r["prior_mean"], r["post_mean"]) for r in records
             if isinstance(r.get("prior_mean"), (int, float))
             and isinstance(r.get("post_mean"), (int, float))]
    if not pairs:
        return "posterior above prior: no step logged both prior_mean and post_mean"
    above = sum(post > prior for prior, post in pairs)
    return (f"posterior above prior at {above} of {len(pairs)} steps that logged both (paper: "
            "consistently above, gap widening)")


# ---- Figures 5 and 8: the trade-off sweeps -------------------------------------------------


@dataclass
class SweepPoint:
    """One (method, budget or every_n) point: average Pass@1 (%), steps and seconds."""

    method: str
    value: int | None  # None: an unlimited budget
    folder: str  # the run folder it came from (a sweep folder or the main evaluation's)
    episodes: int
    success: float | None  # None: errored episodes, no measurement
    steps: float
    seconds: float
    errored: str | None = None


def average_pass(system: System) -> float:
    """Pass@1 (%) averaged over domains: per task the mean over seeds, then over tasks."""
    means = []
    for tasks in system.by_domain().values():
        means.append(sum(sum(s.values()) / len(s) for s in tasks.values()) / len(tasks))
    return 100 * sum(means) / len(means)


def sweep_point(system: System, value: int | None, folder: str) -> SweepPoint:
    errored = error_cell(error_counts(system).get(AVERAGE))
    return SweepPoint(
        system.method, value, folder, len(system.lines),
        None if errored else average_pass(system),
        domain_mean(system, lambda line: sum(line["steps"][k] for k in STEP_KINDS)),
        domain_mean(system, lambda line: line["seconds"]), errored)


def _shown(value: int | None) -> str:
    return "unlimited" if value is None else str(value)


def _main_points(systems: Sequence[System], name: str, methods: Sequence[str],
                 folder: str) -> tuple[list[SweepPoint], list[str]]:
    """The main evaluation's systems of the sweep's methods: the recipe's own setting, and the
    points of an ``eval.sweep`` run into the same folder."""
    points = [sweep_point(s, s.sweep[TRADEOFF_SWEEPS[name]], folder) for s in systems
              if s.method in methods and TRADEOFF_SWEEPS[name] in (s.sweep or {})]
    missing = []
    for method in methods:
        found = [s for s in systems if s.method == method and s.sweep is None
                 and s.variant is None]
        if not found:
            missing.append(f"the main evaluation has no `{method}` episodes (eval.methods): "
                           "no point at the recipe's own router settings")
        for system in found:
            values = (router_summary(system) or {}).get(name) or []
            if len(values) != 1:
                missing.append(f"{system.label}: its episodes record router.{name} "
                               f"{values or 'nowhere'}; not one point")
                continue
            points.append(sweep_point(system, values[0], folder))
    return points, missing


def sweep_item(name: str, systems: Sequence[System], evidence: RunEvidence,
               ) -> tuple[Item, list[SweepPoint]]:
    """Figure 5 (``budget``) or 8 (``every_n``): the sweep folder's points and the main
    evaluation's, per method, beside the paper's."""
    key = "figure5" if name == "budget" else "figure8"
    item = Item(key, header=["Method", f"router.{name}", "Folder", "Episodes", "Pass@1 (%)",
                             "Steps", "Seconds", "Paper"])
    if evidence.recipe is None:
        item.missing.append(evidence.problem)
        return item, []
    methods = sweep_methods(evidence.recipe)
    item.missing += [f"`{m}` of eval.tradeoff.methods is not in eval.methods: the chain's "
                     "sweeps leave it out" for m in evidence.recipe.eval.tradeoff.methods
                     if m not in methods]
    points, missing = _main_points(systems, name, methods, evidence.eval_dir.name)
    swept, lacking = _sweep_points(name, evidence, methods)
    points += swept
    item.missing += lacking + missing
    points.sort(key=lambda p: (methods.index(p.method), p.value is None, p.value or 0))
    for p in points:
        paper = _sweep_paper(key, p.method, name, p.value)
        success = p.errored or _f(p.success)
        item.rows.append([p.method, _shown(p.value), p.folder, str(p.episodes), success,
                          _f(p.steps), _f(p.seconds), paper])
        item.text.append(f"{p.method} {name}={_shown(p.value)} ({p.folder}): Pass@1 {success} "
                         f"%, steps {_f(p.steps)}, {_f(p.seconds)} s"
                         + (f" | paper: {paper}" if paper != "–" else ""))
    return item, points


def _sweep_paper(key: str, method: str, name: str, value: int | None) -> str:
    found = [v for v in paper_values(key, method=method) if v.at.get(name) == value
             and value is not None]
    return ", ".join(("Pass@1 " if v.metric == "pass_at_1" else "") + v.shown()
                     for v in found) or "–"


def sweep_methods(recipe: Recipe) -> list[str]:
    """The methods the chain's sweeps run: eval.tradeoff.methods that eval.methods holds."""
    return [m for m in recipe.eval.tradeoff.methods if m in recipe.eval.methods]


def _sweep_points(name: str, evidence: RunEvidence,
                  methods: Sequence[str]) -> tuple[list[SweepPoint], list[str]]:
    """The points of ``<run_dir>/<TRADEOFF_FOLDERS[name]>`` and what keeps it from the
    recipe's eval.tradeoff values."""
    from prour.eval.harness import RESULTS_FILE

    tradeoff, folder = evidence.recipe.eval.tradeoff, evidence.sweep_dir(name)
    step = f"the chain's {TRADEOFF_FOLDERS[name]} step (eval.tradeoff.{name})"
    if not tradeoff.run:
        return [], [f"eval.tradeoff.run is false: the chain skipped the sweeps ({folder})"]
    if not getattr(tradeoff, name):
        return [], [f"eval.tradeoff.{name} lists no values: {step} runs only when it does"]
    if not (folder / RESULTS_FILE).is_file():
        return [], [f"{folder} holds no {RESULTS_FILE}: {step} writes it"]
    points = []
    for system in load_systems([folder]):
        sweep = system.sweep or {}
        if system.method in methods and TRADEOFF_SWEEPS[name] in sweep:
            points.append(sweep_point(system, sweep[TRADEOFF_SWEEPS[name]], folder.name))
    missing = [f"{folder}: no `{m}` episodes at router.{name}={_shown(v)} yet ({step})"
               for m in methods for v in getattr(tradeoff, name)
               if not any(p.method == m and p.value == v for p in points)]
    return points, missing


# ---- Figure 6: uncertainty over steps ------------------------------------------------------


def _ends(values: Sequence[float | None]) -> str:
    """``0.750 (step 1) → 0.300 (step 5)``: the first and last measured step (1-based)."""
    shown = [(i + 1, v) for i, v in enumerate(values) if v is not None]
    if not shown:
        return "–"
    (a, x), (b, y) = shown[0], shown[-1]
    return f"{x:.3f} (step {a}) → {y:.3f} (step {b})"


def _paper_ends(metric: str) -> str:
    found = sorted(paper_values("figure6", metric=metric), key=lambda v: v.at["step"])
    return " → ".join(f"{v.text} (step {v.at['step']})" for v in found) or "–"


def figure6_item(systems: Sequence[System], eval_dir: Path,
                 ) -> tuple[Item, dict[str, dict[str, list[float | None]]]]:
    """Mean AU, EU and total per step of the main evaluation's systems: recorded by the
    decomposer-routed methods, post-hoc for the others (:func:`_posthoc_curves`)."""
    from prour.eval.plots import mean_curves

    item = Item("figure6", header=["System", "AU/EU from", "Total", "AU", "EU", "Paper"])
    curves = {s.label: mean_curves([line["decisions"] for line in s.lines]) for s in systems}
    curves = {k: v for k, v in curves.items() if any(x is not None for x in v["total"])}
    recorded = set(curves)
    curves.update(posthoc_curves(systems, recorded))
    from prour.eval.posthoc import needs_posthoc

    if not any(not needs_posthoc(s.method) for s in systems):
        item.missing.append("no system of this run routes with the decomposer, which records "
                            "AU/EU: prour, clarify-only or verify-only (eval.methods)")
    paper = f"total {_paper_ends('total')}; EU {_paper_ends('eu')}"
    for system in systems:
        label = system.label if system.label in recorded else f"{system.label} (post-hoc)"
        if label not in curves and not needs_posthoc(system.method):
            item.missing.append(f"{system.label}: its decomposer decisions hold no AU/EU (each "
                                "was empty: no valid candidate action, routed to "
                                "router.empty_route)")
            continue
        if label not in curves:
            item.missing.append(f"{system.label}: no AU/EU (it routes without the decomposer): "
                                f"`prour posthoc {eval_dir} --recipe R` (the chain's posthoc "
                                "step) measures them into posthoc_uncertainty.jsonl")
            continue
        if all(x is None for x in curves[label]["total"]):
            item.missing.append(f"{label}: the post-hoc decomposer found no valid candidate "
                                "action at any measured decision: no AU/EU to draw")
        by_key = curves[label]
        shown = paper if system.method == "prour" and label in recorded else "–"
        item.rows.append([label, "recorded" if label in recorded else "post-hoc",
                          *(_ends(by_key[k]) for k in ("total", "au", "eu")), shown])
        item.text.append(f"{label}: total {item.rows[-1][2]}; EU {item.rows[-1][4]}"
                         + (f" | paper Prour: {paper}" if shown != "–" else ""))
    return item, curves
