"""The numbers behind the Ask-Less study report: a panel of per-task sums and the paired
parent-task bootstrap over it (pure computations, no files).

A *cell* is one (backbone, attention variant) of a grid; a *unit* is a parent task (domain,
task id), which every backbone and variant of the grid shares. For each cell and unit the panel
holds sums over that task's conversations (all seeds): reward, conversations, cost and utility of
the conversations whose counted requests were all judged (per accounting), judged values,
delivered discretionary and exempt requests, atomic questions, bundled messages, reviews,
vetoes and sessions that sent the fixed fallback message.

A metric is a ratio of two sums, taken within each domain (so each conversation weighs the same
inside a domain, as in :func:`prour.eval.attention.analysis.method_rows`) and then averaged over
the domains with equal weights (as :func:`~prour.eval.attention.analysis.average_over_domains`):

    R = Σ reward / Σ conversations          A = Σ cost / Σ judged conversations
    U = Σ (reward − λ·cost) / Σ judged      V = Σ judged value / Σ judged requests
    bundled = Σ bundled / Σ discretionary   vetoed = Σ vetoes / Σ reviews
    requests, atomic, exempt, reviews, fixed = Σ count / Σ conversations

A bootstrap draw resamples the parent tasks within each domain (one draw for every cell at once,
so every comparison is paired) and recomputes any statistic of these metrics from the resampled
sums; :func:`interval` turns the draws into a :class:`~prour.eval.stats.BootstrapResult`.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from prour.config.attention import CostWeights, Variant, variant_of
from prour.eval.attention.analysis import ConversationRecord, equal_cost_mixture, scorable
from prour.eval.attention.cost import ACCOUNTINGS, conversation_cost
from prour.eval.stats import BootstrapResult, resampled_indices, summarize_draws

CellKey = tuple[str, str]  # (backbone, variant label)
Unit = tuple[str, str]  # (domain, task id)
NO_BACKBONE = "(no backbone axis)"

# metric -> (numerator sum, denominator sum); A and U take the accounting as a suffix
RATIOS: dict[str, tuple[str, str]] = {
    "R": ("reward", "n"), "V": ("value_sum", "value_n"), "judged": ("value_n", "n"),
    "requests": ("messages", "n"), "atomic": ("atomic", "n"), "exempt": ("exempt", "n"),
    "bundled": ("bundled", "messages"), "reviews": ("reviews", "n"),
    "vetoed": ("vetoes", "reviews"), "fixed": ("fixed", "n"),
}


def axis_value(line: Mapping[str, Any], axis: str) -> str | None:
    """The value of a study axis a result line ran under (None: the line has none)."""
    value = (line.get("axes") or {}).get(axis)
    return None if value is None else str(value)


def backbone_of(line: Mapping[str, Any]) -> str:
    return axis_value(line, "backbone") or NO_BACKBONE


@functools.cache
def canonical(label: str) -> str:
    """The canonical spelling of an attention variant label (``c=0.50`` → ``c=0.5``)."""
    return variant_of(label).label


def variant_label(line: Mapping[str, Any]) -> str:
    return canonical(str(line["variant"]))


def record_of(line: Mapping[str, Any]) -> ConversationRecord:
    """The line as the existing analysis code reads a conversation (model = backbone)."""
    block = line.get("attention") or {}
    return ConversationRecord(
        method=variant_label(line), model=backbone_of(line), domain=str(line["domain"]),
        task_id=str(line["task_id"]), seed=int(line["seed"]), reward=float(line["score"]),
        requests=list(block.get("requests") or []), fallback=(block.get("fallbacks") or 0) > 0,
        cut=line.get("termination") == "max_steps")


def conversation_sums(line: Mapping[str, Any], lam: float,
                      weights: CostWeights) -> dict[str, float]:
    """The panel's per-conversation quantities of one result line (module docstring)."""
    record = record_of(line)
    block = line.get("attention") or {}
    disc = [q for q in record.requests if q.get("discretionary")]
    values = [float(q["value"]) for q in disc if q.get("value") is not None]
    out = {"n": 1.0, "reward": record.reward, "value_sum": sum(values),
           "value_n": float(len(values)), "messages": float(len(disc)),
           "atomic": float(sum(q.get("atomic_questions") or 0 for q in disc)),
           "exempt": float(len(record.requests) - len(disc)),
           "bundled": float(sum((q.get("atomic_questions") or 0) > 1 for q in disc)),
           "reviews": float(block.get("reviews") or 0), "vetoes": float(block.get("vetoes") or 0),
           "fixed": float(record.fallback)}
    for accounting in ACCOUNTINGS:
        judged = scorable(record, accounting)
        cost = conversation_cost(record.requests, accounting, weights) if judged else 0.0
        out[f"scored:{accounting}"] = float(judged)
        out[f"cost:{accounting}"] = cost
        out[f"utility:{accounting}"] = record.reward - lam * cost if judged else 0.0
    return out


