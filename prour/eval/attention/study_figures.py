"""The figures of the Ask-Less study report (Figures 3 to 8): what each draws, computed from the
study and set beside the paper's points where the paper prints numbers for them (its figures are
pictures in our copy: the points come from the per-model Tables 29-36, Table 5 and Table 13, as
each item says). Each ``figureN_item`` returns the item and the series its plot draws
(:mod:`prour.eval.attention.study_plots` draws them); nothing here writes a file."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from prour.eval.attention.study_items import (
    BUDGETS,
    Study,
    StudyItem,
    Table,
    ci_cell,
    ci_data,
    equal_cost,
    find_label,
    matched_interval,
    mean_of,
    new_item,
    no_grid,
    num,
    ratio_of_means,
    value_data,
)
from prour.eval.attention.study_panel import Panel
from prour.eval.attention.study_paper import (
    PAPER_LAMBDA,
    TAU_DOMAINS,
    PaperLookup,
    model_point,
)
from prour.eval.stats import BootstrapResult

PATH = ("no-ask", *(f"budgeted@{n}" for n in BUDGETS), "unrestricted")
PAPER_POINTS = ("Each paper point is the mean of that model's Tables 29-36 cells over the three "
                "tau domains (retail, airline, telecom) only; the paper's own figure averages "
                "four domains (WebShop too). Its N=2, 3 Budgeted rows are not in our copy.")


def domain_means(study: Study, grid: str = "main") -> dict[tuple[str, str], Any]:
    """(backbone, variant) → the analysis module's row averaged over domains (equal weights)."""
    from prour.eval.attention.analysis import average_over_domains

    return {(r.model, r.method): r for r in average_over_domains(study.method_rows(grid))}


def _marker_labels(study: Study) -> list[str]:
    """Frugal and the as-run VoI gate's variant labels in grid ``main``."""
    panel = study.grid("main")
    found = [find_label(panel, p) for p in ("frugal", "voi-gate-as-run")] if panel else []
    return [label for label in found if label]


def _cost(row: Any) -> float:
    return 0.0 if row.method == "no-ask" and math.isnan(row.cost) else row.cost


def _paper_points(lookup: PaperLookup, model: str | None, labels: Sequence[str],
                  domains: Sequence[str]) -> list[dict[str, Any]]:
    points = [model_point(lookup, model, label, domains) for label in labels] if model else []
    return [{"label": p.label, "A": p.x, "R": p.y, "cells": list(p.ids), "source": p.source}
            for p in points if p is not None]


# ---- Figure 3 ----------------------------------------------------------------------------------


def figure3_item(study: Study) -> tuple[StudyItem, dict[str, Any]]:
    """Per backbone, domain-averaged: No-ask → Budgeted N=1-3 → Unrestricted, with Frugal and
    the as-run VoI gate as markers; the paper model's points beside it."""
    item, lookup = new_item("figure3", "figure3_paths.png"), PaperLookup()
    means = domain_means(study)
    if not means:
        no_grid(item, "main", "Figure 3")
    drawn: dict[str, Any] = {}
    rows = []
    markers = _marker_labels(study)
    for backbone in dict.fromkeys(b for b, _ in means):
        path = [{"label": v, "A": _cost(means[(backbone, v)]), "R": means[(backbone, v)].reward}
                for v in PATH if (backbone, v) in means]
        extra = [{"label": v, "A": means[(backbone, v)].cost, "R": means[(backbone, v)].reward}
                 for v in markers if (backbone, v) in means]
        model = study.model(backbone)
        paper = _paper_points(lookup, model, [*PATH, "frugal", "voi-gate-as-run(c=0.27)"],
                              TAU_DOMAINS)
        drawn[backbone] = {"path": path, "markers": extra, "model": model, "paper": paper}
        missing = [v for v in PATH if (backbone, v) not in means]
        if missing:
            item.missing.append(f"backbone {backbone}: no {', '.join(missing)} episodes")
        rows += _point_rows(backbone, [*path, *extra], paper)
        item.text.append(f"{backbone}: " + ", ".join(
            f"{p['label']} (A {num(p['A'], 2)}, R {num(p['R'], 3)})" for p in path))
    item.tables.append(Table(["Backbone", "Point", "A (run)", "R (run)", "A (paper)",
                              "R (paper)"], rows))
    item.notes = [("x: mean user-attention cost A per session (prour's scale, "
                   f"{study.data.accounting} accounting); y: mean reward R (0-1); both averaged "
                   "over domains with equal weights. No-ask is drawn at A = 0."), PAPER_POINTS]
    item.data = {"backbones": drawn}
    item.paper = lookup.used
    return item, drawn


