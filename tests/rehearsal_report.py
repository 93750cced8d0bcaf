"""What both rehearsal tests (``prour run`` and the Slurm chain) check of a finished eval: every
method x domain x seed has one result line, and the report's Pass@1 table has one row per method
in ``eval.methods`` order."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

# `prour tiny-model <TINY_MODEL_ARGS>`: the rehearsals' model, as their recipes' headers build it,
# with the warm-start length of the session's model (tests/conftest.py WARM_START; the headers
# use the demo's 300); tests/conftest.py `rehearsal_model` builds it once a session with these
TINY_MODEL_ARGS = ("tiny-model", "./runs/tiny-model", "--steps", "60")


def every_method_reported(run_dir: Path, recipe: Any) -> list[str]:
    """Assert the results and the report cover the recipe's eval plan; return the table's rows."""
    results = [json.loads(x) for x in (run_dir / "eval" / "results.jsonl").read_text().split("\n")
               if x.strip()]
    planned = {(m, d, s) for m in recipe.eval.methods for d in recipe.eval.domains
               for s in recipe.eval.seeds}
    assert sorted((r["method"], r["domain"], r["seed"]) for r in results) == sorted(planned)
    report = (run_dir / "eval" / "report" / "report.md").read_text()
    table = report.split("## Pass@1 (%) and interaction cost")[1].split("\n## ")[0]
    rows = [line.split("|")[1].strip() for line in table.splitlines()
            if line.startswith("| ") and not line.startswith(("| System", "| ---"))]
    assert [row.split(" (")[0] for row in rows] == recipe.eval.methods  # a row per method
    questions_written_by_their_own_models(results, recipe)
    assert "## Question writers" in report
    return rows


def questions_written_by_their_own_models(results: list[dict[str, Any]], recipe: Any) -> None:
    """ig-clarifier's questions come from its own exported checkpoint (the chain's
    export-ig-clarifier), prour's methods' from prour's exported step, ask-before-plan's from the
    agent backbone: as every episode's result line records it."""
    from prour.eval.methods import check_method
    from prour.stages import ig_recipe
    from prour.step import exported as _exported

    prour_step = str(_exported(recipe).resolve())
    ig_step = str(_exported(ig_recipe(recipe)).resolve())
    assert ig_step != prour_step
    wanted = {"generator": prour_step, "ig_clarifier": ig_step,
              "agent": recipe.models["agent"].model}
    for line in results:
        writer = check_method(line["method"]).writer
        assert line["question_writer"] == wanted.get(writer), (line["method"], line)


# ---- the paper's items (prour report's REPORT/paper/), each from the run's own files ----------

PAPER_FILES = ("table1.md", "table5.md", "table6.md", "summary.txt", "index.html",
               *(f"{name}.{ext}" for name in ("figure2_sources", "figure4_training",
                                              "figure5_budget", "figure6_uncertainty",
                                              "figure7_router_f1", "figure8_frequency")
                 for ext in ("png", "json")))
ROUTES = ("act", "clarify", "verify")


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _macro_f1(pairs: list[tuple[str, str]]) -> float:
    """Macro-F1 (%) over the classes some label holds, from (label, predicted) pairs."""
    scores = []
    for name in ROUTES:
        if not any(label == name for label, _ in pairs):
            continue
        tp = sum(label == name == got for label, got in pairs)
        fp = sum(got == name != label for label, got in pairs)
        fn = sum(label == name != got for label, got in pairs)
        scores.append(2 * tp / (2 * tp + fp + fn))
    return 100 * sum(scores) / len(scores)


def _routed(record: dict[str, Any], tau: tuple[float, float], empty: str) -> str:
    if record.get("au") is None:
        return empty
    return "clarify" if record["au"] >= tau[0] else "verify" if record["eu"] >= tau[1] else "act"


def _label(line: dict[str, Any]) -> str | None:
    return line["corrected"] or line["label"]


def _pass_at_1(lines: list[dict[str, Any]]) -> float:
    """Pass@1 (%) as Table 1 averages it: each domain's mean success, then the domains' mean."""
    domains = sorted({x["domain"] for x in lines})
    means = [sum(x["success"] for x in lines if x["domain"] == d)
             / sum(x["domain"] == d for x in lines) for d in domains]
    return 100 * sum(means) / len(means)