@dataclass
class Panel:
    """Per-(cell, unit) sums of one grid's conversations (module docstring)."""

    cells: list[CellKey]
    units: list[Unit]
    sums: dict[str, np.ndarray]  # quantity -> (n_cells, n_units)
    accounting: str = "full"

    @property
    def strata(self) -> list[str]:
        return [domain for domain, _ in self.units]

    @property
    def domains(self) -> list[str]:
        return list(dict.fromkeys(self.strata))

    @property
    def backbones(self) -> list[str]:
        return list(dict.fromkeys(b for b, _ in self.cells))

    def index(self, cell: CellKey) -> int:
        return self.cells.index(cell)

    def has(self, cell: CellKey) -> bool:
        return cell in self.cells

    def tasks_of(self, cell: CellKey) -> set[Unit]:
        row = self.sums["n"][self.index(cell)]
        return {u for u, n in zip(self.units, row) if n > 0}

    def restrict(self, cells: Iterable[CellKey]) -> Panel:
        """Only ``cells``, on the parent tasks every one of them ran (a paired comparison)."""
        keep_cells = list(dict.fromkeys(cells))
        rows = [self.index(c) for c in keep_cells]
        ran = self.sums["n"][rows] > 0
        cols = np.flatnonzero(ran.all(axis=0)) if rows else np.array([], dtype=int)
        return Panel(keep_cells, [self.units[i] for i in cols],
                     {k: v[np.ix_(rows, cols)] for k, v in self.sums.items()}, self.accounting)

    def ratio(self, metric: str, counts: np.ndarray) -> np.ndarray:
        """(B, n_units) task counts of B draws → (B, n_cells): the metric of every cell, a
        ratio within each domain averaged over domains (NaN where no domain has a denominator)."""
        num, den = quantities(metric, self.accounting)
        strata = np.asarray(self.strata)
        per_domain = []
        for domain in self.domains:
            cols = strata == domain
            top = counts[:, cols] @ self.sums[num][:, cols].T
            bottom = counts[:, cols] @ self.sums[den][:, cols].T
            with np.errstate(invalid="ignore", divide="ignore"):
                per_domain.append(np.where(bottom > 0, top / bottom, np.nan))
        if not per_domain:
            return np.full((counts.shape[0], len(self.cells)), np.nan)
        return nanmean(np.stack(per_domain, axis=-1), axis=-1)

    def pooled(self, metric: str, counts: np.ndarray, rows: Sequence[int]) -> np.ndarray:
        """(B,) the metric as one ratio of sums over ``rows`` cells and all units (aggregate)."""
        num, den = quantities(metric, self.accounting)
        top = counts @ self.sums[num][list(rows)].sum(axis=0)
        bottom = counts @ self.sums[den][list(rows)].sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(bottom > 0, top / bottom, np.nan)

    def point(self, metric: str) -> dict[CellKey, float]:
        """Full-sample metric of every cell."""
        values = self.ratio(metric, np.ones((1, len(self.units))))[0]
        return {cell: float(v) for cell, v in zip(self.cells, values)}