def _point_rows(backbone: str, points: Sequence[dict[str, Any]],
                paper: Sequence[dict[str, Any]]) -> list[list[str]]:
    """Table rows: each drawn point beside the paper point of the same variant."""
    by_label = {p["label"]: p for p in paper}
    rows = []
    for p in points:
        mate = by_label.get(p["label"]) or by_label.get(_paper_label(p["label"]))
        rows.append([backbone, p["label"], num(p["A"], 3), num(p["R"], 3),
                     num(mate["A"], 2) if mate else "–", num(mate["R"], 2) if mate else "–"])
    return rows


def _paper_label(label: str) -> str:
    """A run's VoI-as-run label mapped to the paper's (c = 0.27)."""
    return "voi-gate-as-run(c=0.27)" if label.startswith("voi-gate-as-run") else label


# ---- Figure 5 ----------------------------------------------------------------------------------


def figure5_item(study: Study) -> tuple[StudyItem, dict[str, Any]]:
    """One panel per domain: each backbone's Budgeted N=1-3 curve; No-ask, Unrestricted, Frugal
    and VoI gate as markers; the paper model's cells of that domain beside them."""
    from prour.eval.attention.study_tables import method_cells

    item, lookup = new_item("figure5", "figure5_domains.png"), PaperLookup()
    cells = method_cells(study)
    if not cells:
        no_grid(item, "main", "Figure 5")
    domains = [d for d in TAU_DOMAINS if any(k[2] == d for k in cells)] + sorted(
        {k[2] for k in cells} - set(TAU_DOMAINS))
    markers = ["no-ask", "unrestricted", *_marker_labels(study)]
    drawn: dict[str, Any] = {}
    rows = []
    for domain in domains:
        drawn[domain] = {}
        for backbone in dict.fromkeys(k[0] for k in cells):
            curve = [_cell_point(cells[(backbone, f"budgeted@{n}", domain)]) for n in BUDGETS
                     if (backbone, f"budgeted@{n}", domain) in cells]
            extra = [_cell_point(cells[(backbone, v, domain)]) for v in markers
                     if (backbone, v, domain) in cells]
            model = study.model(backbone)
            paper = _paper_points(lookup, model, [*PATH, "frugal", "voi-gate-as-run(c=0.27)"],
                                  [domain]) if domain in TAU_DOMAINS else []
            drawn[domain][backbone] = {"curve": curve, "markers": extra, "model": model,
                                       "paper": paper}
            rows += [[domain, *r] for r in _point_rows(backbone, [*curve, *extra], paper)]
    item.tables.append(Table(["Domain", "Backbone", "Point", "A (run)", "R (run)", "A (paper)",
                              "R (paper)"], rows))
    item.notes = [("Per domain: mean cost A (prour's scale) and mean reward R (0-1) over the "
                   "domain's sessions. Paper points: that model's cells of the same domain in "
                   "Tables 29-36 (No-ask at A = 0; only N=1 of the Budgeted curve is in our "
                   "copy).")]
    item.text = [f"{d}: {len(drawn[d])} backbone curve(s)" for d in domains]
    item.data = {"domains": drawn}
    item.paper = lookup.used
    return item, drawn


def _cell_point(row: Any) -> dict[str, Any]:
    return {"label": row.method, "A": _cost(row), "R": row.reward}


# ---- Figure 4 ----------------------------------------------------------------------------------

