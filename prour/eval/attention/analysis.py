"""Analysis of attention-protocol runs: method tables, equal-cost comparisons, plots, human study.

Input is one :class:`ConversationRecord` per conversation (method, model, domain, task, seed,
reward, and the delivered requests as cost mappings). Method names carry the budget as
``policy@N`` (``budgeted@2``, ``budgeted+mgr@1``); see :func:`method_name`.

Equal-cost comparison. A policy with mean cost A_p and reward R_p is compared with a mixture of
Budgeted N and N+1 that costs the same in expectation: run Budgeted N with probability w and
N+1 with probability 1 − w, where w·A_N + (1 − w)·A_{N+1} = A_p, i.e.

    w = (A_{N+1} − A_p) / (A_{N+1} − A_N),   R_mix = w·R_N + (1 − w)·R_{N+1}.

When A_p lies outside [A_N, A_{N+1}] no such mixture exists; the comparison is reported as
outside the range (``inside=False``) and left out rather than extrapolated. w is fixed from the
full-sample means; the interval of R_p − R_mix then comes from a paired task bootstrap of the
per-task differences R_p,t − (w·R_N,t + (1 − w)·R_{N+1},t).
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from prour.eval.attention.budget import DeliveredRequest
from prour.eval.attention.cost import (
    ACCOUNTINGS,
    CostWeights,
    asking_efficiency,
    conversation_cost,
    discretionary_count,
)
from prour.eval.stats import (
    BootstrapResult,
    bootstrap_statistic,
    paired_bootstrap,
    stratified_mean,
    task_means,
)
from prour.files import write_atomic
from prour.llm.history import render_history
from prour.rewards.judge import Judgment

log = logging.getLogger(__name__)

NO_ASK = "no-ask"
UNRESTRICTED = "unrestricted"
_NEEDS_JUDGE = {"messages": (), "atomic": (), "effort": ("reading_effort",),
                "full": ("reading_effort", "value"), "full+exempt": ("reading_effort", "value")}


def method_name(policy: str, budget: int | None = None) -> str:
    """``policy@N`` for a budget, the bare policy name otherwise."""
    return policy if budget is None else f"{policy}@{budget}"


def cost_requests(delivered: Sequence[DeliveredRequest],
                  judgments: Sequence[Judgment | None]) -> list[dict[str, Any]]:
    """Cost mappings of delivered messages; a failed or missing judgment leaves scores None."""
    if len(delivered) != len(judgments):
        raise ValueError(f"{len(delivered)} delivered messages but {len(judgments)} judgments")
    rows = []
    for request, judgment in zip(delivered, judgments):
        scored = judgment is not None and not judgment.failed
        rows.append({
            "discretionary": request.discretionary,
            "atomic_questions": request.atomic_questions,
            "reading_effort": judgment.reading_effort if scored else None,
            "value": judgment.value if scored else None,
            "fallback": request.fallback,
            "judge_error": judgment.error if judgment is not None else None,
        })
    return rows


@dataclass
class ConversationRecord:
    """One evaluated conversation of one method on one task and seed."""

    method: str
    model: str
    domain: str
    task_id: str
    seed: int
    reward: float
    requests: list[dict[str, Any]]
    fallback: bool = False
    transcript: list[dict[str, Any]] | None = None
    cut: bool = False  # the conversation reached env.max_steps (its reward is 0)

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> ConversationRecord:
        known = {k: row[k] for k in cls.__dataclass_fields__ if k in row}
        return cls(**known)


def scorable(record: ConversationRecord, accounting: str) -> bool:
    """Whether every request counted under ``accounting`` carries the judge scores it needs."""
    needed = _NEEDS_JUDGE[accounting]
    counted = [r for r in record.requests
               if r.get("discretionary") or accounting == "full+exempt"]
    return all(r.get(name) is not None for r in counted for name in needed)


@dataclass
class MethodRow:
    """Means over the conversations of one (model, domain, method) cell.

    R covers every conversation; A and U only those whose counted requests were all judged
    (``unscored`` counts the others). V pools the judged values of all discretionary requests
    that were judged; requests, atomic questions, bundling and fallbacks cover every one.
    """

    model: str
    domain: str
    method: str
    conversations: int
    reward: float
    cost: float
    value: float
    utility: float
    requests: float
    atomic_questions: float
    bundled_share: float
    fallback_rate: float
    unscored: int = 0
    efficiency: float = math.nan  # (R − R_no-ask) / A within the same model and domain
    cut: int = 0  # conversations cut at env.max_steps


def _cell_row(key: tuple[str, str, str], records: list[ConversationRecord], accounting: str,
              lam: float, weights: CostWeights) -> MethodRow:
    kept = [r for r in records if scorable(r, accounting)]
    costs = [conversation_cost(r.requests, accounting, weights) for r in kept]
    disc = [q for r in records for q in r.requests if q.get("discretionary")]
    values = [float(q["value"]) for q in disc if q.get("value") is not None]
    reward = float(np.mean([r.reward for r in records]))
    return MethodRow(
        *key, conversations=len(records), reward=reward,
        cost=float(np.mean(costs)) if costs else math.nan,
        value=float(np.mean(values)) if values else math.nan,
        utility=float(np.mean([r.reward - lam * c for r, c in zip(kept, costs)]))
        if kept else math.nan,
        requests=float(np.mean([discretionary_count(r.requests) for r in records])),
        atomic_questions=float(np.mean([sum(q.get("atomic_questions") or 0 for q in r.requests
                                            if q.get("discretionary")) for r in records])),
        bundled_share=float(np.mean([(q.get("atomic_questions") or 0) > 1 for q in disc]))
        if disc else math.nan,
        fallback_rate=float(np.mean([r.fallback for r in records])),
        unscored=len(records) - len(kept), cut=sum(r.cut for r in records))


def method_rows(records: Iterable[ConversationRecord], accounting: str, lam: float,
                weights: CostWeights | None = None) -> list[MethodRow]:
    """One row per (model, domain, method), with asking efficiency against that cell's No-ask."""
    if accounting not in ACCOUNTINGS:
        raise ValueError(f"unknown accounting {accounting!r}; valid: {', '.join(ACCOUNTINGS)}")
    cells: dict[tuple[str, str, str], list[ConversationRecord]] = {}
    for record in records:
        cells.setdefault((record.model, record.domain, record.method), []).append(record)
    rows = [_cell_row(k, v, accounting, lam, weights or CostWeights())
            for k, v in sorted(cells.items())]
    _set_efficiency(rows)
    return rows