def quantities(metric: str, accounting: str) -> tuple[str, str]:
    """(numerator, denominator) sums of a metric; ``A``/``U`` may name an accounting
    (``A:messages``), else the panel's."""
    name, _, chosen = metric.partition(":")
    chosen = chosen or accounting
    if name == "A":
        return f"cost:{chosen}", f"scored:{chosen}"
    if name == "U":
        return f"utility:{chosen}", f"scored:{chosen}"
    if name not in RATIOS:
        raise ValueError(f"unknown panel metric {metric!r}")
    return RATIOS[name]


def nanmean(values: np.ndarray, axis: int) -> np.ndarray:
    """Mean ignoring NaN; NaN (without a warning) where every value is NaN."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(values, axis=axis)


def build_panel(lines: Iterable[Mapping[str, Any]], accounting: str, lam: float,
                weights: CostWeights) -> Panel:
    """The panel of a grid's result lines (cells and units in first-seen order)."""
    cells: dict[CellKey, int] = {}
    units: dict[Unit, int] = {}
    rows: list[tuple[int, int, dict[str, float]]] = []
    for line in lines:
        cell = (backbone_of(line), variant_label(line))
        unit = (str(line["domain"]), str(line["task_id"]))
        rows.append((cells.setdefault(cell, len(cells)), units.setdefault(unit, len(units)),
                     conversation_sums(line, lam, weights)))
    names = rows[0][2].keys() if rows else conversation_sums(
        {"variant": "no-ask", "domain": "", "task_id": "", "seed": 0, "score": 0.0},
        lam, weights).keys()
    sums = {k: np.zeros((len(cells), len(units))) for k in names}
    for c, u, values in rows:
        for k, v in values.items():
            sums[k][c, u] += v
    return Panel(list(cells), list(units), sums, accounting)


# ---- grouping and averaging --------------------------------------------------------------------


def variant_matches(label: str, policy: str, budget: int | None = None,
                    **options: float | None) -> bool:
    """Whether a variant label is ``policy`` at ``budget`` with the given options (an option
    given as None must be absent; options not named are not checked)."""
    variant: Variant = variant_of(label)
    if variant.policy != policy or variant.budget != budget:
        return False
    return all(variant.option(k) == v if v is not None else variant.option(k) is None
               for k, v in options.items())


def by_backbone_mean(values: np.ndarray, cells: Sequence[CellKey],
                     rows: Sequence[int]) -> np.ndarray:
    """(B, n_cells) → (B,): mean over each backbone's cells among ``rows`` (budgets, ...), then
    the mean over backbones, equal weights; NaN members are skipped."""
    groups: dict[str, list[int]] = {}
    for r in rows:
        groups.setdefault(cells[r][0], []).append(r)
    if not groups:
        return np.full(values.shape[0], np.nan)
    per_backbone = [nanmean(values[:, members], axis=1) for members in groups.values()]
    return nanmean(np.stack(per_backbone, axis=1), axis=1)


# ---- the bootstrap -------------------------------------------------------------------------------

Statistic = Callable[[np.ndarray], np.ndarray]  # (B, n_units) counts -> (B,)


def draw_counts(panel: Panel, n_boot: int, seed: int = 0) -> np.ndarray:
    """(n_boot, n_units): how often each parent task is drawn, tasks resampled within domains."""
    n = len(panel.units)
    rows = resampled_indices(n, n_boot, np.random.default_rng(seed), panel.strata)
    flat = (rows + n * np.arange(n_boot)[:, None]).ravel()
    return np.bincount(flat, minlength=n_boot * n).reshape(n_boot, n).astype(float)


def estimate(panel: Panel, statistic: Statistic) -> float:
    """The statistic on the full sample."""
    return float(statistic(np.ones((1, len(panel.units))))[0])


