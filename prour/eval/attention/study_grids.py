"""The tables of the Ask-Less study report that read a grid beside ``main``: Table 7 (enforced VoI
gate, grid ``table7``), Table 8 (Budgeted + VoI gate, grid ``table8``), Table 17 (wide evidence
window, grid ``table17``) and Table 25 (two user-simulator regimes, grid ``table25``). Rows of
policies a grid does not vary come from grid ``main`` on the grid's backbones and parent tasks,
as the paper's come from its main evaluation. Nothing here writes a file."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prour.config.attention import policy_spec, variant_of
from prour.eval.attention.study_items import (
    A_TILDE,
    BUDGETS,
    EQUAL_COST,
    PAPER,
    RUN,
    Study,
    StudyItem,
    Table,
    cells_of,
    ci_cell,
    ci_data,
    equal_cost,
    find_label,
    matched_interval,
    new_item,
    no_grid,
    num,
    point,
    value_data,
)
from prour.eval.attention.study_panel import Panel, variant_label
from prour.eval.attention.study_paper import DASH, PaperLookup
from prour.eval.stats import BootstrapResult

# ---- Tables 7 and 8 ----------------------------------------------------------------------------


def _reviewed(label: str) -> bool:
    return policy_spec(variant_of(label).policy).reviews


def _session_row(study: Study, panel: Panel, label: str | None,
                 delta: BootstrapResult | None | str) -> tuple[list[str], dict[str, Any]]:
    """Requests, cost, reward, value, ΔR, reviews, vetoed %, fixed % of one variant; ``delta``
    "reference" for the Budgeted comparator itself."""
    cells = cells_of(panel, [label]) if label else []
    values = {m: point(panel, m, cells) for m in
              ("requests", "A", "R", "V", "reviews", "vetoed", "fixed")}
    reviewed = bool(label) and _reviewed(label)
    shown = [num(values["requests"], 2), num(values["A"], 2), num(100 * values["R"]),
             num(10 * values["V"]),
             "0 (reference)" if delta == "reference" else ci_cell(
                 None if isinstance(delta, str) else delta, 1, True, True),
             num(values["reviews"], 1) if reviewed else DASH,
             num(100 * values["vetoed"], 0) if reviewed else DASH,
             num(100 * values["fixed"], 1)]
    data = {"variant": label, "requests": value_data(values["requests"]),
            "A": value_data(values["A"]), "R": value_data(100 * values["R"]),
            "V_tilde": value_data(10 * values["V"]),
            "dR": 0.0 if delta == "reference" else ci_data(
                None if isinstance(delta, str) else delta),
            "reviews": value_data(values["reviews"]) if reviewed else None,
            "vetoed": value_data(100 * values["vetoed"]) if reviewed else None,
            "fixed": value_data(100 * values["fixed"])}
    return shown, data


def _paper_session_row(lookup: PaperLookup, item: str, fields: dict[str, str | None],
                       ) -> list[str]:
    return [lookup.text(item, metric=m, **fields) for m in
            ("requests", "A_tilde", "R", "V_tilde", "dR", "reviews", "vetoed", "fixed")]


def _matched(study: Study, panel: Panel, label: str | None, item: StudyItem,
             ) -> BootstrapResult | None:
    if label is None:
        return None
    restricted, matches, notes = equal_cost(study, panel, cells_of(panel, [label]))
    item.notes += notes
    return matched_interval(study, restricted, matches, "R")


SESSION_KEYS = ("variant", "requests", "A", "R", "V_tilde", "dR", "reviews", "vetoed", "fixed")
SESSION_HEADER = ["Requests per session", "Cost A (run: prour scale; paper: display)", "Reward",
                  "Value (0-100)", "ΔR at equal cost", "Reviews per session", "Vetoed (%)",
                  "Fixed message (%)"]


def _max_reviews(study: Study, grid: str, label: str | None) -> int | None:
    counts = [int((line.get("attention") or {}).get("reviews") or 0)
              for line in study.data.grids.get(grid) or [] if variant_label(line) == label]
    return max(counts) if counts else None


def table7_item(study: Study) -> StudyItem:
    """The enforced VoI gate (grid ``table7``) beside the main evaluation's rows on the same
    backbones and tasks."""
    item, lookup = new_item("table7", "table7.md"), PaperLookup()
    panel = study.merged("table7", lambda v: variant_of(v).policy != "voi-gate")
    if panel is None:
        no_grid(item, "table7", "Table 7 (the enforced VoI gate and its comparison rows)")
    specs = [("Unrestricted", "unrestricted", None, {}, None),
             ("VoI gate as run", "voi-gate-as-run", None, {}, "0.27"),
             ("VoI gate, enforced veto (c=0.50)", "voi-gate", None, {"c": 0.5}, "0.50"),
             ("VoI gate, enforced veto (c=0.65)", "voi-gate", None, {"c": 0.65}, "0.65"),
             ("Budgeted (N=1)", "budgeted", 1, {}, None)]
    rows, data = [], []
    for name, policy, budget, options, c in specs:
        label = find_label(panel, policy, budget, **options) if panel else None
        if panel is not None and label is None:
            item.missing.append(f"{name}: no {policy} episodes on the grid's backbones and tasks")
        delta = "reference" if policy == "budgeted" else (
            _matched(study, panel, label, item) if policy == "voi-gate" and panel else None)
        shown, numbers = _session_row(study, panel, label, delta) if panel else (
            [DASH] * 8, dict.fromkeys(SESSION_KEYS))
        fields = {"policy": policy, "budget": None if budget is None else str(budget),
                  "threshold": c}
        rows += [[name, RUN, *shown], [name, PAPER, *_paper_session_row(lookup, "table7",
                                                                         fields)]]
        data.append({"row": name, **numbers, "max_reviews": _max_reviews(study, "table7", label)})
        item.text.append(f"{name}: requests {shown[0]}, A {shown[1]}, R {shown[2]}, ΔR "
                         f"{shown[4]}, vetoed {shown[6]} %")
    item.notes += _max_review_notes(lookup, "table7", data)
    item.tables.append(Table(["Policy", "Source", *SESSION_HEADER], rows))
    item.notes[:0] = _session_notes("table7", panel)
    item.data = {"rows": data}
    item.paper = lookup.used
    return item


def _max_review_notes(lookup: PaperLookup, key: str, data: Sequence[dict[str, Any]],
                      ) -> list[str]:
    """The most reviews one session made under each enforced gate, beside the caption's."""
    notes = []
    for row in data:
        variant = row.get("variant")
        if not variant or variant_of(variant).policy != "voi-gate":
            continue
        parsed = variant_of(variant)
        c, n = parsed.option("c"), parsed.budget
        paper = lookup.text(key, metric="max_reviews", policy="voi-gate",
                            budget=None if n is None else str(n),
                            threshold=f"{c:.2f}" if c is not None else None)
        where = f"N={row['N']} {row['row']}" if "N" in row else row["row"]
        notes.append(f"{where}: at most {row['max_reviews']} reviews in one session "
                     f"(paper: {paper}).")
    return notes