def _set_efficiency(rows: list[MethodRow]) -> None:
    """Set each row's asking efficiency against the No-ask row of its model and domain."""
    no_ask = {(r.model, r.domain): r.reward for r in rows if r.method == NO_ASK}
    for row in rows:
        base = no_ask.get((row.model, row.domain))
        if base is not None and not math.isnan(row.cost):
            row.efficiency = asking_efficiency(row.reward, base, row.cost)


def average_over_domains(rows: Sequence[MethodRow]) -> list[MethodRow]:
    """Unweighted means over domains for each (model, method); domain is set to ``"average"``.

    Efficiency is not averaged: it is recomputed from the averaged R, R_no-ask and A, the
    estimate that :func:`efficiency_interval` with domains as strata gives.
    """
    groups: dict[tuple[str, str], list[MethodRow]] = {}
    for row in rows:
        groups.setdefault((row.model, row.method), []).append(row)
    fields = ("reward", "cost", "value", "utility", "requests", "atomic_questions",
              "bundled_share", "fallback_rate")
    out = []
    for (model, method), members in sorted(groups.items()):
        means = {f: float(np.nanmean([getattr(m, f) for m in members]))
                 if any(not math.isnan(getattr(m, f)) for m in members) else math.nan
                 for f in fields}
        out.append(MethodRow(model, "average", method, sum(m.conversations for m in members),
                             unscored=sum(m.unscored for m in members),
                             cut=sum(m.cut for m in members), **means))
    _set_efficiency(out)
    return out


# --- equal-cost comparison --------------------------------------------------------------------


@dataclass(frozen=True)
class Mixture:
    """Budgeted N / N+1 mixture matching a policy's cost; ``inside=False`` when impossible."""

    weight: float
    reward: float
    inside: bool
    note: str = ""