def interval(panel: Panel, statistic: Statistic, n_boot: int, ci: float, seed: int = 0,
             null: float = 0.0) -> BootstrapResult | None:
    """Estimate and percentile interval of a statistic of the panel; draws where it is not
    finite are dropped; None when the full-sample estimate is not finite."""
    if not panel.units:
        return None
    point = estimate(panel, statistic)
    if not math.isfinite(point):
        return None
    draws = statistic(draw_counts(panel, n_boot, seed))
    draws = draws[np.isfinite(draws)]
    if draws.size == 0:
        return BootstrapResult(point, math.nan, math.nan, math.nan, 0, len(panel.units), ci)
    return summarize_draws(point, draws, ci, len(panel.units), null)


# ---- equal expected cost -----------------------------------------------------------------------


@dataclass(frozen=True)
class Match:
    """A cell against the Budgeted mixture of ladder rungs ``n`` and ``n + 1`` (0: No-ask) that
    costs the same in expectation: weight w on rung n, 1 − w on n + 1 (full-sample means)."""

    target: CellKey
    low: CellKey
    high: CellKey
    n: int
    weight: float


def match_cost(panel: Panel, target: CellKey, ladder: Mapping[int, CellKey]) -> Match | str:
    """The first adjacent ladder pair whose costs bracket the target's (analysis module:
    :func:`~prour.eval.attention.analysis.equal_cost_mixture`); a string says why none does."""
    cost, reward = panel.point("A"), panel.point("R")
    notes = []
    for n in sorted(ladder):
        if n + 1 not in ladder:
            continue
        low, high = ladder[n], ladder[n + 1]
        if any(math.isnan(cost[c]) for c in (target, low, high)):
            notes.append(f"N={n}: a cost is unknown (no judged conversation)")
            continue
        mixture = equal_cost_mixture(cost[target], cost[low], cost[high], reward[low],
                                     reward[high])
        if mixture.inside:
            return Match(target, low, high, n, mixture.weight)
        notes.append(f"N={n}/{n + 1}: {mixture.note}")
    return "; ".join(notes) or "fewer than two adjacent Budgeted rungs"


def reward_delta(panel: Panel, matches: Sequence[Match], counts: np.ndarray) -> np.ndarray:
    """(B, n_matches) R_target − (w·R_N + (1 − w)·R_N+1) of each match."""
    r = panel.ratio("R", counts)
    cols = [r[:, panel.index(m.target)] - m.weight * r[:, panel.index(m.low)]
            - (1 - m.weight) * r[:, panel.index(m.high)] for m in matches]
    return np.stack(cols, axis=1) if cols else np.empty((counts.shape[0], 0))


def value_delta(panel: Panel, matches: Sequence[Match], counts: np.ndarray) -> np.ndarray:
    """(B, n_matches) V_target − V_mixture, the mixture's V being the mean judged value of the
    questions it asks: (w·q_N·V_N + (1 − w)·q_N+1·V_N+1) / (w·q_N + (1 − w)·q_N+1), with q the
    judged questions per session (a rung that asks none, e.g. No-ask, adds nothing)."""
    v, q = panel.ratio("V", counts), panel.ratio("judged", counts)
    cols = []
    for m in matches:
        lo, hi, t = panel.index(m.low), panel.index(m.high), panel.index(m.target)
        weight_lo, weight_hi = m.weight * q[:, lo], (1 - m.weight) * q[:, hi]
        top = np.nan_to_num(weight_lo * v[:, lo]) + np.nan_to_num(weight_hi * v[:, hi])
        with np.errstate(invalid="ignore", divide="ignore"):
            mixed = np.where(weight_lo + weight_hi > 0, top / (weight_lo + weight_hi), np.nan)
        cols.append(v[:, t] - mixed)
    return np.stack(cols, axis=1) if cols else np.empty((counts.shape[0], 0))


def matched_mean(panel: Panel, matches: Sequence[Match], kind: str) -> Statistic:
    """Statistic: the reward (``R``) or value (``V``) difference at equal cost, averaged over
    each backbone's matches, then over backbones."""
    delta = reward_delta if kind == "R" else value_delta
    cells = [m.target for m in matches]

    def statistic(counts: np.ndarray) -> np.ndarray:
        return by_backbone_mean(delta(panel, matches, counts), cells, range(len(matches)))

    return statistic