def paper_items_from_the_run(run_dir: Path, recipe: Any) -> dict[str, Any]:
    """Assert REPORT/paper/ holds Table 1, Table 6 and Figures 4-8, each drawn from this run's
    files (recomputed here from results, calibration files, metrics and the sweep folders);
    return the sidecars by figure."""
    paper = run_dir / "eval" / "report" / "paper"
    for name in PAPER_FILES:
        assert (paper / name).is_file() and (paper / name).stat().st_size > 0, name
    sidecars = {p.stem.split("_")[0]: json.loads(p.read_text()) for p in paper.glob("*.json")}
    results = _jsonl(run_dir / "eval" / "results.jsonl")

    # Table 1: a "this run" row per eval method whose average Pass@1 is the results' own
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in (paper / "table1.md").read_text().splitlines()
            if line.startswith("| ") and "| this run |" in line]
    assert [r[0].split(" (")[0] for r in rows] == recipe.eval.methods
    header = next(line for line in (paper / "table1.md").read_text().splitlines()
                  if line.startswith("| System"))
    average = [c.strip() for c in header.strip("|").split("|")].index("Average")
    for row, method in zip(rows, recipe.eval.methods):
        mine = [x for x in results if x["method"] == method]
        assert float(row[average].split()[0]) == round(_pass_at_1(mine), 2), (method, row)

    # Table 6 and Figure 7: dev and held-out macro-F1 recomputed from the reviewed labels, the
    # cached AU/EU and the stored thresholds (empty decisions: router.empty_route)
    calibration = run_dir / "calibration"
    from prour.router.thresholds import decomposer_model_id

    stored = json.loads((calibration / "thresholds.json").read_text())
    pair = stored[decomposer_model_id(recipe.models["decomposer"])]  # the recipe's decomposer
    tau = (pair["tau_au"], pair["tau_eu"])
    empty = recipe.router.empty_route
    kept = set(json.loads((calibration / "dev_mix.json").read_text())["kept"])
    for split, where in (("dev", "table6"), ("test", "figure7")):
        labels = {x["state_id"]: _label(x) for x in _jsonl(calibration / f"labels_{split}.jsonl")}
        measured = {x["state_id"]: x for x in _jsonl(calibration / f"uncertainty_{split}.jsonl")}
        ids = [s for s, label in labels.items() if label and (split == "test" or s in kept)]
        assert ids, f"no reviewed {split} label: the test's review must give some"
        f1 = _macro_f1([(labels[s], _routed(measured[s], tau, empty)) for s in ids])
        if where == "table6":
            line = next(x for x in (paper / "table6.md").read_text().splitlines()
                        if "| this run (dev) |" in x)
            cells = [c.strip() for c in line.strip("|").split("|")]
            assert int(cells[2]) == len(ids) and float(cells[6]) == round(f1 / 100, 3), cells
        else:
            drawn = sidecars["figure7"]["series"]["macro_f1"]["this run"]
            assert drawn["x"][0] == "decomposer" and round(drawn["y"][0], 2) == round(f1, 2)

    # Figure 4: the training metrics train logged, step by step
    metrics = _jsonl(run_dir / "checkpoints" / "metrics.jsonl")
    drawn = [s for panel in ("belief", "reward")
             for s in sidecars["figure4"]["series"][panel].values() if s["source"] == "run"]
    assert drawn
    for series in drawn:  # every step that logged the metric, with its logged value
        logged = [(m["step"], m[series["key"]]) for m in metrics if m[series["key"]] is not None]
        assert list(zip(series["x"], series["y"])) == logged, series["key"]

    # Figures 5 and 8: each point the Pass@1 of its own folder's episodes at that router value
    for figure, name, folder in (("figure5", "budget", "eval-budget"),
                                 ("figure8", "every_n", "eval-every-n")):
        series = sidecars[figure]["series"]["pass_at_1"]
        for method in recipe.eval.tradeoff.methods:
            points = dict(zip(series[method]["x"], zip(series[method]["y"],
                                                       series[method]["folder"])))
            for value in getattr(recipe.eval.tradeoff, name):
                swept = [x for x in _jsonl(run_dir / folder / "results.jsonl")
                         if x["method"] == method
                         and x["sweep"] == {f"router.{name}": value}]
                y, came_from = points[value]
                assert came_from == folder and round(y, 2) == round(_pass_at_1(swept), 2)
            main = "unlimited" if name == "budget" else 1
            mine = [x for x in results if x["method"] == method]
            assert points[main][1] == "eval" and \
                round(points[main][0], 2) == round(_pass_at_1(mine), 2)

    # Figure 6: the baselines' AU/EU come from the posthoc step, one line per decision of each
    # of their episodes; what the tiny decomposer could not measure is said, never drawn as 0
    from prour.eval.harness import result_key
    from prour.eval.posthoc import MAX_STEPS, needs_posthoc

    posthoc = _jsonl(run_dir / "eval" / "posthoc_uncertainty.jsonl")
    baselines = [result_key(x["key"]) for x in results if needs_posthoc(x["method"])]
    assert {x["key"] for x in posthoc} == set(baselines)
    assert all(0 < sum(p["key"] == key for p in posthoc) <= MAX_STEPS for key in baselines)
    figure6 = sidecars["figure6"]
    for panel in ("total", "au", "eu"):
        for label, series in figure6["series"][panel].items():
            if series["source"] != "run":
                continue
            if not label.endswith("(post-hoc)"):
                continue  # recorded by a decomposer-routed method (its own decisions)
            method = label.split(" (")[0]
            steps = {p["step"] + 1 for p in posthoc if p["method"] == method
                     and p[panel] is not None}
            assert set(series["x"]) == steps, label  # a point where a measurement is
    if not any(p["total"] is not None for p in posthoc):
        missing = figure6["series"]["missing"]
        assert any("no AU/EU to draw" in m for m in missing), missing
    return sidecars