def _session_notes(grid: str, panel: Panel | None) -> list[str]:
    scope = (f"This run: backbones {', '.join(panel.backbones)}; "
             f"{len(panel.units)} parent tasks." if panel else "")
    return [(f"Rows of policies the grid `{grid}` does not vary come from grid `main` on the same "
             f"backbones and parent tasks (as the paper's do from its main evaluation). {scope}"),
            ("Means over domains within a backbone, then backbones (equal weights). Reward ×100; "
             "value = Ṽ = 10·V. Vetoed: reviews that blocked the draft over all reviews (within a "
             "domain); fixed message: sessions that sent the fixed fallback message. Reviews and "
             "vetoes are shown for policies that review drafts (\"–\": this policy makes no review "
             "calls)."), EQUAL_COST, A_TILDE]


def table8_item(study: Study) -> StudyItem:
    """Budgeted, Budgeted + VoI gate (grid ``table8``) and Budgeted + MGR at each N."""
    item, lookup = new_item("table8", "table8.md"), PaperLookup()
    panel = study.merged("table8", lambda v: variant_of(v).policy != "voi-gate")
    if panel is None:
        no_grid(item, "table8", "Table 8 (Budgeted + VoI gate and its comparison rows)")
    rows, data = [], []
    for n in BUDGETS:
        for name, policy in (("Budgeted", "budgeted"), ("Budgeted + VoI gate", "voi-gate"),
                             ("Budgeted + MGR", "budgeted+mgr")):
            label = find_label(panel, policy, n) if panel else None
            if panel is not None and label is None:
                item.missing.append(f"N={n} {name}: no episodes on the grid's backbones and tasks")
            delta = "reference" if policy == "budgeted" else (
                _matched(study, panel, label, item) if panel else None)
            shown, numbers = _session_row(study, panel, label, delta) if panel else (
                [DASH] * 8, dict.fromkeys(SESSION_KEYS))
            fields = {"policy": policy, "budget": str(n),
                      "threshold": "0.27" if policy == "voi-gate" else None}
            rows += [[str(n), name, RUN, *shown],
                     [str(n), name, PAPER, *_paper_session_row(lookup, "table8", fields)]]
            data.append({"N": n, "row": name, **numbers,
                         "max_reviews": _max_reviews(study, "table8", label)})
            item.text.append(f"N={n} {name}: A {shown[1]}, R {shown[2]}, Ṽ {shown[3]}, ΔR "
                             f"{shown[4]}")
    item.tables.append(Table(["N", "Policy", "Source", *SESSION_HEADER], rows))
    item.notes += _max_review_notes(lookup, "table8", data)
    item.notes[:0] = _session_notes("table8", panel)
    item.data = {"rows": data}
    item.paper = lookup.used
    return item