def equal_cost_mixture(cost_policy: float, cost_n: float, cost_n1: float,
                       reward_n: float, reward_n1: float) -> Mixture:
    """w with w·A_N + (1 − w)·A_{N+1} = A_policy, and the mixture's reward (module docstring)."""
    low, high = min(cost_n, cost_n1), max(cost_n, cost_n1)
    if not low <= cost_policy <= high:
        return Mixture(math.nan, math.nan, False,
                       f"policy cost {cost_policy:.4g} outside [{low:.4g}, {high:.4g}]")
    if cost_n == cost_n1:
        return Mixture(1.0, reward_n, True, "Budgeted N and N+1 cost the same")
    weight = (cost_n1 - cost_policy) / (cost_n1 - cost_n)
    return Mixture(weight, weight * reward_n + (1 - weight) * reward_n1, True)


@dataclass(frozen=True)
class EqualCostResult:
    """A policy against its cost-matched Budgeted mixture; ``delta`` is None when outside."""

    mixture: Mixture
    delta: BootstrapResult | None


def equal_cost_comparison(
    costs: tuple[Any, Any, Any], outcomes: tuple[Any, Any, Any], n_boot: int = 10_000,
    seed: int = 0, ci: float = 0.95, strata: Sequence[object] | None = None,
) -> EqualCostResult:
    """Outcome difference policy − mixture at equal expected cost, with a paired task bootstrap.

    ``costs`` and ``outcomes`` are (policy, Budgeted N, Budgeted N+1) arrays of shape (n_tasks,)
    or (n_tasks, n_seeds), rows aligned by task; outcomes are usually rewards.
    """
    means = [stratified_mean(task_means(c, "cost"), strata) for c in costs]
    per_task = [task_means(o, "outcome") for o in outcomes]
    rewards = [stratified_mean(o, strata) for o in per_task]
    mixture = equal_cost_mixture(means[0], means[1], means[2], rewards[1], rewards[2])
    if not mixture.inside:
        log.info("equal-cost comparison skipped: %s", mixture.note)
        return EqualCostResult(mixture, None)
    matched = mixture.weight * per_task[1] + (1 - mixture.weight) * per_task[2]
    return EqualCostResult(mixture, paired_bootstrap(per_task[0], matched, n_boot, seed, ci,
                                                     strata))


def efficiency_interval(
    reward: Any, reward_no_ask: Any, cost: Any, n_boot: int = 10_000, seed: int = 0,
    ci: float = 0.95, strata: Sequence[object] | None = None,
) -> BootstrapResult:
    """Asking efficiency (mean R − mean R_no-ask) / mean A over tasks, with a paired task
    bootstrap; the p-value tests efficiency 0 (no reward gained over No-ask).

    Inputs are (n_tasks,) or (n_tasks, n_seeds) arrays aligned by task. With ``strata`` (one
    label per task, e.g. the domain) each mean is the unweighted mean of the stratum means and
    tasks are resampled within their stratum. Draws whose mean cost is 0 are dropped (the
    ratio is undefined there).
    """
    r, r0, a = (task_means(x, name) for x, name in
                ((reward, "reward"), (reward_no_ask, "reward_no_ask"), (cost, "cost")))
    if not r.shape == r0.shape == a.shape:
        raise ValueError(f"efficiency needs the same tasks: {r.shape}, {r0.shape}, {a.shape}")
    if strata is not None and len(strata) != len(r):
        raise ValueError(f"strata has {len(strata)} labels for {len(r)} tasks")
    labels = [str(s) for s in strata] if strata is not None else [""] * len(r)
    codes = np.unique(labels, return_inverse=True)[1]

    def mean(values: np.ndarray, idx: np.ndarray) -> float:
        sums, sizes = np.bincount(codes[idx], values[idx]), np.bincount(codes[idx])
        return float(np.mean(sums[sizes > 0] / sizes[sizes > 0]))

    def ratio(idx: np.ndarray) -> float:
        return asking_efficiency(mean(r, idx), mean(r0, idx), mean(a, idx))

    return bootstrap_statistic(ratio, len(r), n_boot, seed, ci, strata)


# --- reward-versus-attention plot -------------------------------------------------------------


@dataclass(frozen=True)
class PlotPoint:
    label: str
    cost: float
    reward: float


