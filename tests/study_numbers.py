"""The Ask-Less study report's numbers computed by hand from result lines (the shape of a study's
``results.jsonl``), for the tests that check the report against them: the synthetic report test
(tests/eval/attention/test_study_report.py) and the rehearsal run from one command
(tests/cli/test_ask_less_rehearsal.py).

Each mean follows the report's order of averaging: within a domain over its sessions, then the
domains with equal weights, then (``nested``) the variants within a backbone, then the
backbones. A cell that has nothing to average (no session in a domain; no session whose
requests were all judged, for A and U under ``full``; no judged value, for V) is NaN, and an
average skips NaN members (NaN when every member is): what the report shows as missing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np


def mean(values: Iterable[float]) -> float:
    """The plain mean; NaN for no value."""
    values = list(values)
    return float(np.mean(values)) if values else math.nan


def nan_mean(values: Iterable[float]) -> float:
    """The mean of the values that are not NaN; NaN when none is."""
    kept = [v for v in values if not math.isnan(v)]
    return float(np.mean(kept)) if kept else math.nan


def judged(line: dict, exempt: bool = False) -> bool:
    """Whether every counted request (discretionary; exempt too with ``exempt``) carries both
    judge scores."""
    counted = [q for q in line["attention"]["requests"] if q["discretionary"] or exempt]
    return all(q["reading_effort"] is not None and q["value"] is not None for q in counted)


def full_cost(line: dict, exempt: bool = False) -> float:
    """The ``full`` cost with unit weights: Σ 1 + r/20 + (1 − v/10) over the counted requests."""
    return sum(1 + q["reading_effort"] / 20 + 1 - q["value"] / 10
               for q in line["attention"]["requests"] if q["discretionary"] or exempt)


COSTS: dict[str, Callable[[dict], float]] = {
    "messages": lambda line: sum(q["discretionary"] for q in line["attention"]["requests"]),
    "atomic": lambda line: sum(q["atomic_questions"] for q in line["attention"]["requests"]
                               if q["discretionary"]),
    "full": full_cost}


def pick(lines: list[dict], backbone: str, variant: str, domain: str | None = None) -> list:
    """The lines of one backbone and variant (and domain)."""
    return [x for x in lines if x["axes"]["backbone"] == backbone and x["variant"] == variant
            and (domain is None or x["domain"] == domain)]


def cell(lines: list[dict], backbone: str, variant: str, metric: str, domain: str,
         accounting: str = "full", *, lam: float) -> float:
    """R, A, U, V or requests (discretionary messages per session) of one (backbone, variant,
    domain); A and U under ``full`` over the sessions whose requests were all judged."""
    mine = pick(lines, backbone, variant, domain)
    scored = [x for x in mine if accounting != "full" or judged(x)]
    if metric == "R":
        return mean(x["score"] for x in mine)
    if metric == "requests":
        return mean(COSTS["messages"](x) for x in mine)
    if metric == "A":
        return mean(COSTS[accounting](x) for x in scored)
    if metric == "U":
        return mean(x["score"] - lam * full_cost(x) for x in scored)
    if metric != "V":
        raise ValueError(f"no hand computation of {metric!r}")
    return mean(q["value"] for x in mine for q in x["attention"]["requests"]
                if q["discretionary"] and q["value"] is not None)


def averaged(lines: list[dict], backbone: str, variant: str, metric: str,
             accounting: str = "full", *, domains: Sequence[str], lam: float) -> float:
    """The equal mean over domains (of those with a number)."""
    return nan_mean(cell(lines, backbone, variant, metric, d, accounting, lam=lam)
                    for d in domains)


def nested(lines: list[dict], variants: list[str], metric: str, accounting: str = "full", *,
           domains: Sequence[str], backbones: Iterable[str], lam: float) -> float:
    """Mean over variants (budgets) within a backbone, then over backbones."""
    return nan_mean(nan_mean(averaged(lines, b, v, metric, accounting, domains=domains, lam=lam)
                             for v in variants) for b in backbones)


def efficiency(lines: list[dict], backbone: str, variant: str, *,
               domains: Sequence[str]) -> float:
    """Asking efficiency (R − R_no-ask) / A of a variant over its backbone's No-ask: per parent
    task the mean over its seeds (A over the variant's judged sessions; a task with none is left
    out), per domain the mean over its tasks, then the equal mean over the domains that kept a
    task; NaN where A is 0."""
    per_domain: dict[str, list[float]] = {m: [] for m in ("R", "R0", "A")}
    for domain in domains:
        tasks: dict[str, list[float]] = {m: [] for m in per_domain}
        mine = pick(lines, backbone, variant, domain)
        for task in sorted({x["task_id"] for x in mine}):
            ran = [x for x in mine if x["task_id"] == task]
            base = [x for x in pick(lines, backbone, "no-ask", domain) if x["task_id"] == task]
            costs = [full_cost(x) for x in ran if judged(x)]
            if costs and base:
                tasks["R"].append(mean(x["score"] for x in ran))
                tasks["R0"].append(mean(x["score"] for x in base))
                tasks["A"].append(mean(costs))
        if tasks["A"]:
            for m, values in per_domain.items():
                values.append(mean(tasks[m]))
    means = {m: mean(v) for m, v in per_domain.items()}
    if math.isnan(means["A"]) or means["A"] == 0:
        return math.nan
    return (means["R"] - means["R0"]) / means["A"]


def close(a: float | None, b: float, tol: float = 1e-9) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=tol, abs_tol=tol)


def agrees(reported: Any, expected: float, tol: float = 1e-9) -> bool:
    """A reported number equals the hand value, or both are missing (None in report.json, NaN
    or infinite by hand)."""
    if not math.isfinite(expected):
        return reported is None
    return close(reported, expected, tol)