# ---- Table 17 ----------------------------------------------------------------------------------

WIDE = 9072  # the paper's wide evidence window (tokens)
T17_COMPARED = (("Budgeted + Review", "budgeted+review"), ("Budgeted + MGR", "budgeted+mgr"))
T17_ROWS = (("User-attention cost (%)", "dA_pct"), ("Question value", "dV_tilde"),
            ("Reward", "dR"))


def wide_label(panel: Panel, n: int) -> str | None:
    """Budgeted + Review at N with a widened evidence window (the paper's 9,072 tokens first)."""
    labels = sorted(v for _, v in panel.cells
                    if (x := variant_of(v)).policy == "budgeted+review" and x.budget == n
                    and x.option("evidence") is not None)
    preferred = [v for v in labels if variant_of(v).option("evidence") == WIDE]
    return (preferred or labels or [None])[0]


def _wide_minus(study: Study, panel: Panel, pairs: Sequence[tuple[Any, Any]],
                notes: list[str]) -> dict[str, BootstrapResult | None]:
    """Wide window minus a compared policy over (backbone, N) pairs: relative cost change (%),
    value (Ṽ points) and reward at equal cost (points: each side's ΔR against its own
    cost-matched Budgeted mixture)."""
    from prour.eval.attention.study_items import mean_of
    from prour.eval.attention.study_panel import matched_mean

    if not pairs:
        return dict.fromkeys(("dA_pct", "dV_tilde", "dR"))
    wide, other = [p[0] for p in pairs], [p[1] for p in pairs]
    same = panel.restrict([*wide, *other])
    a_w, a_o = mean_of(same, "A", wide), mean_of(same, "A", other)
    v_w, v_o = mean_of(same, "V", wide), mean_of(same, "V", other)
    out = {"dA_pct": study.interval(same, lambda c: 100.0 * (a_w(c) / a_o(c) - 1.0)),
           "dV_tilde": study.interval(same, lambda c: 10.0 * (v_w(c) - v_o(c)))}
    matched, found, why = equal_cost(study, panel, [*wide, *other])
    notes += why
    by_target = {m.target: m for m in found}
    kept = [(by_target[w], by_target[o]) for w, o in pairs if w in by_target and o in by_target]
    r_w = matched_mean(matched, [k[0] for k in kept], "R")
    r_o = matched_mean(matched, [k[1] for k in kept], "R")
    out["dR"] = study.interval(matched, lambda c: 100.0 * (r_w(c) - r_o(c))) if kept else None
    return out