F4_PANELS = (("saved", "(a) attention cost saved (%)"),
             ("value", "(b) change in judged value (Ṽ points)"),
             ("reward", "(c) ΔR at equal cost (points)"))
ALL = "all backbones"


def _mgr_results(study: Study, panel: Panel, backbones: Sequence[str]) -> dict[str, Any]:
    """Budgeted + MGR against Budgeted over N=1-3 on some backbones: cost saved, Ṽ change at
    the same N, and ΔR against the cost-matched Budgeted mixture."""
    mgr, bud = [], []
    for b in backbones:
        for n in BUDGETS:
            if panel.has((b, f"budgeted+mgr@{n}")) and panel.has((b, f"budgeted@{n}")):
                mgr.append((b, f"budgeted+mgr@{n}"))
                bud.append((b, f"budgeted@{n}"))
    if not mgr:
        return dict.fromkeys(("saved", "value", "reward"))
    same = panel.restrict([*mgr, *bud])
    v_m, v_b = mean_of(same, "V", mgr), mean_of(same, "V", bud)
    restricted, matches, notes = equal_cost(study, panel, mgr)
    return {"saved": study.interval(same, ratio_of_means(same, "A", mgr, bud)),
            "value": study.interval(same, lambda c: 10.0 * (v_m(c) - v_b(c))),
            "reward": matched_interval(study, restricted, matches, "R"), "notes": notes}


def _figure4_paper(study: Study, lookup: PaperLookup) -> dict[str, dict[str, Any]]:
    """The paper's all-model summaries: Table 13 (cost saved, this accounting), Table 5 (ΔR;
    the Ṽ change as MGR's observed Ṽ minus Budgeted's)."""
    from prour.eval.attention.paper_values import paper_accountings

    out: dict[str, dict[str, Any]] = {}
    row = paper_accountings().get(study.data.accounting)
    saved = lookup.get("table13", metric="saved", row=row, policy="budgeted+mgr",
                       budget="1-3") if row else None
    if saved is not None:
        out["saved"] = {"estimate": saved.value, "low": float(saved.interval[0]),
                        "high": float(saved.interval[1]), "cells": [saved.id],
                        "source": f"{saved.source}, {row} row, MGR column"}
    mgr_v = lookup.get("table5", metric="V_tilde", policy="budgeted+mgr", budget="1-3")
    bud_v = lookup.get("table5", metric="V_tilde", policy="budgeted", budget="1-3")
    if mgr_v and bud_v:
        out["value"] = {"estimate": mgr_v.value - bud_v.value, "low": None, "high": None,
                        "cells": [mgr_v.id, bud_v.id],
                        "source": "Table 5, observed V: Budgeted + MGR minus Budgeted"}
    d_r = lookup.get("table5", metric="dR", policy="budgeted+mgr", budget="1-3")
    if d_r is not None:
        out["reward"] = {"estimate": d_r.value, "low": None, "high": None, "cells": [d_r.id],
                         "source": "Table 5, ΔR at equal cost of Budgeted + MGR"}
    return out