# ---- Table 5 and Figure 2: the taxonomy's reviewed labels, counted again -----------------------

WORLD = ("profile", "tools", "policy", "computation", "history")
USER = ("intent", "preference")


def _taxonomy_events(lines: list[dict[str, Any]]) -> tuple[dict[str, int], int, int]:
    """(events per source, steps without uncertainty, steps without a usable label), each
    decision step once: a reviewer's `corrected` (a source or "none") wins over the annotator's
    validated annotation."""
    events = {source: 0 for source in (*WORLD, *USER)}
    without = unusable = 0
    for line in {x["decision_id"]: x for x in lines}.values():
        annotation = line["annotation"] or {}
        source = line["corrected"] or (annotation.get("source") or "none" if annotation else None)
        if source is None:
            unusable += 1
        elif source == "none":
            without += 1
        else:
            events[source] += 1
    return events, without, unusable


def _markdown_rows(path: Path) -> tuple[list[str], dict[str, list[str]]]:
    """The header and the rows (by first cell) of a markdown file's first table."""
    table = [line for line in path.read_text().split("\n\n## ")[0].splitlines()
             if line.startswith("| ")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table]
    return cells[0], {row[0]: row for row in cells[2:]}


def taxonomy_items_from_the_run(run_dir: Path) -> None:
    """Assert Table 5 and Figure 2 hold the events per source and the sides' shares of
    ``<run_dir>/taxonomy/labels.jsonl``, approved as they are, beside the paper's numbers."""
    paper = run_dir / "eval" / "report" / "paper"
    labels = run_dir / "taxonomy" / "labels.jsonl"
    approval = json.loads((run_dir / "taxonomy" / "labels.approved.json").read_text())
    assert approval["sha256"] == hashlib.sha256(labels.read_bytes()).hexdigest()
    events, without, unusable = _taxonomy_events(_jsonl(labels))
    world, user = sum(events[s] for s in WORLD), sum(events[s] for s in USER)
    assert world and user, "the review must label both sides"
    header, rows = _markdown_rows(paper / "table5.md")
    at = header.index("Events")
    for source, count in events.items():
        assert rows[source][at] == str(count), (source, rows[source])
    share = header.index("Share of events (%)")
    for side, count in (("world", world), ("user", user)):
        assert rows[f"{side} side"][at] == str(count)
        assert rows[f"{side} side"][share] == f"{100 * count / (world + user):.1f}"
    assert rows["world side"][-1] == "16,947 events (89.1 %)"
    assert rows["user side"][-1] == "2,075 events (10.9 %)"
    assert rows["all events"][at] == str(world + user)
    assert rows["all events"][-1] == "19,022 events"
    assert rows["no uncertainty"][at] == str(without)
    assert ("no usable label" in rows) == bool(unusable)
    text = (paper / "table5.md").read_text()
    assert "not the paper's nine cases" in text and "- missing:" not in text
    figure = json.loads((paper / "figure2_sources.json").read_text())["series"]
    drawn = figure["share"]["this run"]
    assert drawn["x"] == ["world", "user"] and drawn["events"] == [world, user]
    assert [round(y, 6) for y in drawn["y"]] == [round(100 * world / (world + user), 6),
                                                 round(100 * user / (world + user), 6)]
    assert figure["share"]["paper"]["y"] == [89.1, 10.9]
    assert dict(zip(figure["sources"]["this run"]["x"], figure["sources"]["this run"]["y"])) \
        == events
    assert figure["labels"]["approved"] is True and figure["missing"] == []
    page = (paper / "index.html").read_text()
    assert '<section id="table5">' in page and '<section id="figure2">' in page