def table17_item(study: Study) -> StudyItem:
    """Wide-window Budgeted + Review minus Budgeted + Review and minus Budgeted + MGR."""
    item, lookup = new_item("table17", "table17.md"), PaperLookup()
    own = {variant_label(line) for line in study.data.grids.get("table17") or []}
    panel = study.merged("table17", lambda v: v not in own)
    if panel is None:
        no_grid(item, "table17", "Table 17 (the wide evidence window)")
    columns, data = [], {}
    for name, policy in T17_COMPARED:
        pairs = []
        for n in BUDGETS if panel else ():
            wide = wide_label(panel, n)
            other = find_label(panel, policy, n, evidence=None)
            if wide is None or other is None:
                item.missing.append(f"N={n}: no {'wide-window review' if wide is None else name}"
                                    " episodes on the grid's backbones and tasks")
                continue
            pairs += [((b, wide), (b, other)) for b in panel.backbones
                      if panel.has((b, wide)) and panel.has((b, other))]
        why: list[str] = []
        results = _wide_minus(study, panel, pairs, why) if panel else dict.fromkeys(
            ("dA_pct", "dV_tilde", "dR"))
        item.notes += [f"wide minus {name}: {n}" for n in why]
        paper = {m: lookup.text("table17", metric=m, policy="budgeted+review", budget="1-3",
                                column=f"Wide window minus {name}") for _, m in T17_ROWS}
        columns.append((name, results, paper))
        data[policy] = {"pairs": [[list(w), list(o)] for w, o in pairs],
                        **{m: ci_data(r) for m, r in results.items()}, "paper": paper}
        shown = {m: ci_cell(r, 1, True, True) for m, r in results.items()}
        item.text.append(f"wide minus {name}: cost {shown['dA_pct']} % (paper "
                         f"{paper['dA_pct']}), value {shown['dV_tilde']} (paper "
                         f"{paper['dV_tilde']}), reward {shown['dR']} (paper {paper['dR']})")
    rows = [[label, *(cell for _, results, paper in columns
                      for cell in (ci_cell(results[m], 1, True, True), paper[m]))]
            for label, m in T17_ROWS]
    header = ["Wide window minus", *(f"{name} ({src})" for name, _, _ in columns
                                     for src in (RUN, PAPER))]
    item.tables.append(Table(header, rows))
    item.notes[:0] = _table17_notes(study, panel, lookup)
    item.data = data
    item.paper = lookup.used
    return item


def _table17_notes(study: Study, panel: Panel | None, lookup: PaperLookup) -> list[str]:
    blocks = []
    for name, policy in (("wide review", "wide"), ("Budgeted + MGR", "budgeted+mgr")):
        labels = ([wide_label(panel, n) for n in BUDGETS] if policy == "wide" else
                  [find_label(panel, policy, n) for n in BUDGETS]) if panel else []
        cells = cells_of(panel, [v for v in labels if v]) if panel else []
        paper = lookup.text("table17", metric="vetoed", row="caption", budget="1-3",
                            policy="budgeted+review" if policy == "wide" else policy)
        blocks.append(f"{name} blocks {num(100 * point(panel, 'vetoed', cells), 0)} % of its "
                      f"reviews (paper {paper} %)" if panel else f"{name}: – (paper {paper} %)")
    return [("Means over N=1-3 within a backbone, domains with equal weights, then backbones. "
             "Cost: relative change of the mean cost (%); value: Ṽ points; reward: each side's "
             "ΔR against its own cost-matched Budgeted mixture (grid `main`, same backbones and "
             "parent tasks), wide minus compared, in points. 95% paired parent-task bootstrap; "
             "* where the interval excludes zero."),
            "Blocks (vetoes over reviews): " + "; ".join(blocks) + ". The tokens a review reads "
            "(the paper: 12.1k wide, 8.8k MGR) are not recorded in result lines.", EQUAL_COST]


# ---- Table 25 ----------------------------------------------------------------------------------

T25_ROWS = (("Unrestricted", "unrestricted"), ("Budgeted (N=1)", "budgeted@1"),
            ("Budgeted + MGR (N=1)", "budgeted+mgr@1"), ("Budgeted (N=2)", "budgeted@2"))
