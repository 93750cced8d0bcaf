"""The attention protocol's report tables (ask-less paper), beside the analysis they show.

From one :class:`~prour.eval.attention.analysis.ConversationRecord` per gated conversation:
R, A, V, U and request statistics per (model, domain, policy), asking efficiency over No-ask
with paired task-bootstrap intervals, equal-cost comparisons against Budgeted N, N+1 mixtures
(each family Holm-adjusted), the reward-versus-attention plot, and the two passes of the human
burden study (export equal-count pairs; score the annotators' answers). The evaluation report
(:mod:`prour.eval.report`) turns its run folders into records and places these sections.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from prour.config.eval import parse_variant
from prour.env.trajectory import read_jsonl
from prour.eval.attention.analysis import (
    NO_ASK,
    UNRESTRICTED,
    ConversationRecord,
    MethodRow,
    PlotPoint,
    annotation_agreement,
    attention_paths,
    average_over_domains,
    efficiency_interval,
    equal_cost_comparison,
    export_annotation_pairs,
    method_rows,
    plot_reward_attention,
    scorable,
)
from prour.eval.attention.cost import CostWeights, conversation_cost
from prour.eval.markdown import jsonable, pct, table
from prour.eval.stats import holm_table

BURDEN_DIR = "burden"
BURDEN_KEY = "pairs_key.jsonl"


def _num(value: float, digits: int = 3) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def attention_table(rows: Sequence[Any]) -> list[str]:
    header = ["Model", "Domain", "Policy", "Conversations", "R", "A", "V", "U", "Requests",
              "Atomic", "Bundled (%)", "Fallback (%)", "Unscored", "Efficiency", "Cut"]
    body = [[r.model, r.domain, r.method, r.conversations, _num(r.reward), _num(r.cost),
             _num(r.value, 2), _num(r.utility), _num(r.requests, 2), _num(r.atomic_questions, 2),
             _num(100 * r.bundled_share, 1), _num(100 * r.fallback_rate, 1), r.unscored,
             _num(r.efficiency), r.cut] for r in rows]
    return table(header, body)


def _cells(records: Sequence[Any], accounting: str, weights: Any) -> dict[tuple, tuple]:
    """(domain, task, seed) → (cost or NaN when unjudged, reward) of one model and policy."""
    out = {}
    for r in records:
        cost = conversation_cost(r.requests, accounting, weights) \
            if scorable(r, accounting) else math.nan
        out[(r.domain, r.task_id, r.seed)] = (cost, r.reward)
    return out


def _aligned(cells: Sequence[dict[tuple, tuple]]) -> tuple[list[Any], list[str]] | str:
    """(cost, reward) arrays (n_tasks, n_seeds) per cell set on shared complete tasks, and the
    domain of each task; a string saying why when there is nothing to compare."""
    import numpy as np

    keys = set.intersection(*(set(c) for c in cells))
    seeds = sorted({k[2] for k in keys})
    tasks = sorted({k[:2] for k in keys if all((*k[:2], s) in keys for s in seeds)})
    if not tasks:
        return "no task was run with every seed under every policy compared"
    arrays = [(np.array([[c[(*t, s)][0] for s in seeds] for t in tasks]),
               np.array([[c[(*t, s)][1] for s in seeds] for t in tasks])) for c in cells]
    if any(np.isnan(cost).any() for cost, _ in arrays):
        return "some conversations lack judge scores for this accounting"
    return arrays, [t[0] for t in tasks]


def _by_policy(records: Sequence[Any]) -> dict[tuple[str, str], list[Any]]:
    """Conversation records grouped by (model, policy)."""
    groups: dict[tuple[str, str], list[Any]] = {}
    for r in records:
        groups.setdefault((r.model, r.method), []).append(r)
    return groups


def efficiency_rows(records: Sequence[Any], accounting: str, weights: Any, n_boot: int,
                    ci: float) -> list[dict[str, Any]]:
    """Asking efficiency of each policy over its model's No-ask on the tasks both ran (domains
    as strata), with a paired task-bootstrap interval and Holm-adjusted p-values of the family
    "no reward gained over No-ask"."""
    groups = _by_policy(records)
    out = []
    for (model, method), members in sorted(groups.items()):
        if method == NO_ASK or (model, NO_ASK) not in groups:
            continue
        row: dict[str, Any] = {"model": model, "policy": method, "efficiency": None}
        aligned = _aligned([_cells(x, accounting, weights)
                            for x in (members, groups[(model, NO_ASK)])])
        if isinstance(aligned, str):
            row["note"] = aligned
        else:
            ((cost, reward), (_, reward_no_ask)), strata = aligned
            try:
                row["efficiency"] = efficiency_interval(reward, reward_no_ask, cost, n_boot,
                                                        ci=ci, strata=strata)
            except ValueError as exc:
                row["note"] = str(exc)
        out.append(row)
    return _with_holm(out, "efficiency")


def efficiency_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    header = ["Model", "Policy", "Efficiency (R − R_no-ask) / A", "p (Holm)", "Note"]
    body = []
    for r in rows:
        e = r["efficiency"]
        if e is None:
            body.append([r["model"], r["policy"], "–", "–", r.get("note", "")])
            continue
        body.append([r["model"], r["policy"], f"{e.estimate:+.4f} [{e.low:+.4f}, {e.high:+.4f}]",
                     f"{r['holm']:.4f}", ""])
    return table(header, body)


def equal_cost_rows(records: Sequence[Any], accounting: str, weights: Any, n_boot: int,
                    ci: float) -> list[dict[str, Any]]:
    """Each policy other than No-ask / Budgeted / Unrestricted against the Budgeted N, N+1
    mixture of equal expected cost (domains as strata), per model."""
    groups = _by_policy(records)
    out = []
    for model in sorted({m for m, _ in groups}):
        budgets = {0: groups[(model, NO_ASK)]} if (model, NO_ASK) in groups else {}
        for (m, method), members in groups.items():
            name, n = parse_variant(method)
            if m == model and name == "budgeted" and n is not None:
                budgets[n] = members
        for (m, method), members in sorted(groups.items()):
            if m != model or method in (NO_ASK, UNRESTRICTED) or method.startswith("budgeted@"):
                continue
            out.append(_one_equal_cost(model, method, members, budgets, accounting, weights,
                                       n_boot, ci))
    return _with_holm(out, "delta")


def _with_holm(rows: list[dict[str, Any]], field: str) -> list[dict[str, Any]]:
    """Add ``holm``: the Holm-adjusted p-value of ``row[field]`` over the rows that have one."""
    family = {i: row[field] for i, row in enumerate(rows) if row.get(field) is not None}
    for i, p in holm_table(family).items():
        rows[i]["holm"] = p
    return rows


def _one_equal_cost(model: str, method: str, members: list[Any], budgets: dict[int, list[Any]],
                    accounting: str, weights: Any, n_boot: int, ci: float) -> dict[str, Any]:
    """The policy against the first adjacent Budgeted N, N+1 pair whose costs bracket its own."""
    row: dict[str, Any] = {"model": model, "policy": method, "delta": None}
    notes = []
    for n in sorted(budgets):
        if n + 1 not in budgets:
            continue
        aligned = _aligned([_cells(x, accounting, weights) for x in
                            (members, budgets[n], budgets[n + 1])])
        if isinstance(aligned, str):
            notes.append(f"N={n}: {aligned}")
            continue
        arrays, strata = aligned
        result = equal_cost_comparison(tuple(a[0] for a in arrays),
                                       tuple(a[1] for a in arrays), n_boot=n_boot, ci=ci,
                                       strata=strata)
        if result.mixture.inside:
            row.update(n=n, weight=result.mixture.weight, mixture_reward=result.mixture.reward,
                       delta=result.delta)
            return row
        notes.append(f"N={n}: {result.mixture.note}")
    row["note"] = "; ".join(notes) or "fewer than two adjacent Budgeted runs"
    return row


def equal_cost_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    header = ["Model", "Policy", "Mixture", "w", "ΔR at equal cost", "p (Holm)", "Note"]
    body = []
    for r in rows:
        if r.get("delta") is None:
            body.append([r["model"], r["policy"], "–", "–", "–", "–", r.get("note", "")])
            continue
        d = r["delta"]
        body.append([r["model"], r["policy"], f"budgeted@{r['n']}/{r['n'] + 1}",
                     f"{r['weight']:.3f}", f"{d.estimate:+.3f} [{d.low:+.3f}, {d.high:+.3f}]",
                     f"{r['holm']:.4f}", ""])
    return table(header, body)


def attention_tables(records: Sequence[ConversationRecord], accounting: str, lam: float,
                     weights: CostWeights, n_boot: int, ci: float, plot: Path,
                     ) -> tuple[list[str], dict[str, Any], Path]:
    """Markdown lines, JSON data and the reward-versus-attention plot (written to ``plot``) of
    the gated conversations: method table, asking efficiency, equal-cost comparisons."""
    rows = method_rows(records, accounting, lam, weights)
    average = average_over_domains(rows)
    efficiency = efficiency_rows(records, accounting, weights, n_boot, ci)
    comparisons = equal_cost_rows(records, accounting, weights, n_boot, ci)
    lines = ["## Attention: reward, cost, value and utility", "",
             f"Accounting `{accounting}`, λ = {lam}; U = R − λ·A.", "",
             *attention_table([*rows, *average]), "",
             "## Asking efficiency (reward gained over No-ask per unit of attention cost)", "",
             "Ratio of domain-averaged means on the tasks both policies ran; p tests no gain.",
             "", *efficiency_table(efficiency), "",
             "## Equal-cost comparisons (policy − Budgeted mixture)", "",
             *equal_cost_table(comparisons), ""]
    data = {"accounting": accounting, "lam": lam,
            "rows": [jsonable(asdict(r)) for r in [*rows, *average]],
            "efficiency": _result_rows(efficiency, "efficiency"),
            "equal_cost": _result_rows(comparisons, "delta")}
    return lines, data, _attention_plot(average, plot)


def _result_rows(rows: Sequence[dict[str, Any]], field: str) -> list[dict[str, Any]]:
    """Rows holding a :class:`BootstrapResult` under ``field`` as JSON-ready dicts."""
    return [jsonable({**r, field: asdict(r[field]) if r.get(field) else None}) for r in rows]


def _attention_plot(average: Sequence[MethodRow], out: Path) -> Path:
    """Reward versus attention: Budgeted paths per model, other policies as markers."""
    budgets = sorted({n for r in average if (n := parse_variant(r.method)[1]) is not None
                      and r.method.startswith("budgeted@")})
    paths = attention_paths(average, budgets)
    on_path = {p.label for pts in paths.values() for p in pts}
    extras: dict[str, list[Any]] = {}
    for r in average:
        if r.method not in on_path and not math.isnan(r.cost):
            extras.setdefault(r.model, []).append(PlotPoint(r.method, r.cost, r.reward))
    return plot_reward_attention(paths, out, extras)


# ---- human burden study -------------------------------------------------------------------


def export_section(records: Sequence[ConversationRecord], folder: Path, n_pairs: int,
                   accounting: str, weights: CostWeights,
                   ) -> tuple[list[str], dict[str, Any], dict[str, Path]]:
    """Pairs for annotators (transcripts as the user saw them) and the key kept from them."""
    shown, key = export_annotation_pairs(records, folder, n_pairs, accounting=accounting,
                                         weights=weights)
    count = len(shown.read_text().splitlines())
    note = (f"Exported {count} equal-count pairs ({accounting} cost) to `{shown}`; the ranking "
            f"stays in `{key.name}`. Score the answers with `--annotations`.")
    files = {"burden_pairs": shown, "burden_key": key}
    return ["## Human burden study", "", note, ""], {"exported": count,
                                                     "accounting": accounting}, files


def agreement_section(key_path: Path, annotations: Path, n_boot: int, ci: float,
                      ) -> tuple[list[str], dict[str, Any], dict[str, Path]]:
    """Agreement of the annotators' answers with the exported cost ranking."""
    if not key_path.is_file():
        raise FileNotFoundError(f"no {key_path}: export the pairs first with --burden-pairs N "
                                "(same --out)")
    keys = read_jsonl(key_path)
    agreement = annotation_agreement(keys, read_jsonl(annotations), n_boot, ci=ci)
    accounting = keys[0].get("accounting", "?") if keys else "?"
    result = agreement.interval
    note = (f"Share of non-tie answers choosing the conversation the `{accounting}` cost ranks "
            "as more burdensome; pair-bootstrap interval; p tests chance (50%).")
    lines = ["## Human burden study: agreement with the cost ranking", "", note, "",
             *table(["Pairs", "Answers", "Ties", "Agreement (%)", "p"],
                    [[agreement.pairs, agreement.answers, agreement.ties, pct(result),
                      f"{result.p_value:.4f}"]]), ""]
    data = {"accounting": accounting, **jsonable(asdict(agreement))}
    return lines, data, {}
