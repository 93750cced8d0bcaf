"""The main grid's tables of the Ask-Less study report (Tables 3, 5, 13, 14 and the per-backbone
tables like Tables 29-36), each computed from the study's panels (:mod:`study_panel`) and set
beside the paper's published values (:mod:`study_paper`). Every function returns a
:class:`~prour.eval.attention.study_items.StudyItem`; nothing here writes a file."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from prour.config.attention import variant_of
from prour.eval.attention.study_items import (
    A_TILDE,
    BUDGETS,
    EQUAL_COST,
    PAPER,
    POLICY_NAMES,
    RUN,
    SCALES,
    Study,
    StudyItem,
    Table,
    cells_of,
    ci_cell,
    ci_data,
    equal_cost,
    find_label,
    labels_of,
    matched_interval,
    mean_of,
    missing_cells,
    new_item,
    no_grid,
    num,
    point,
    ratio_of_means,
    value_data,
)
from prour.eval.attention.study_panel import CellKey, Panel
from prour.eval.attention.study_paper import DASH, PaperLookup, scale_check
from prour.eval.stats import BootstrapResult

# ---- Table 3 -----------------------------------------------------------------------------------

TABLE3_ROWS = (("unrestricted", None), ("frugal", None), ("voi-gate-as-run", None),
               ("budgeted", BUDGETS), ("budgeted+mgr", BUDGETS))


def _row_fields(policy: str, budgets: Sequence[int] | None) -> dict[str, str | None]:
    """The paper's fields of a Table 3-style row (Budgeted rows: the mean over N=1-3)."""
    return {"policy": policy, "budget": "1-3" if budgets else None,
            "threshold": "0.27" if policy == "voi-gate-as-run" else None}


def table3_item(study: Study) -> StudyItem:
    """R×100, A and Ṽ per policy: domains within a backbone, (budgets,) then backbones."""
    item, lookup = new_item("table3", "table3.md"), PaperLookup()
    panel = study.grid("main")
    if panel is None:
        no_grid(item, "main", "Table 3")
    rows, data = [], []
    for policy, budgets in TABLE3_ROWS:
        labels = labels_of(panel, policy, budgets, item.missing)
        cells = cells_of(panel, labels) if panel else []
        r, a, v = (point(panel, m, cells) if panel else math.nan for m in ("R", "A", "V"))
        paper = {m: lookup.text("table3", metric=m, domain="customer-service",
                                **_row_fields(policy, budgets))
                 for m in ("R", "A_tilde", "V_tilde")}
        name = POLICY_NAMES[policy] + (" (mean N=1-3)" if budgets else "")
        rows.append([name, num(100 * r), paper["R"], num(a, 2), paper["A_tilde"], num(10 * v),
                     paper["V_tilde"], ", ".join(labels) or DASH])
        data.append({"policy": policy, "variants": labels, "R": value_data(100 * r),
                     "A": value_data(a), "V_tilde": value_data(10 * v), "paper": paper})
        item.text.append(f"{name}: R {num(100 * r)} (paper {paper['R']}), A {num(a, 2)} "
                         f"(paper Ã {paper['A_tilde']}, another scale), Ṽ {num(10 * v)} "
                         f"(paper {paper['V_tilde']})")
    if panel is not None:
        item.missing += missing_cells(panel, [v for row in data for v in row["variants"]],
                                      "Table 3")
    item.tables.append(Table(["Policy", "R (run, %)", "R (paper)", "A (run, prour scale)",
                              "Ã (paper, display scale)", "Ṽ (run, 0-100)", "Ṽ (paper)",
                              "Run variants"], rows))
    item.notes += _table3_notes(study, panel)
    item.data = {"rows": data, "accounting": study.data.accounting}
    item.paper = lookup.used
    return item


def _table3_notes(study: Study, panel: Panel | None) -> list[str]:
    scope = (f"This run: {len(panel.backbones)} backbone(s) on {', '.join(panel.domains)}."
             if panel else "")
    return [SCALES.format(accounting=study.data.accounting),
            ("Means: domains within a backbone with equal weights, then backbones with equal "
             "weights; Budgeted rows first average N=1-3 within each backbone. R over every "
             "session; A over the sessions whose counted requests were all judged; V pooled over "
             "the judged requests of a domain."),
            A_TILDE,
            ("The paper's customer-service columns average four domains (retail, airline, telecom, "
             f"WebShop) and eight models, three trials each. {scope}"),
            ("Scale check on the paper's own numbers (our reading of \"0-100 scales\": R ×100 and "
             "Ṽ = 10·V): the per-model Tables 29-36 averaged like Table 3 give"),
            *(f"  {line}" for line in scale_check(PaperLookup())),
            ("R and Ṽ agree to rounding (Table 3 pools V slightly differently, as its Table 5 "
             "caption says), so the reading holds; A and Ã differ by a factor the paper does not "
             "state in our copy, so the run's A is never set against Ã as if equal.")]