def figure4_item(study: Study) -> tuple[StudyItem, dict[str, Any]]:
    """Per backbone and over all of them: MGR's cost saved, value change and ΔR."""
    item, lookup = new_item("figure4", "figure4_mgr.png"), PaperLookup()
    panel = study.grid("main")
    if panel is None:
        no_grid(item, "main", "Figure 4")
    results: dict[str, Any] = {}
    for backbone in [*(panel.backbones if panel else []), ALL]:
        chosen = panel.backbones if backbone == ALL else [backbone]
        results[backbone] = _mgr_results(study, panel, chosen) if panel else dict.fromkeys(
            ("saved", "value", "reward"))
        if panel and backbone != ALL and results[backbone]["saved"] is None:
            item.missing.append(f"backbone {backbone}: no N with both Budgeted and Budgeted + MGR")
        item.notes += [f"{backbone}: {n}" for n in results[backbone].pop("notes", [])]
    paper = _figure4_paper(study, lookup)
    rows = [[b, *(ci_cell(r[k], 1, True, True) for k, _ in F4_PANELS)]
            for b, r in results.items()]
    rows.append(["paper (all eight models)",
                 *(_paper_cell(paper.get(k)) for k, _ in F4_PANELS)])
    item.tables.append(Table(["Backbone", *(t for _, t in F4_PANELS)], rows))
    item.notes = [("Budgeted + MGR against Budgeted, over N=1-3 (budgets within a backbone, "
                   "domains with equal weights); (a) 100·(1 − A_MGR / A_Budgeted) and (b) "
                   "10·(V_MGR − V_Budgeted) at the same N, (c) ΔR against the cost-matched "
                   "Budgeted N, N + 1 mixture (points). 95% paired parent-task bootstrap; * where "
                   "the interval excludes zero. The diamond (all backbones) averages backbones "
                   "with equal weights."),
                  "Paper diamonds (its Table 27 and Figure 4's per-model values are not in our "
                  "copy): " + "; ".join(f"{k}: {v['source']}" for k, v in paper.items())]
    item.text = [f"{b}: saved {row[1]} %, Ṽ {row[2]}, ΔR {row[3]}"
                 for b, row in zip(results, rows)]
    item.data = {"backbones": {b: {k: ci_data(r[k]) for k, _ in F4_PANELS}
                               for b, r in results.items()}, "paper": paper}
    item.paper = lookup.used
    return item, item.data


def _paper_cell(value: dict[str, Any] | None) -> str:
    if value is None:
        return "–"
    text = f"{value['estimate']:+.1f}"
    return text + (f" [{value['low']:.1f}, {value['high']:.1f}]" if value["low"] is not None
                   else "")


# ---- Figure 6 ----------------------------------------------------------------------------------


def efficiency(study: Study, panel: Panel, backbone: str, label: str,
               ) -> BootstrapResult | str:
    """Asking efficiency of one variant over the backbone's No-ask on the parent tasks both ran
    (the variant's cost over its judged sessions): analysis.efficiency_interval with domains as
    strata; a string says why there is none."""
    from prour.eval.attention.analysis import efficiency_interval

    cells = [(backbone, label), (backbone, "no-ask")]
    if not all(panel.has(c) for c in cells):
        return f"no {label if not panel.has(cells[0]) else 'no-ask'} episodes"
    same = panel.restrict(cells)
    sums, acc = same.sums, panel.accounting
    keep = sums[f"scored:{acc}"][0] > 0
    if not keep.any():
        return "no session of the policy has all its requests judged"
    reward = sums["reward"][:, keep] / sums["n"][:, keep]
    cost = sums[f"cost:{acc}"][0, keep] / sums[f"scored:{acc}"][0, keep]
    strata = [d for d, k in zip(same.strata, keep) if k]
    try:
        return efficiency_interval(reward[0], reward[1], cost, study.n_boot, ci=study.ci,
                                   strata=strata)
    except ValueError as exc:
        return str(exc)


