"""What every item of the Ask-Less study report is made of (:class:`StudyItem`: tables, notes,
what is missing, the paper values used, summary lines, JSON data), the shared context its
computations read (:class:`Study`: one panel per grid) and the formatting of numbers."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from prour.config.attention import CostWeights, variant_of
from prour.eval.attention.study_panel import (
    CellKey,
    Match,
    Panel,
    Statistic,
    axis_value,
    backbone_of,
    build_panel,
    by_backbone_mean,
    estimate,
    interval,
    match_cost,
    matched_mean,
    variant_label,
    variant_matches,
)
from prour.eval.attention.study_paper import DASH, paper_model, paper_note
from prour.eval.stats import BootstrapResult


@dataclass
class StudyData:
    """What the report reads: result lines by grid and how to name and price them."""

    grids: dict[str, list[dict]]  # grid name -> its result lines (latest per key)
    backbones: dict[str, str | None]  # backbone axis value -> paper model name or None
    simulators: dict[str, str | None]  # simulator axis value -> paper regime (Original/Guarded)
    second_judge: list[dict]  # rows of second_judge.jsonl (empty: not run)
    accounting: str = "full"
    lam: float = 0.03
    # CostWeights() as the default; a factory because a pydantic model is not a frozen default
    weights: CostWeights = field(default_factory=CostWeights)
    header: list[str] = field(default_factory=list)  # lines the report opens with
    validation: Path | None = None  # the study's validation/ folder (annotator labels)



POLICY_NAMES = {"no-ask": "No-ask", "unrestricted": "Unrestricted", "frugal": "Frugal prompt",
                "voi-gate-as-run": "VoI gate (as run)", "voi-gate": "VoI gate, enforced veto",
                "budgeted": "Budgeted", "budgeted+review": "Budgeted + Review",
                "budgeted+review+summary": "Budgeted + Review + Summary",
                "budgeted+mgr": "Budgeted + MGR"}
BUDGETS = (1, 2, 3)
PAPER_C = 0.27  # the VoI threshold of the paper's as-run gate and of its Table 8


@dataclass
class Table:
    """One table of an item; ``file`` is the markdown file that holds it (None: the item's)."""

    header: list[str]
    rows: list[list[str]]
    caption: str = ""
    file: str | None = None
    paper: list[Any] = field(default_factory=list)  # the paper values this table shows


@dataclass
class StudyItem:
    """A table or figure of the paper, computed from the study, beside the paper's values."""

    key: str
    title: str
    file: str
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    paper: list[Any] = field(default_factory=list)
    text: list[str] = field(default_factory=list)  # summary lines (the terminal)
    data: dict[str, Any] = field(default_factory=dict)  # every number, for report.json
    paper_note: str | None = None

    @property
    def figure(self) -> bool:
        return self.file.endswith(".png")

    def files(self) -> list[str]:
        """Every file the item writes: its PNG and sidecar, or its markdown file(s)."""
        if self.figure:
            return [self.file, self.file[:-4] + ".json"]
        return list(dict.fromkeys([self.file, *(t.file or self.file for t in self.tables)]))


# ---- numbers -----------------------------------------------------------------------------------


def finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def num(value: float | None, digits: int = 1) -> str:
    """A number, or "–" where there is none (never 0 for a missing value)."""
    return f"{value:.{digits}f}" if finite(value) else DASH


def signed(value: float | None, digits: int = 1) -> str:
    return f"{value:+.{digits}f}" if finite(value) else DASH


def ci_cell(result: BootstrapResult | None, digits: int = 1, sign: bool = False,
            star: bool = False) -> str:
    """``estimate [low, high]``; ``*`` when ``star`` and the interval excludes zero."""
    if result is None:
        return DASH
    form = signed if sign else num
    text = form(result.estimate, digits)
    if star and finite(result.low) and result.excludes(0.0):
        text += "*"
    if finite(result.low):
        text += f" [{form(result.low, digits)}, {form(result.high, digits)}]"
    return text


def ci_data(result: BootstrapResult | None) -> dict[str, Any] | None:
    """A bootstrap result as JSON (None where there is none; NaN as None)."""
    if result is None:
        return None
    clean = lambda v: v if finite(v) else None
    return {"estimate": clean(result.estimate), "low": clean(result.low),
            "high": clean(result.high), "p_value": clean(result.p_value),
            "excludes_zero": bool(finite(result.low) and result.excludes(0.0)),
            "n_boot": result.n_boot, "tasks": result.n_units, "ci": result.ci}


def value_data(value: float | None) -> float | None:
    return float(value) if finite(value) else None


def scaled(statistic: Statistic, factor: float) -> Statistic:
    return lambda counts: factor * statistic(counts)


# ---- the study as the items read it ---------------------------------------------------------


@dataclass
class Study:
    """The report's input with one panel per grid, and how long the bootstrap runs."""

    data: StudyData
    n_boot: int
    ci: float
    panels: dict[str, Panel] = field(default_factory=dict)
    _rows: dict[str, list[Any]] = field(default_factory=dict)

    @classmethod
    def of(cls, data: StudyData, n_boot: int, ci: float) -> Study:
        study = cls(data, n_boot, ci)
        for grid, lines in data.grids.items():
            study.panels[grid] = study.panel_of(lines)
        return study

    def panel_of(self, lines: Iterable[Mapping[str, Any]]) -> Panel:
        return build_panel(lines, self.data.accounting, self.data.lam, self.data.weights)

    def method_rows(self, grid: str) -> list[Any]:
        """The analysis module's (backbone, domain, variant) rows of a grid (computed once)."""
        if grid not in self._rows:
            from prour.eval.attention.analysis import method_rows
            from prour.eval.attention.study_panel import record_of

            records = [record_of(line) for line in self.data.grids.get(grid) or []]
            self._rows[grid] = method_rows(records, self.data.accounting, self.data.lam,
                                           self.data.weights)
        return self._rows[grid]

    def grid(self, name: str) -> Panel | None:
        """The grid's panel; None when the study holds no result line of it."""
        panel = self.panels.get(name)
        return panel if panel is not None and panel.cells else None

    def model(self, backbone: str) -> str | None:
        """The paper's model a backbone is (None: none, or a name the paper does not have)."""
        return paper_model(self.data.backbones.get(backbone))

    def interval(self, panel: Panel, statistic: Statistic) -> BootstrapResult | None:
        return interval(panel, statistic, self.n_boot, self.ci)

    def merged(self, grid: str, borrow: Callable[[str], bool]) -> Panel | None:
        """The grid's own lines for the variants ``borrow`` rejects, and grid ``main``'s for the
        variants it accepts, on the grid's backbones and parent tasks; None: grid not run."""
        own = self.data.grids.get(grid) or []
        if not own:
            return None
        backbones = {backbone_of(line) for line in own}
        tasks = {(str(line["domain"]), str(line["task_id"])) for line in own}
        main = [line for line in self.data.grids.get("main") or []
                if borrow(variant_label(line)) and backbone_of(line) in backbones
                and (str(line["domain"]), str(line["task_id"])) in tasks]
        return self.panel_of([line for line in own if not borrow(variant_label(line))] + main)

    def simulator_lines(self, grid: str) -> dict[str, list[Mapping[str, Any]]]:
        """The grid's lines by the value of their ``simulator`` axis."""
        out: dict[str, list[Mapping[str, Any]]] = {}
        for line in self.data.grids.get(grid) or []:
            out.setdefault(axis_value(line, "simulator") or "(none)", []).append(line)
        return out


def find_label(panel: Panel, policy: str, budget: int | None = None,
               **options: float | None) -> str | None:
    """The panel's variant label of ``policy`` at ``budget`` with ``options``; among several
    (e.g. VoI thresholds) the one at the paper's c = 0.27, else the first in label order."""
    labels = sorted({v for _, v in panel.cells if variant_matches(v, policy, budget, **options)})
    if not labels:
        return None
    preferred = [v for v in labels if variant_of(v).option("c") == PAPER_C]
    return (preferred or labels)[0]


def cells_of(panel: Panel, labels: Sequence[str], backbones: Sequence[str] | None = None,
             ) -> list[CellKey]:
    """The panel's cells of these variants, for every backbone (or the given ones)."""
    chosen = panel.backbones if backbones is None else backbones
    return [(b, v) for b in chosen for v in labels if panel.has((b, v))]


def mean_of(panel: Panel, metric: str, cells: Sequence[CellKey]) -> Statistic:
    """Statistic: the metric averaged over each backbone's cells, then over backbones."""
    rows = [panel.index(c) for c in cells]
    return lambda counts: by_backbone_mean(panel.ratio(metric, counts), panel.cells, rows)


def point(panel: Panel, metric: str, cells: Sequence[CellKey]) -> float:
    if not cells:
        return math.nan
    return estimate(panel, mean_of(panel, metric, cells))


def ratio_of_means(panel: Panel, metric: str, top: Sequence[CellKey],
                   bottom: Sequence[CellKey]) -> Statistic:
    """Statistic: 100·(1 − mean(top) / mean(bottom)), the cost saved in percent."""
    upper, lower = mean_of(panel, metric, top), mean_of(panel, metric, bottom)

    def statistic(counts: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return 100.0 * (1.0 - upper(counts) / lower(counts))

    return statistic


def missing_cells(panel: Panel, labels: Sequence[str], what: str) -> list[str]:
    """One line per backbone of the panel lacking some of the variants."""
    lines = []
    for backbone in panel.backbones:
        absent = [v for v in labels if not panel.has((backbone, v))]
        if absent:
            lines.append(f"{what}: backbone {backbone} has no {', '.join(absent)} episodes")
    return lines


# ---- shared pieces of the items ----------------------------------------------------------------

TITLES = {
    "table3": "Table 3: reward, user-attention cost and judged question value by policy",
    "table5": "Table 5: memory ablation of self-review (observed and at equal cost)",
    "table7": "Table 7: enforced VoI gate",
    "table8": "Table 8: VoI gate under the same budget",
    "table13": "Table 13: cost saved under each accounting",
    "table14": "Table 14: delivered requests per session and bundling",
    "table17": "Table 17: Budgeted + Review with a wider evidence window",
    "table25": "Table 25: interruption allocation under two simulator regimes",
    "backbones": "Tables 29-36: per-backbone means by domain",
    "table12": "Table 12: cross-family judge sensitivity",
    "figure3": "Figure 3: reward against user-attention cost, one path per backbone",
    "figure4": "Figure 4: Budgeted + MGR against Budgeted per backbone",
    "figure5": "Figure 5: reward against user-attention cost by domain",
    "figure6": "Figure 6: asking efficiency, Budgeted N=3 beside Unrestricted",
    "figure7": "Figure 7: utility against the attention price λ",
    "figure8": "Figure 8: Unrestricted asking frequency and reward gain over No-ask",
}
SCALES = ("R is printed ×100 (a percentage of the [0, 1] task reward); A is the mean "
          "user-attention cost per session on prour's own scale ({accounting} accounting); "
          "Ṽ = 10 × V, V the mean judged value (0-10) of the delivered discretionary requests.")
A_TILDE = ("The paper's Ã (and Tables 7 and 8's cost) is a 0-100 display scale defined in its "
           "Appendix E, which our copy lacks: the run's A is printed on prour's own scale beside "
           "it, and the two are not comparable number for number.")
EQUAL_COST = ("ΔR (and ΔṼ) at equal cost: the policy minus the mixture of Budgeted N and N + 1 "
              "(No-ask as N = 0, grid `main`) whose expected cost equals the policy's, per "
              "backbone and budget on the parent tasks all compared variants ran, the mixture "
              "weight fixed from the full-sample means; averaged over budgets within a backbone, "
              "then over backbones; 95% paired parent-task bootstrap (tasks resampled within "
              "domains); * where the interval excludes zero. A mixture's Ṽ is the mean judged "
              "value of the questions it asks.")
RUN, PAPER = "this run", "paper"


def new_item(key: str, file: str) -> StudyItem:
    return StudyItem(key, TITLES[key], file, paper_note=paper_note(key))


def no_grid(item: StudyItem, grid: str, what: str) -> None:
    item.missing.append(f"grid `{grid}` has no result lines in this study: {what} is not "
                        "computed (the paper's values are shown alone)")


def labels_of(panel: Panel | None, policy: str, budgets: Sequence[int] | None,
            missing: list[str], **options: float | None) -> list[str]:
    """The panel's labels of a policy (one per budget); what is absent goes to ``missing``."""
    if panel is None:
        return []
    if budgets is None:
        found = find_label(panel, policy, None, **options)
        if found is None:
            missing.append(f"no {POLICY_NAMES[policy]} episodes in the grid")
        return [found] if found else []
    found = {n: find_label(panel, policy, n, **options) for n in budgets}
    absent = [str(n) for n, label in found.items() if label is None]
    if absent:
        missing.append(f"no {POLICY_NAMES[policy]} episodes at N={', '.join(absent)} in the grid"
                       + ("" if len(absent) == len(budgets) else ": its mean covers the others"))
    return [label for label in found.values() if label]


def ladder(panel: Panel, backbone: str) -> dict[int, CellKey]:
    """A backbone's Budgeted rungs in the panel: No-ask as 0, ``budgeted@N`` as N."""
    rungs = {0: (backbone, "no-ask")} if panel.has((backbone, "no-ask")) else {}
    for b, label in panel.cells:
        variant = variant_of(label)
        if b == backbone and variant.policy == "budgeted" and not variant.options:
            rungs[variant.budget] = (b, label)
    return rungs


def equal_cost(study: Study, panel: Panel, targets: Sequence[CellKey],
               ) -> tuple[Panel, list[Match], list[str]]:
    """The panel restricted to the targets and their backbones' ladders (shared parent tasks),
    the cost-matched mixtures found there and a note for each target outside every range."""
    ladders = {b: ladder(panel, b) for b in dict.fromkeys(t[0] for t in targets)}
    restricted = panel.restrict([*targets, *(c for lad in ladders.values() for c in lad.values())])
    if not restricted.units:
        return restricted, [], ["no parent task was run under every compared variant"]
    matches, notes = [], []
    for target in targets:
        found = match_cost(restricted, target, ladders[target[0]])
        if isinstance(found, str):
            notes.append(f"{target[0]} {target[1]}: no cost-matched mixture ({found})")
        else:
            matches.append(found)
    if notes and matches:
        notes.append(f"{len(matches)} of {len(targets)} compared (backbone, variant) cells lie "
                     "inside a Budgeted cost range; the means at equal cost leave the others out "
                     "(no extrapolation).")
    return restricted, matches, notes


def matched_interval(study: Study, panel: Panel, matches: Sequence[Match], kind: str,
                     ) -> BootstrapResult | None:
    if not matches:
        return None
    factor = 100.0 if kind == "R" else 10.0
    return study.interval(panel, scaled(matched_mean(panel, matches, kind), factor))