# ---- Table 5 -----------------------------------------------------------------------------------

TABLE5_POLICIES = ("budgeted", "budgeted+review", "budgeted+review+summary", "budgeted+mgr")


def table5_item(study: Study) -> StudyItem:
    """Observed A and Ṽ over N=1-3, and ΔR, ΔṼ against the cost-matched Budgeted mixture."""
    item, lookup = new_item("table5", "table5.md"), PaperLookup()
    panel = study.grid("main")
    if panel is None:
        no_grid(item, "main", "Table 5")
    rows, data = [], []
    for policy in TABLE5_POLICIES:
        labels = labels_of(panel, policy, BUDGETS, item.missing, evidence=None)
        cells = cells_of(panel, labels) if panel else []
        a, v = (point(panel, m, cells) if cells else math.nan for m in ("A", "V"))
        d_r = d_v = None
        if policy != "budgeted" and cells:
            restricted, matches, notes = equal_cost(study, panel, cells)
            item.notes += [f"{POLICY_NAMES[policy]}: {n}" for n in notes]
            d_r = matched_interval(study, restricted, matches, "R")
            d_v = matched_interval(study, restricted, matches, "V")
        fields = {"policy": policy, "budget": "1-3"}
        paper = {m: lookup.text("table5", metric=m, **fields)
                 for m in ("A_tilde", "V_tilde", "dR", "dV_tilde")}
        reference = policy == "budgeted"
        rows.append([POLICY_NAMES[policy], num(a, 2), paper["A_tilde"], num(10 * v),
                     paper["V_tilde"], DASH if reference else ci_cell(d_r, 1, True, True),
                     paper["dR"], DASH if reference else ci_cell(d_v, 1, True, True),
                     paper["dV_tilde"]])
        data.append({"policy": policy, "variants": labels, "A": value_data(a),
                     "V_tilde": value_data(10 * v), "dR": ci_data(d_r), "dV_tilde": ci_data(d_v),
                     "paper": paper})
        item.text.append(f"{POLICY_NAMES[policy]}: A {num(a, 2)}, Ṽ {num(10 * v)} (paper "
                         f"{paper['V_tilde']}), ΔR {ci_cell(d_r, 1, True, True)} (paper "
                         f"{paper['dR']}), ΔṼ {ci_cell(d_v, 1, True, True)} (paper "
                         f"{paper['dV_tilde']})")
    item.tables.append(Table(["Policy", "A (run, prour scale)", "A (paper, display scale)",
                              "Ṽ (run)", "Ṽ (paper)", "ΔR at equal cost (run, points)",
                              "ΔR (paper)", "ΔṼ at equal cost (run)", "ΔṼ (paper)"], rows))
    item.notes[:0] = [("Observed A and Ṽ: means over N=1-3 within a backbone, domains with "
                       "equal weights, then backbones."), EQUAL_COST, A_TILDE]
    item.data = {"rows": data}
    item.paper = lookup.used
    return item


# ---- Table 13 ----------------------------------------------------------------------------------


def _saved(study: Study, panel: Panel, accounting: str, top: Sequence[CellKey],
           bottom: Sequence[CellKey]) -> BootstrapResult | None:
    if not top or not bottom:
        return None
    restricted = panel.restrict([*top, *bottom])
    return study.interval(restricted, ratio_of_means(restricted, f"A:{accounting}", top, bottom))