T25_METRICS = (("R", "R"), ("A", "A"), ("U", "U_bar"), ("V", "V"))


def _regime(study: Study, simulator: str) -> str | None:
    name = study.data.simulators.get(simulator)
    return name.lower() if name and name.lower() in ("original", "guarded") else None


def table25_item(study: Study) -> StudyItem:
    """Per simulator regime and backbone: R, A, Ū = mean of R − λ·A, and V of four variants,
    equal means over the domains (the paper: retail, airline, telecom)."""
    from prour.eval.attention.study_paper import paper_fields

    item, lookup = new_item("table25", "table25.md"), PaperLookup()
    groups = study.simulator_lines("table25")
    if not groups:
        no_grid(item, "table25", "Table 25 (the two simulator regimes)")
    rows, data = [], []
    for simulator, lines in groups.items():
        panel, regime = study.panel_of(lines), _regime(study, simulator)
        where = f"{simulator} (paper: {regime or 'no such regime'})"
        if set(panel.domains) != {"retail", "airline", "telecom"}:
            item.notes.append(f"Simulator {simulator}: domains {', '.join(panel.domains)} (the "
                              "paper averages retail, airline and telecom)")
        for backbone in panel.backbones:
            model = study.model(backbone)
            for name, label in T25_ROWS:
                cells = [(backbone, label)] if panel.has((backbone, label)) else []
                if not cells:
                    item.missing.append(f"{where}, {backbone}: no {label} episodes")
                values = {m: point(panel, m, cells) for m, _ in T25_METRICS}
                paper = [lookup.text("table25", model=model, regime=regime, metric=pm,
                                     **paper_fields(label)) if model and regime else DASH
                         for _, pm in T25_METRICS]
                source = (f"{PAPER} ({model})" if any(p != DASH for p in paper) else
                          f"{PAPER} (none: its Table 25 ran GPT-6-Astra only)")
                rows += [[backbone, where, name, RUN, *(num(values[m], 3) for m, _ in T25_METRICS)],
                         [backbone, where, name, source, *paper]]
                data.append({"simulator": simulator, "regime": regime, "backbone": backbone,
                             "variant": label, **{pm: value_data(values[m])
                                                  for m, pm in T25_METRICS}, "paper": paper})
                item.text.append(f"{where} {backbone} {name}: R {num(values['R'], 3)}, "
                                 f"A {num(values['A'], 3)}, Ū {num(values['U'], 3)}")
    item.tables.append(Table(["Backbone", "Simulator", "Policy", "Source", "R", "A", "Ū", "V"],
                             rows))
    item.notes[:0] = _table25_notes(study, lookup)
    item.data = {"rows": data, "lam": study.data.lam}
    item.paper = lookup.used
    return item


def _table25_notes(study: Study, lookup: PaperLookup) -> list[str]:
    """How the columns are computed, and the λ the paper's own Ū implies."""
    from prour.eval.attention.paper_values import published

    implied = []
    for entry in published("table25", metric="U_bar"):
        same = {"policy": entry.policy, "budget": entry.budget, "regime": entry.regime}
        r = lookup.get("table25", metric="R", model=entry.model, threshold=None, **same)
        a = lookup.get("table25", metric="A", model=entry.model, threshold=None, **same)
        if r is not None and a is not None and a.value > 0:
            implied.append((r.value - entry.value) / a.value)
    span = (f"{min(implied):.3f}-{max(implied):.3f}" if implied else "–")
    return [(f"R the mean reward (0-1); A the mean cost ({study.data.accounting} accounting, "
             f"prour's scale; the paper: A_full); Ū the mean of R − λ·A over the judged sessions "
             f"with λ = {study.data.lam:g}; V the mean judged value (0-10). Each is a mean within "
             "a domain, then the equal mean over the domains; simulator regimes map to the "
             "paper's through the study's simulator names."),
            (f"The paper's Ū is not R − 0.03·A of its printed A: its rows give (R − Ū)/A = "
             f"{span}, so its Ū prices attention about nine times higher on that scale; the run's "
             "Ū is beside it as computed with the study's λ, not rescaled.")]