def figure6_item(study: Study) -> tuple[StudyItem, dict[str, Any]]:
    """Asking efficiency (R − R_no-ask) / A of Budgeted N=3 and Unrestricted per backbone;
    hatched where Unrestricted's interval does not lie above zero (no clear gain)."""
    item = new_item("figure6", "figure6_efficiency.png")
    panel = study.grid("main")
    if panel is None:
        no_grid(item, "main", "Figure 6")
    drawn: dict[str, Any] = {}
    for backbone in panel.backbones if panel else []:
        entry: dict[str, Any] = {}
        for label in ("budgeted@3", "unrestricted"):
            found = efficiency(study, panel, backbone, label)
            if isinstance(found, str):
                item.missing.append(f"backbone {backbone}, {label}: {found}")
            entry[label] = {"estimate": None, "note": found} if isinstance(found, str) \
                else ci_data(found)
        low = entry["unrestricted"].get("low")
        entry["hatched"] = low is None or low <= 0
        drawn[backbone] = entry
    item.tables.append(Table(["Backbone", "Budgeted N=3", "Unrestricted",
                              "Unrestricted gains clearly over No-ask"],
                             [[b, _eff_cell(e["budgeted@3"]), _eff_cell(e["unrestricted"]),
                               "no (hatched)" if e["hatched"] else "yes"]
                              for b, e in drawn.items()]))
    item.notes = [("Efficiency = (mean R − mean R_no-ask) / mean A over the parent tasks both "
                   "ran (seeds averaged within a task; A over the policy's judged sessions), each "
                   "mean the equal average of its domain means (R on 0-1, A on prour's scale); "
                   "95% paired task bootstrap, tasks resampled within domains "
                   "(analysis.efficiency_interval). Hatched: Unrestricted's interval does not lie "
                   "above zero, so its comparison says little."),
                  "The paper's values for this figure (its Table 22) are not in our copy."]
    item.text = [f"{b}: Budgeted N=3 {_eff_cell(e['budgeted@3'])}, Unrestricted "
                 f"{_eff_cell(e['unrestricted'])}" for b, e in drawn.items()]
    item.data = {"backbones": drawn}
    return item, drawn


def _eff_cell(entry: dict[str, Any] | None) -> str:
    if not entry or entry.get("estimate") is None:
        return "– " + (f"({entry['note']})" if entry and entry.get("note") else "")
    return (f"{entry['estimate']:.4f} [{num(entry['low'], 4)}, {num(entry['high'], 4)}]")


# ---- Figure 7 ----------------------------------------------------------------------------------

F7_POLICIES = ("no-ask", "unrestricted", "frugal", "voi-gate-as-run",
               *(f"budgeted@{n}" for n in BUDGETS), *(f"budgeted+mgr@{n}" for n in BUDGETS))


def lambda_grid(lam: float) -> list[float]:
    """λ from 1e-3 to 1 on a log grid, with the paper's 0.03 and the study's λ on it."""
    grid = {float(f"{x:.6g}") for x in np.logspace(-3, 0, 49)} | {PAPER_LAMBDA, float(lam)}
    return sorted(grid)


def figure7_item(study: Study) -> tuple[StudyItem, dict[str, Any]]:
    """U(λ) = R − λ·A per policy and backbone, R and A averaged over domains and trials; the
    paper model's U at λ = 0.03 (Tables 29-36, three tau domains) as stars."""
    item, lookup = new_item("figure7", "figure7_lambda.png"), PaperLookup()
    means = domain_means(study)
    if not means:
        no_grid(item, "main", "Figure 7")
    lams = lambda_grid(study.data.lam)
    voi = _marker_labels(study)
    labels = [v for p in F7_POLICIES for v in ([x for x in voi if x.startswith(p)]
                                                if p == "voi-gate-as-run" else [p])]
    drawn: dict[str, Any] = {}
    rows = []
    for backbone in dict.fromkeys(b for b, _ in means):
        lines = {}
        for label in labels:
            row = means.get((backbone, label))
            if row is None or math.isnan(_cost(row)):
                continue
            lines[label] = {"x": lams, "y": [row.reward - lam * _cost(row) for lam in lams],
                            "R": row.reward, "A": _cost(row)}
        paper = _paper_utilities(lookup, study.model(backbone), labels)
        drawn[backbone] = {"lines": lines, "paper": paper, "model": study.model(backbone)}
        at = lams.index(PAPER_LAMBDA)
        rows += [[backbone, label, num(line["y"][at], 3),
                  num(paper.get(_paper_label(label), {}).get("U"), 3)]
                 for label, line in lines.items()]
    item.tables.append(Table(["Backbone", "Policy", "U at λ = 0.03 (run)",
                              "U at λ = 0.03 (paper, 3 tau domains)"], rows))
    item.notes = [("U(λ) = R − λ·A with R (0-1) and A (prour's scale) the equal means over "
                   "domains of the means over sessions and trials; the dashed line marks "
                   f"λ = 0.03 (the study's λ = {study.data.lam:g}). Paper stars: the model's U "
                   "cells of Tables 29-36 (λ = 0.03) averaged over retail, airline and telecom; "
                   "the paper's figure shows GPT-6-Astra only, averaged over four domains.")]
    item.text = [f"{r[0]} {r[1]}: U(0.03) {r[2]}" for r in rows]
    item.data = {"lambdas": lams, "backbones": {b: {
        "lines": {k: {"R": v["R"], "A": v["A"], "U_at_0.03": v["y"][lams.index(PAPER_LAMBDA)],
                      "U_at_lam": v["y"][lams.index(float(study.data.lam))]}
                  for k, v in d["lines"].items()}, "paper": d["paper"]}
        for b, d in drawn.items()}}
    item.paper = lookup.used
    return item, drawn