def attention_paths(rows: Sequence[MethodRow], budgets: Sequence[int] = (1, 2, 3),
                    ) -> dict[str, list[PlotPoint]]:
    """Per model: No-ask → Budgeted N (in ``budgets`` order) → Unrestricted, where present."""
    order = [NO_ASK] + [method_name("budgeted", n) for n in budgets] + [UNRESTRICTED]
    paths: dict[str, list[PlotPoint]] = {}
    for model in sorted({r.model for r in rows}):
        by_method = {r.method: r for r in rows if r.model == model}
        points = []
        for method in order:
            row = by_method.get(method)
            if row is not None:
                cost = 0.0 if method == NO_ASK and math.isnan(row.cost) else row.cost
                points.append(PlotPoint(method, cost, row.reward))
        paths[model] = points
    return paths


def plot_reward_attention(paths: Mapping[str, Sequence[PlotPoint]], out: str | Path,
                          extras: Mapping[str, Sequence[PlotPoint]] | None = None,
                          title: str = "Reward versus user-attention cost") -> Path:
    """Write a PNG (and its sidecar JSON, see :mod:`prour.plots`): one line per model
    through its path (No-ask a square, Unrestricted a diamond); ``extras`` as unconnected
    markers, one marker shape per policy, named in the legend rather than by text at the point."""
    from prour.plots import MARKERS, padded_limits, pyplot, save_plot

    fig, ax = pyplot().subplots(figsize=(6, 4.5))
    series: dict[str, Any] = {}
    extra_methods = sorted({p.label for pts in (extras or {}).values() for p in pts})
    shapes = {m: MARKERS[3 + i % (len(MARKERS) - 3)] for i, m in enumerate(extra_methods)}
    for model, points in paths.items():
        line, = ax.plot([p.cost for p in points], [p.reward for p in points], "-o", label=model)
        series[model] = {"x": [p.cost for p in points], "y": [p.reward for p in points],
                         "labels": [p.label for p in points]}
        for p in points:
            marker = "s" if p.label == NO_ASK else "D" if p.label == UNRESTRICTED else None
            if marker:
                ax.plot(p.cost, p.reward, marker, color=line.get_color(), markersize=8)
        for p in (extras or {}).get(model, []):
            ax.plot(p.cost, p.reward, shapes[p.label], color=line.get_color(), markersize=8,
                    label=f"{p.label} ({model})")
            series[f"{p.label} ({model})"] = {"x": [p.cost], "y": [p.reward]}
    xs = [x for s in series.values() for x in s["x"]]
    ys = [y for s in series.values() for y in s["y"]]
    ax.set_xlim(*padded_limits(xs, min_span=0.5, bounds=(0.0, math.inf)))
    ax.set_ylim(*padded_limits(ys, min_span=0.1))
    ax.set_xlabel("user-attention cost A per conversation")
    ax.set_ylabel("reward R")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return save_plot(fig, out, series)


# --- human burden study -----------------------------------------------------------------------