def table13_item(study: Study) -> StudyItem:
    """Cost saved (%) per accounting: Budgeted N vs Unrestricted, MGR vs Budgeted (N=1-3)."""
    from prour.eval.attention.cost import ACCOUNTINGS
    from prour.eval.attention.paper_values import paper_accountings

    item, lookup = new_item("table13", "table13.md"), PaperLookup()
    panel = study.grid("main")
    if panel is None:
        no_grid(item, "main", "Table 13")
    budgeted = labels_of(panel, "budgeted", BUDGETS, item.missing)
    mgr = labels_of(panel, "budgeted+mgr", BUDGETS, item.missing)
    unrestricted = labels_of(panel, "unrestricted", None, item.missing)
    columns = [f"Budgeted N={n}" for n in BUDGETS] + ["MGR, mean N=1-3"]
    rows, data = [], {}
    for accounting in ACCOUNTINGS:
        results = [_saved(study, panel, accounting, cells_of(panel, [f"budgeted@{n}"]),
                          cells_of(panel, unrestricted)) if panel else None for n in BUDGETS]
        results.append(_saved(study, panel, accounting, cells_of(panel, mgr),
                              cells_of(panel, budgeted)) if panel else None)
        paper = [lookup.text("table13", metric="saved", row=paper_accountings()[accounting],
                             policy="budgeted", budget=str(n)) for n in BUDGETS]
        paper.append(lookup.text("table13", metric="saved", row=paper_accountings()[accounting],
                                 policy="budgeted+mgr", budget="1-3"))
        name = f"{paper_accountings()[accounting]} (`{accounting}`)"
        rows += [[name, RUN, *(ci_cell(r) for r in results)], [name, PAPER, *paper]]
        data[accounting] = {"columns": columns, "saved": [ci_data(r) for r in results],
                            "paper": paper}
        if any(r is None for r in results) and panel is not None:
            item.missing.append(f"`{accounting}`: some columns have no number (a policy not run, "
                                "or no session whose requests were all judged for this "
                                "accounting)")
        item.text.append(f"{accounting}: " + "; ".join(
            f"{c} {ci_cell(r)} (paper {p})" for c, r, p in zip(columns, results, paper)))
    item.tables.append(Table(["Cost definition", "Source", *columns], rows))
    item.notes = [("Saved % = 100 · (1 − A_policy / A_reference), each A the mean over domains "
                   "within a backbone (and over N=1-3 for the MGR column), then over backbones, "
                   "equal weights; the same trajectories rescored under each accounting. Budgeted "
                   "columns: Budgeted N against Unrestricted; MGR column: Budgeted + MGR against "
                   "Budgeted at the same N. Brackets: 95% paired parent-task bootstrap on the "
                   "tasks both sides ran.")]
    item.data = data
    item.paper = lookup.used
    return item


# ---- Table 14 ----------------------------------------------------------------------------------

TABLE14_ROWS = (("Unrestricted", "unrestricted", None), ("Frugal prompt", "frugal", None),
                ("VoI gate (as run)", "voi-gate-as-run", None),
                *((f"Budgeted, N={n}", "budgeted", n) for n in BUDGETS))


def _pooled(panel: Panel, metric: str, cells: Sequence[CellKey]) -> Callable[[Any], Any]:
    rows = [panel.index(c) for c in cells]
    return lambda counts: 100.0 * panel.pooled(metric, counts, rows)


def table14_item(study: Study) -> StudyItem:
    """Messages, atomic questions and exempt requests per session, and the bundled share."""
    item, lookup = new_item("table14", "table14.md"), PaperLookup()
    panel = study.grid("main")
    if panel is None:
        no_grid(item, "main", "Table 14")
    rows, data = [], []
    for name, policy, budget in TABLE14_ROWS:
        label = find_label(panel, policy, budget) if panel else None
        if panel is not None and label is None:
            item.missing.append(f"{name}: no episodes in grid `main`")
        results = [None] * 4
        if label is not None:
            cells = cells_of(panel, [label])
            restricted = panel.restrict(cells)
            results = [study.interval(restricted, mean_of(restricted, m, cells))
                       for m in ("requests", "atomic", "exempt")]
            results.append(study.interval(restricted, _pooled(restricted, "bundled", cells)))
        fields = {"policy": policy, "budget": None if budget is None else str(budget),
                  "threshold": "0.27" if policy == "voi-gate-as-run" else None}
        paper = [lookup.text("table14", metric=m, **fields)
                 for m in ("requests", "atomic", "exempt", "bundled")]
        shown = [ci_cell(r, 2) for r in results[:3]] + [ci_cell(results[3], 1)]
        rows += [[name, RUN, *shown], [name, PAPER, *paper]]
        data.append({"row": name, "variant": label, "requests": ci_data(results[0]),
                     "atomic": ci_data(results[1]), "exempt": ci_data(results[2]),
                     "bundled": ci_data(results[3]), "paper": paper})
        item.text.append(f"{name}: messages {shown[0]}, atomic {shown[1]}, exempt {shown[2]}, "
                         f"bundled {shown[3]} % (paper {paper[3]})")
    item.tables.append(Table(["Policy", "Source", "Messages", "Atomic questions",
                              "Exempt requests", "Bundled (%)"], rows))
    item.notes = [("Per session: delivered discretionary messages, their atomic questions, and "
                   "exempt (required) requests; means over domains within a backbone, then "
                   "backbones. Bundled: the aggregate count of discretionary messages holding more "
                   "than one atomic question over the aggregate count of discretionary messages "
                   "(all backbones, domains and trials pooled). Brackets: 95% parent-task "
                   "bootstrap (tasks resampled within domains).")]
    item.data = {"rows": data}
    item.paper = lookup.used
    return item


# ---- per-backbone tables (like Tables 29-36) ---------------------------------------------------

BACKBONE_ORDER = ("no-ask", "unrestricted", "frugal", "voi-gate-as-run", "budgeted",
                  "budgeted+mgr", "budgeted+review", "budgeted+review+summary")
METRIC_DIGITS = {"R": 3, "A": 3, "U": 3, "V": 2}