def _paper_utilities(lookup: PaperLookup, model: str | None,
                     labels: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The model's U cells averaged over the tau domains, per paper variant (all three printed)."""
    out = {}
    for label in {_paper_label(v) for v in labels} if model else ():
        cells = [lookup.model_cell(model, label, "U", d) for d in TAU_DOMAINS]
        if all(c is not None for c in cells):
            out[label] = {"U": sum(c.value for c in cells) / len(cells),
                          "cells": [c.id for c in cells], "source": cells[0].source}
    return out


# ---- Figure 8 ----------------------------------------------------------------------------------


def figure8_item(study: Study) -> tuple[StudyItem, dict[str, Any]]:
    """Unrestricted per backbone and domain: discretionary messages per session, and reward gain
    over No-ask in points; the paper model's gain (Tables 29-36) beside it."""
    from prour.eval.attention.study_tables import method_cells

    item, lookup = new_item("figure8", "figure8_frequency.png"), PaperLookup()
    cells = method_cells(study)
    if not cells:
        no_grid(item, "main", "Figure 8")
    domains = [d for d in TAU_DOMAINS if any(k[2] == d for k in cells)] + sorted(
        {k[2] for k in cells} - set(TAU_DOMAINS))
    drawn: dict[str, Any] = {}
    rows = []
    for backbone in dict.fromkeys(k[0] for k in cells):
        model, entry = study.model(backbone), {}
        for domain in domains:
            unres, base = cells.get((backbone, "unrestricted", domain)), cells.get(
                (backbone, "no-ask", domain))
            gain = 100 * (unres.reward - base.reward) if unres and base else None
            paper = _paper_gain(lookup, model, domain)
            entry[domain] = {"requests": value_data(unres.requests) if unres else None,
                             "gain": value_data(gain), "paper_gain": paper}
            if unres is None or base is None:
                item.missing.append(f"backbone {backbone}, {domain}: no "
                                    f"{'Unrestricted' if unres is None else 'No-ask'} episodes")
            rows.append([backbone, domain, num(entry[domain]["requests"], 2), num(gain, 1),
                         num(paper["gain"], 1) if paper else "–"])
        drawn[backbone] = entry
    item.tables.append(Table(["Backbone", "Domain", "Messages per session (run)",
                              "Gain over No-ask (run, points)", "Gain (paper, points)"], rows))
    item.notes = [("Unrestricted means over three trials (all of the study's): top, delivered "
                   "discretionary messages per session; bottom, 100·(R_Unrestricted − R_No-ask). "
                   "Paper gains: the model's Unrestricted minus No-ask R cells in Tables 29-36; "
                   "the paper prints no per-model message counts in our copy.")]
    item.text = [f"{r[0]} {r[1]}: {r[2]} messages, gain {r[3]} (paper {r[4]})" for r in rows]
    item.data = {"backbones": drawn}
    item.paper = lookup.used
    return item, drawn


def _paper_gain(lookup: PaperLookup, model: str | None, domain: str) -> dict[str, Any] | None:
    unres = lookup.model_cell(model, "unrestricted", "R", domain)
    base = lookup.model_cell(model, "no-ask", "R", domain)
    if unres is None or base is None:
        return None
    return {"gain": 100 * (unres.value - base.value), "cells": [unres.id, base.id],
            "source": unres.source, "model": model}