def _write_jsonl(path: Path, rows: Iterable[Mapping[str, Any]]) -> None:
    write_atomic(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


ENUMERATE_LIMIT = 200_000  # more possible pairs than this are sampled, not listed

_Pairable = tuple[int, int, float]  # (record index, discretionary count, cost)


def _pairable(records: Sequence[ConversationRecord], accounting: str,
              weights: CostWeights | None) -> dict[tuple[str, str], list[_Pairable]]:
    """Per task, the conversations a pair may hold: at least one discretionary question, every
    counted request scored; in record order."""
    tasks: dict[tuple[str, str], list[_Pairable]] = {}
    for i, record in enumerate(records):
        count = discretionary_count(record.requests)
        if count and scorable(record, accounting):
            cost = conversation_cost(record.requests, accounting, weights)
            tasks.setdefault((record.domain, record.task_id), []).append((i, count, cost))
    return tasks


def _is_pair(a: _Pairable, b: _Pairable, equal: bool) -> bool:
    return (a[1] == b[1]) == equal and not math.isclose(a[2], b[2], abs_tol=1e-9)


def count_pairs(records: Sequence[ConversationRecord], accounting: str,
                weights: CostWeights | None = None, *, equal: bool = True,
                ) -> list[tuple[int, int]]:
    """Index pairs (i < j, sorted) of conversations on the same task, both asking at least one
    discretionary question and both scorable, whose costs differ: with ``equal``, the two ask
    the same number of discretionary questions; otherwise different numbers."""
    return _listed(_pairable(records, accounting, weights), equal)


def _listed(tasks: Mapping[tuple[str, str], list[_Pairable]], equal: bool,
            ) -> list[tuple[int, int]]:
    pairs = [(a[0], b[0]) for members in tasks.values() for x, a in enumerate(members)
             for b in members[x + 1:] if _is_pair(a, b, equal)]
    return sorted(pairs)


def _possible(members: Sequence[_Pairable], equal: bool) -> int:
    """Pairs of one task with equal (or different) counts, costs not compared."""
    same = sum(c * (c - 1) // 2 for c in Counter(m[1] for m in members).values())
    return same if equal else len(members) * (len(members) - 1) // 2 - same


def _draw(members: Sequence[_Pairable], equal: bool,
          rng: np.random.Generator) -> tuple[_Pairable, _Pairable]:
    """A uniform random pair of one task's conversations with equal (or different) counts."""
    groups: dict[int, list[_Pairable]] = {}
    for m in members:
        groups.setdefault(m[1], []).append(m)
    if equal:
        counts = sorted(groups)
        sizes = np.array([len(groups[c]) * (len(groups[c]) - 1) / 2 for c in counts])
        group = groups[counts[rng.choice(len(counts), p=sizes / sizes.sum())]]
        i, j = rng.choice(len(group), size=2, replace=False)
        return group[i], group[j]
    others = np.array([len(members) - len(groups[m[1]]) for m in members], dtype=float)
    first = members[rng.choice(len(members), p=others / others.sum())]
    rest = [m for m in members if m[1] != first[1]]
    return first, rest[rng.integers(len(rest))]


def sample_count_pairs(records: Sequence[ConversationRecord], n_pairs: int,
                       rng: np.random.Generator, accounting: str,
                       weights: CostWeights | None = None, *, equal: bool = True,
                       ) -> tuple[list[tuple[int, int]], int]:
    """Up to ``n_pairs`` of the :func:`count_pairs` pairs, in a seeded random order and each
    side drawn as A or B with probability 1/2, and the number of possible pairs (same task,
    equal or different counts). Up to :data:`ENUMERATE_LIMIT` possible pairs are listed and
    drawn without replacement (:func:`choose_pairs`); beyond, each draw picks a task in
    proportion to its possible pairs and a uniform pair within it, skipping equal costs and
    repeats, so a large study is never listed pair by pair."""
    tasks = _pairable(records, accounting, weights)
    sizes = {key: _possible(members, equal) for key, members in tasks.items()}
    possible = sum(sizes.values())
    if possible <= ENUMERATE_LIMIT:
        return choose_pairs(_listed(tasks, equal), n_pairs, rng), possible
    keys = sorted(k for k, size in sizes.items() if size)
    share = np.array([sizes[k] for k in keys], dtype=float) / possible
    chosen: list[tuple[int, int]] = []
    seen: set[tuple[int, int]] = set()
    for _ in range(100 * n_pairs):
        if len(chosen) >= n_pairs:
            break
        a, b = _draw(tasks[keys[rng.choice(len(keys), p=share)]], equal, rng)
        pair = (min(a[0], b[0]), max(a[0], b[0]))
        if pair in seen or not _is_pair(a, b, equal):
            continue
        seen.add(pair)
        chosen.append(pair[::-1] if rng.random() < 0.5 else pair)
    return chosen, possible


def equal_count_pairs(records: Sequence[ConversationRecord], accounting: str,
                      weights: CostWeights | None = None) -> list[tuple[int, int]]:
    """Index pairs of conversations on the same task with the same number of discretionary
    requests (at least one), both scorable, whose costs differ."""
    return count_pairs(records, accounting, weights, equal=True)


def choose_pairs(candidates: Sequence[tuple[int, int]], n_pairs: int,
                 rng: np.random.Generator) -> list[tuple[int, int]]:
    """Up to ``n_pairs`` candidate pairs in a seeded random order, each side drawn as A or B
    with probability 1/2 (the order annotators see)."""
    chosen = []
    for index in rng.permutation(len(candidates))[:n_pairs]:
        i, j = candidates[index]
        chosen.append((j, i) if rng.random() < 0.5 else (i, j))
    return chosen


def pair_rows(records: Sequence[ConversationRecord], chosen: Sequence[tuple[int, int]],
              accounting: str, weights: CostWeights | None = None, prefix: str = "pair",
              ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """What annotators see of each chosen pair (two transcripts) and its key (costs and which
    side the cost ranks higher), with ids ``{prefix}-0000``, ``{prefix}-0001``, ..."""
    shown, keys = [], []
    for pair_no, (i, j) in enumerate(chosen):
        a, b = records[i], records[j]
        for record in (a, b):
            if record.transcript is None:
                raise ValueError(f"record of task {record.task_id!r} method {record.method!r} "
                                 f"seed {record.seed} has no transcript to show annotators")
        cost_a = conversation_cost(a.requests, accounting, weights)
        cost_b = conversation_cost(b.requests, accounting, weights)
        pair_id = f"{prefix}-{pair_no:04d}"
        shown.append({"pair_id": pair_id, "domain": a.domain, "task_id": a.task_id,
                      "conversation_a": render_history(a.transcript),
                      "conversation_b": render_history(b.transcript)})
        keys.append({"pair_id": pair_id, "cost_a": cost_a, "cost_b": cost_b,
                     "higher": "a" if cost_a > cost_b else "b", "accounting": accounting,
                     "a": [a.method, a.model, a.seed], "b": [b.method, b.model, b.seed]})
    return shown, keys


def export_annotation_pairs(records: Sequence[ConversationRecord], out_dir: str | Path,
                            n_pairs: int = 60, seed: int = 0, *, accounting: str,
                            weights: CostWeights | None = None) -> tuple[Path, Path]:
    """Write ``pairs.jsonl`` (what annotators see: two transcripts, order shuffled) and
    ``pairs_key.jsonl`` (costs and which one the cost ranks higher; kept from annotators)."""
    candidates = equal_count_pairs(records, accounting, weights)
    chosen = choose_pairs(candidates, n_pairs, np.random.default_rng(seed))
    shown, keys = pair_rows(records, chosen, accounting, weights)
    out = Path(out_dir)
    _write_jsonl(out / "pairs.jsonl", shown)
    _write_jsonl(out / "pairs_key.jsonl", keys)
    log.info("exported %d of %d equal-count pairs to %s", len(shown), len(candidates), out)
    return out / "pairs.jsonl", out / "pairs_key.jsonl"


@dataclass
class Agreement:
    """Share of non-tie answers picking the conversation the cost ranks as more burdensome."""

    interval: BootstrapResult
    answers: int
    ties: int
    pairs: int = 0
    per_pair: dict[str, tuple[int, int]] = field(default_factory=dict)


def annotation_agreement(keys: Sequence[Mapping[str, Any]],
                         annotations: Sequence[Mapping[str, Any]], n_boot: int = 10_000,
                         seed: int = 0, ci: float = 0.95) -> Agreement:
    """Agreement of annotations (``pair_id``, ``choice`` in a / b / same) with the cost ranking,
    with a pair-bootstrap interval (all answers of a sampled pair stay together); the p-value
    tests agreement = 0.5 (chance)."""
    higher = {k["pair_id"]: k["higher"] for k in keys}
    agree: dict[str, list[int]] = {}
    ties = 0
    for i, row in enumerate(annotations):
        pair, choice = row.get("pair_id"), row.get("choice")
        if pair not in higher:
            raise ValueError(f"annotation {i}: unknown pair_id {pair!r}")
        if choice not in ("a", "b", "same"):
            raise ValueError(f"annotation {i}: choice {choice!r} must be 'a', 'b' or 'same'")
        if choice == "same":
            ties += 1
            continue
        agree.setdefault(pair, []).append(int(choice == higher[pair]))
    if not agree:
        raise ValueError("no non-tie annotations to compare with the cost ranking")
    pairs = sorted(agree)
    hits = np.array([sum(agree[p]) for p in pairs], dtype=float)
    totals = np.array([len(agree[p]) for p in pairs], dtype=float)
    interval = bootstrap_statistic(lambda idx: hits[idx].sum() / totals[idx].sum(),
                                   len(pairs), n_boot, seed, ci, null=0.5)
    return Agreement(interval, int(totals.sum()), ties, len(pairs),
                     {p: (int(h), int(t)) for p, h, t in zip(pairs, hits, totals)})