def row_order(labels: Sequence[str]) -> list[str]:
    """Variants in the order of the paper's per-model tables, the others after them."""
    def rank(label: str) -> tuple[int, int, str]:
        variant = variant_of(label)
        place = (BACKBONE_ORDER.index(variant.policy) if variant.policy in BACKBONE_ORDER
                 else len(BACKBONE_ORDER))
        return place, variant.budget or 0, label
    return sorted(labels, key=rank)


def file_names(backbones: Sequence[str]) -> dict[str, str]:
    """``backbone_<value>.md`` per backbone, the value reduced to safe characters (unique)."""
    names: dict[str, str] = {}
    for backbone in backbones:
        stem = re.sub(r"[^A-Za-z0-9._-]+", "_", backbone).strip("_.") or "backbone"
        name, k = f"backbone_{stem}.md", 2
        while name in names.values():
            name, k = f"backbone_{stem}_{k}.md", k + 1
        names[backbone] = name
    return names


def method_cells(study: Study, grid: str = "main") -> dict[tuple[str, str, str], Any]:
    """(backbone, variant, domain) → the analysis module's method row of a grid's lines."""
    return {(r.model, r.method, r.domain): r for r in study.method_rows(grid)}


def _backbone_table(study: Study, backbone: str, cells: dict[tuple[str, str, str], Any],
                    domains: Sequence[str], file: str) -> tuple[Table, dict[str, Any]]:
    """One backbone's rows (this run, then the paper's model where it has one)."""
    lookup, model = PaperLookup(), study.model(backbone)
    labels = row_order(sorted({v for b, v, _ in cells if b == backbone}))
    rows, data = [], {}
    for label in labels:
        variant = variant_of(label)
        name = POLICY_NAMES.get(variant.policy, variant.policy) + (
            f" ({label})" if variant.options else "")
        budget = "0" if label == "no-ask" else "∞" if variant.budget is None else str(
            variant.budget)
        run, numbers = [], {}
        for domain in domains:
            row = cells.get((backbone, label, domain))
            got = {"R": row.reward, "A": row.cost, "U": row.utility, "V": row.value} if row \
                else {}
            run += [num(got.get(m), METRIC_DIGITS[m]) for m in METRIC_DIGITS]
            numbers[domain] = {m: value_data(got.get(m)) for m in METRIC_DIGITS}
        rows.append([name, budget, RUN, *run])
        if model is not None:
            rows.append([name, budget, f"{PAPER} ({model})", *(
                lookup.text("backbone", interval=False, model=model, metric=m, domain=d,
                            **_model_fields(label)) for d in domains for m in METRIC_DIGITS)])
        data[label] = numbers
    header = ["Policy", "N", "Source", *(f"{d} {m}" for d in domains for m in METRIC_DIGITS)]
    caption = f"Backbone {backbone}" + (f" (the paper's {model})" if model else "")
    return Table(header, rows, caption, file, lookup.used), {"model": model, "rows": data}


def _model_fields(label: str) -> dict[str, str | None]:
    from prour.eval.attention.study_paper import paper_fields

    return paper_fields(label, per_model=True)


def backbones_item(study: Study) -> StudyItem:
    """One table per backbone: R, A, U, V per domain for every variant of grid ``main``."""
    item = new_item("backbones", "backbones.md")
    cells = method_cells(study)
    if not cells:
        no_grid(item, "main", "the per-backbone tables")
    backbones = list(dict.fromkeys(b for b, _, _ in cells))
    present = {d for _, _, d in cells}
    domains = [d for d in ("retail", "airline", "telecom") if d in present] + sorted(
        present - {"retail", "airline", "telecom"})
    names = file_names(backbones)
    for backbone in backbones:
        table, data = _backbone_table(study, backbone, cells, domains, names[backbone])
        item.tables.append(table)
        item.paper += [p for p in table.paper if p not in item.paper]
        item.data[backbone] = {"file": names[backbone], **data}
        if data["model"] is None:
            item.notes.append(f"Backbone {backbone}: no paper model is named for it (or the paper "
                              "has none of that name), so its table has no paper rows.")
        item.text.append(f"{backbone}: {names[backbone]} ({len(data['rows'])} variants)")
    item.notes[:0] = [
        (f"Per domain, over every session and trial: R the mean reward (0-1), A the mean "
         f"user-attention cost ({study.data.accounting} accounting, prour's scale, sessions "
         f"whose requests were all judged), U = R − λ·A with λ = {study.data.lam:g} (the paper: "
         f"0.03), V the mean judged value (0-10) of the judged discretionary requests; the "
         f"paper's Tables 29-36 print the same four quantities with two decimals (its A is the "
         f"raw cost, like Table 25's A_full). N: the interruption budget (∞: none).")]
    return item