# ---- Tables 2, 3, 4 and 7: the study's result lines, selected and averaged again --------------


def _this_run_rows(path: Path) -> dict[str, list[str]]:
    """Label -> cells of each "this run" row of a markdown table, and the Average column."""
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in path.read_text().splitlines() if line.startswith("| ")]
    return {row[0]: row for row in rows[2:] if row[1] == "this run"}


def _average_cell(path: Path) -> int:
    header = next(line for line in path.read_text().splitlines() if line.startswith("| "))
    return [c.strip() for c in header.strip("|").split("|")].index("Average")


def study_items_from_the_run(run_dir: Path, recipe: Any) -> None:
    """Assert Tables 2, 3, 4 and 7 hold, per row, the Pass@1 of the study's own result lines
    (``<run_dir>/study/results.jsonl``, the last line of each episode) that the row's grid cell
    names: its method, its axis values, the grid's domains and task set."""
    paper = run_dir / "eval" / "report" / "paper"
    latest = {json.dumps(x["key"]): x for x in _jsonl(run_dir / "study" / "results.jsonl")}
    lines = list(latest.values())
    study = recipe.study
    name = {axis: {value: spec.paper or value for value, spec in values.items()}
            for axis, values in study.axes.items()}

    def picked(grid: str, method: str, **axes: str) -> list[dict[str, Any]]:
        spec = study.grids[grid]
        split = spec.split or recipe.eval.split
        domains = spec.domains or recipe.eval.domains
        return [x for x in lines if x["method"] == method and x["domain"] in domains
                and x.get("split") == split
                and all(x["axes"].get(a) in values for a, values in spec.axes.items())
                and all(x["axes"].get(a) == v for a, v in axes.items())]

    expected: dict[str, dict[str, list[dict[str, Any]]]] = {}
    generators = study.grids["table2"].axes.get("generator", list(study.axes["generator"]))
    expected["table2"] = {name["generator"][g]: picked("table2", "prour", generator=g)
                          for g in generators}
    for table, base_grid, base_label in (("table3", "table3-base", "none (base agent)"),
                                         ("table7", "table7-base",
                                          "none (base agent, no thresholds)")):
        axes = study.grids[table].axes
        rows: dict[str, list[dict[str, Any]]] = {}
        for agent in axes["agent"]:
            base_axes = {"agent": agent} if table == "table3" else {}
            rows[f"{name['agent'][agent]} / {base_label}"] = picked(base_grid, "base",
                                                                    **base_axes)
            for generator in axes["generator"]:
                rows[f"{name['agent'][agent]} / {name['generator'][generator]}"] = picked(
                    table, "prour", agent=agent, generator=generator)
        expected[table] = rows
    expected["table4"] = {m: picked("table4", m) for m in study.grids["table4"].methods}
    for table, rows in expected.items():
        path = paper / f"{table}.md"
        assert path.is_file(), table
        shown, at = _this_run_rows(path), _average_cell(path)
        assert set(shown) == set(rows), (table, sorted(shown), sorted(rows))
        for label, mine in rows.items():
            assert mine, (table, label, "the rehearsal's study ran no episode of this row")
            cell = shown[label][at]
            assert float(cell.split()[0]) == round(_pass_at_1(mine), 2), (table, label, cell)
    assert "τ³-bench" in (paper / "table4.md").read_text()
    page = (paper / "index.html").read_text()
    for table in expected:
        assert f'<section id="{table}">' in page, table
