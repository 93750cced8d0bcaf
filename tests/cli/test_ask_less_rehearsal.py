"""The Ask-Less study from one command: recipes/ask-less-rehearsal.yaml (ask-less.yaml on the tiny
model: a vLLM-served backbone and an in-process one, the dev split cut to one task per domain,
one trial, every policy) run by the installed ``prour`` from an empty run folder, with no file
made by hand: ``prour tiny-model`` builds the model, then the study's steps run (the episodes of
every grid, the judge pass, the second judge, the report). Every table and figure of the report
is a file, and at least one number of each is recomputed here from the run's own
``results.jsonl`` (tests/study_numbers.py) and compared with report.json, its markdown and its
plots' sidecars. The tiny model solves nothing and its judge writes little valid JSON: where it
leaves a number undefined (no judged request) the report must say it is missing, never print a
number. Run again, every step is done and skipped.

The CI test runs the rehearsal cut with ``--set`` to what every item needs (fewer variants,
fewer turns, one strict-JSON attempt); the whole rehearsal is the ``full`` test. The same checks
run on result lines written here whose agent asks (judged and unjudged requests), so that each
comparison meets numbers and missing values. The dry run of recipes/ask-less.yaml lists the
steps, the grids, the servers of each backbone and an estimate.

Needs the vLLM venv (PROUR_REQUIRE_VLLM=1 makes a missing one fail instead of skip).
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from installed_prour import prour_argv
from plot_check import read_plot
from rehearsal_report import TINY_MODEL_ARGS
from study_numbers import agrees, averaged, cell, close, efficiency, mean, nan_mean, nested

REPO = Path(__file__).resolve().parents[2]
REHEARSAL = REPO / "recipes" / "ask-less-rehearsal.yaml"
STUDY = REPO / "recipes" / "ask-less.yaml"
STUDY_STEPS = ("study", "judge", "second-judge", "study-report")
BUDGETS = (1, 2, 3)
# ask-less.yaml's grids on the test split (retail 91, airline 40, telecom 91 tasks: 222), as
# docs/ask-less.md counts them: main 8 backbones x 16 variants x 222 x 3 trials, ...; the study
# runs table25's 480 original-simulator episodes once (they are main's): 95,052 in all
GRID_EPISODES = {"main": "85,248", "table7": "1,332", "table8": "5,994", "table17": "1,998",
                 "table25": "960"}

# The CI cut: every item keeps what it needs (No-ask, Unrestricted, Frugal, the VoI gate as run,
# Budgeted at N = 1 and 2 (a path, and a curve per domain), the three self-review policies at
# N = 1, on both backbones; the smallest variant of the other grids, on the served backbone;
# Table 25 under both simulators), two of the three domains (Figure 5 still compares domains), one
# agent turn per episode and one strict-JSON attempt: 46 episodes where the whole rehearsal runs
# 156.
CI_CUT = (
    "eval.domains=[retail, airline]",
    "env.max_steps=2",
    "eval.attention.judge_attempts=1",
    "eval.attention.classifier_attempts=1",
    "eval.attention.review_attempts=1",
    ("study.grids.main.policies=[no-ask, unrestricted, frugal, voi-gate-as-run(c=0.27), "
     "budgeted@1, budgeted@2, budgeted+review@1, budgeted+review+summary@1, budgeted+mgr@1]"),
    "study.grids.table7.policies=[voi-gate(c=0.5)]",
    "study.grids.table8.policies=[voi-gate@1(c=0.27)]",
    "study.grids.table17.policies=[budgeted+review@1(evidence=9072)]",
    "study.grids.table7.axes.backbone=[tiny-vllm]",  # the rows these tables borrow from main
    "study.grids.table8.axes.backbone=[tiny-vllm]",  # must then leave tiny-hf's out
    "study.grids.table17.axes.backbone=[tiny-vllm]",
    "study.grids.table25.policies=[unrestricted, budgeted@1]",
)


def prour(cwd: Path, vllm_python: Path, *args: str, timeout: float = 600,
          ) -> subprocess.CompletedProcess[str]:
    """``prour <args>`` through the installed console script, as a user runs it."""
    env = {**os.environ, "PROUR_VLLM_PYTHON": str(vllm_python)}
    return subprocess.run(prour_argv(*args), cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def step_states(output: str) -> dict[str, str]:
    """Step -> what the last ``== <step>: ...`` line about it says."""
    return dict(re.findall(r"^== (\S+): (.*)$", output, re.MULTILINE))


# ---- the rehearsal, shared by the CI test and the full one ------------------------------------


def rehearse(tmp_path: Path, vllm_python: Path, place_model: Callable[[Path], None],
             cut: tuple[str, ...], timeout: float) -> None:
    """Build the tiny model (``prour tiny-model`` reuses the session's build that
    ``place_model`` copies in), run the rehearsal (with the ``--set`` items ``cut``; ``timeout``:
    seconds the run may take) from an empty run folder, check the report against the run's
    results, run again: all skipped."""
    from prour.recipes import load_recipe

    place_model(tmp_path)
    built = prour(tmp_path, vllm_python, *TINY_MODEL_ARGS, timeout=900)
    assert built.returncode == 0, built.stdout + built.stderr
    run_dir = tmp_path / "runs" / "ask-less-rehearsal"
    assert not run_dir.exists()  # nothing made beforehand
    sets = [part for item in cut for part in ("--set", item)]

    first = prour(tmp_path, vllm_python, "run", "--recipe", str(REHEARSAL), *sets,
                  timeout=timeout)
    shown = first.stdout + first.stderr
    assert first.returncode == 0, shown[-6000:]
    states = step_states(first.stdout)
    for name in STUDY_STEPS:  # the judge step has nothing to do where no request was delivered
        ran = ("done in", "skipped (done") if name == "judge" else ("done in",)
        assert states.get(name, "").startswith(ran), (name, shown[-6000:])
    recipe = load_recipe(REHEARSAL, [*cut, f"run_dir={run_dir}"])
    report_is_made_from_the_run(recipe)

    again = prour(tmp_path, vllm_python, "run", "--recipe", str(REHEARSAL), *sets)
    assert again.returncode == 0, again.stdout + again.stderr
    states = step_states(again.stdout)
    assert set(STUDY_STEPS) <= set(states), again.stdout
    for name, state in states.items():  # the study's steps done, the others not the study's
        wanted = "skipped (done" if name in STUDY_STEPS else "skipped ("
        assert state.startswith(wanted), (name, state)
    assert "every step asked for is done" in again.stdout


# ---- the report against the run's own result lines --------------------------------------------


def policy_of(label: str) -> tuple[str, int | None]:
    """(policy, budget) of a variant label (``budgeted+mgr@2`` -> ("budgeted+mgr", 2))."""
    head = label.split("(")[0]
    policy, _, budget = head.partition("@")
    return policy, int(budget) if budget else None


def labels(lines: list[dict], policy: str, budget: int | None = None) -> list[str]:
    """The variant labels of the lines that are ``policy`` at ``budget``, in label order."""
    return sorted({x["variant"] for x in lines if policy_of(x["variant"]) == (policy, budget)})


def backbones(lines: list[dict]) -> list[str]:
    return list(dict.fromkeys(x["axes"]["backbone"] for x in lines))


def md_rows(path: Path) -> list[list[str]]:
    """The cells of every markdown table row of a file (header and rule rows included)."""
    return [[c.strip() for c in re.split(r"(?<!\\)\|", row.strip())[1:-1]]
            for row in path.read_text().splitlines() if row.startswith("|")]


def shown(value: float | None, digits: int) -> str:
    """A number as the report prints it, "–" where it is missing."""
    return "–" if value is None else f"{value:.{digits}f}"


def same(reported: Any, expected: float, what: Any) -> None:
    assert agrees(reported, expected), (what, reported, expected)


def report_is_made_from_the_run(recipe: Any) -> None:
    """Every item's files exist, and numbers of each item equal those recomputed here from the
    study folder's latest result lines, grid by grid."""
    from prour.eval.attention.study_report import ITEMS
    from prour.eval.harness import load_result_lines
    from prour.eval.study import episode_key, grid_lines, grid_plan, study_dir

    folder = study_dir(recipe)
    out = folder / "report" / "ask-less"
    report = json.loads((out / "report.json").read_text())
    items = report["items"]
    assert list(items) == list(ITEMS)
    for key in ITEMS:
        assert items[key]["files"], key
        for name in items[key]["files"]:
            assert (out / name).is_file() and (out / name).stat().st_size > 0, (key, name)
    for name in ("summary.txt", "index.html"):
        assert (out / name).stat().st_size > 0, name

    # at least one result line per planned episode of every grid (cells x methods x variants x
    # domains x tasks x seeds), and the report read them all
    results = load_result_lines(folder / "results.jsonl")
    grids = grid_lines(recipe)
    header = report["header"]
    for grid, spec in recipe.study.grids.items():
        cells = math.prod(len(spec.axes.get(axis, values)) for axis, values in
                          recipe.study.axes.items())
        tasks = spec.max_tasks or recipe.eval.max_tasks
        count = cells * len(spec.methods) * len(spec.policies) * len(
            spec.domains or recipe.eval.domains) * tasks * len(spec.seeds or recipe.eval.seeds)
        planned = [episode_key(p, c) for c, ps in grid_plan(recipe, grid).items() for p in ps]
        assert len(set(planned)) == count and all(k in results for k in planned), grid
        assert len(grids[grid]) == count == report["settings"]["grids"][grid], grid
        assert any(x.startswith(f"Grid {grid}: ") and x.endswith(
            f"; {count} of {count} planned episodes have a result") for x in header), grid
    # the judge's unscored requests, each episode once however many grids share it
    asked = [q for line in results.values() for q in line["attention"]["requests"]]
    unscored = sum(q["value"] is None or q["reading_effort"] is None for q in asked)
    assert any(x.startswith("Judge: models.judge ") and f"; {unscored} of {len(asked)} delivered "
               "request(s) carry no judge score" in x for x in header), header

    attention = recipe.eval.attention
    assert attention.accounting == "full" and attention.weights.model_dump() == {
        "message": 1, "atomic": 1, "effort": 1, "avoidability": 1}  # what study_numbers prices
    hand = Hand(list(recipe.eval.domains), attention.lam)
    main = grids["main"]
    assert set(backbones(main)) == set(recipe.study.axes["backbone"])
    hand.table3(main, items["table3"]["data"], out / "table3.md")
    hand.table5(main, items["table5"]["data"])
    hand.table13(main, items["table13"]["data"])
    hand.table14(main, items["table14"]["data"])
    hand.per_backbone(main, items["backbones"]["data"], out)
    hand.figure3_and_5(main, read_plot(out / "figure3_paths.png")["series"],
                       read_plot(out / "figure5_domains.png")["series"])
    hand.figure4(main, items["figure4"]["data"])
    hand.figure6(main, items["figure6"]["data"], read_plot(out / "figure6_efficiency.png"))
    hand.figure7(main, items["figure7"]["data"], read_plot(out / "figure7_lambda.png")["series"])
    hand.figure8(main, items["figure8"]["data"], read_plot(out / "figure8_frequency.png"))
    hand.table7_and_8(grids, items["table7"]["data"], items["table8"]["data"])
    hand.table17(grids, items["table17"]["data"])
    hand.table25(grids["table25"], items["table25"]["data"], recipe)
    table12_from_the_run(folder, results, items["table12"]["data"], recipe)


class Hand:
    """The report's numbers recomputed from the result lines of a study with these domains and
    this λ (each method: one item, asserting against report.json, markdown or sidecar)."""

    def __init__(self, domains: list[str], lam: float):
        self.domains, self.lam = domains, lam

    def cell(self, lines: list[dict], b: str, v: str, metric: str, d: str,
             accounting: str = "full") -> float:
        return cell(lines, b, v, metric, d, accounting, lam=self.lam)

    def averaged(self, lines: list[dict], b: str, v: str, metric: str) -> float:
        return averaged(lines, b, v, metric, domains=self.domains, lam=self.lam)

    def nested(self, lines: list[dict], variants: list[str], metric: str,
               accounting: str = "full", among: list[str] | None = None) -> float:
        return nested(lines, variants, metric, accounting, domains=self.domains,
                      backbones=among or backbones(lines), lam=self.lam)

    def saved(self, lines: list[dict], top: list[str], bottom: list[str],
              accounting: str, among: list[str] | None = None) -> float:
        """100·(1 − A_top / A_bottom); NaN where a side is absent or A_bottom is 0."""
        if not top or not bottom:
            return math.nan
        upper, lower = (self.nested(lines, v, "A", accounting, among) for v in (top, bottom))
        return 100 * (1 - upper / lower) if lower and not math.isnan(lower) else math.nan

    def table3(self, main: list[dict], data: dict, md: Path) -> None:
        """R of every policy (A and Ṽ where defined; "–" in the markdown where not)."""
        rows = {r["policy"]: r for r in data["rows"]}
        assert list(rows) == ["unrestricted", "frugal", "voi-gate-as-run", "budgeted",
                              "budgeted+mgr"]
        printed = {r[0]: r for r in md_rows(md)}
        for policy, row in rows.items():
            budgets = BUDGETS if policy.startswith("budgeted") else (None,)
            variants = [v for n in budgets for v in labels(main, policy, n)]
            assert variants and row["variants"] == variants, (policy, row["variants"])
            same(row["R"], 100 * self.nested(main, variants, "R"), (policy, "R"))
            same(row["A"], self.nested(main, variants, "A"), (policy, "A"))
            same(row["V_tilde"], 10 * self.nested(main, variants, "V"), (policy, "V"))
            name = {"unrestricted": "Unrestricted", "frugal": "Frugal prompt",
                    "voi-gate-as-run": "VoI gate (as run)", "budgeted": "Budgeted (mean N=1-3)",
                    "budgeted+mgr": "Budgeted + MGR (mean N=1-3)"}[policy]
            assert printed[name][1] == shown(row["R"], 1)
            assert printed[name][3] == shown(row["A"], 2)  # "–" where A is missing

    def table5(self, main: list[dict], data: dict) -> None:
        """Observed A and Ṽ of each self-review policy over the budgets run."""
        for row in data["rows"]:
            variants = [v for n in BUDGETS for v in labels(main, row["policy"], n)]
            assert row["variants"] == variants, row
            same(row["A"], self.nested(main, variants, "A"), (row["policy"], "A"))
            same(row["V_tilde"], 10 * self.nested(main, variants, "V"), (row["policy"], "V"))

    def table13(self, main: list[dict], data: dict) -> None:
        """Saved % under the `messages` accounting: Budgeted N against Unrestricted, MGR
        against Budgeted."""
        unrestricted = labels(main, "unrestricted")
        found = [e and e["estimate"] for e in data["messages"]["saved"]]
        for n, reported in zip(BUDGETS, found):
            same(reported, self.saved(main, labels(main, "budgeted", n), unrestricted,
                                      "messages"), ("table13", n))
        mgr = [v for n in BUDGETS for v in labels(main, "budgeted+mgr", n)]
        budgeted = [v for n in BUDGETS for v in labels(main, "budgeted", n)]
        same(found[3], self.saved(main, mgr, budgeted, "messages"), ("table13", "mgr"))

    def table14(self, main: list[dict], data: dict) -> None:
        """Delivered discretionary messages per session of each row's variant."""
        wanted = {"Unrestricted": labels(main, "unrestricted"), "Frugal prompt":
                  labels(main, "frugal"), "VoI gate (as run)": labels(main, "voi-gate-as-run"),
                  **{f"Budgeted, N={n}": labels(main, "budgeted", n) for n in BUDGETS}}
        assert [r["row"] for r in data["rows"]] == list(wanted)
        for row in data["rows"]:
            variant = (wanted[row["row"]] or [None])[0]
            assert row["variant"] == variant, row
            if variant is None:
                assert row["requests"] is None, row
                continue
            same(row["requests"]["estimate"], self.nested(main, [variant], "requests"), row)

    def per_backbone(self, main: list[dict], data: dict, out: Path) -> None:
        """R, A, U, V per domain of every variant; the markdown prints each ("–": missing)."""
        digits = {"R": 3, "A": 3, "U": 3, "V": 2}
        assert set(data) == set(backbones(main))
        for b, table in data.items():
            rows = table["rows"]
            assert set(rows) == {x["variant"] for x in main if x["axes"]["backbone"] == b}
            printed = [r for r in md_rows(out / table["file"]) if r[2:3] == ["this run"]]
            assert len(printed) == len(rows), b
            for (v, numbers), shown_row in zip(rows.items(), printed):
                for j, d in enumerate(self.domains):
                    for k, m in enumerate(digits):
                        value = numbers[d][m]
                        same(value, self.cell(main, b, v, m, d), (b, v, d, m))
                        assert shown_row[3 + 4 * j + k] == shown(value, digits[m]), (b, v, d, m)

    def figure3_and_5(self, main: list[dict], fig3: dict, fig5: dict) -> None:
        """The drawn paths' R: No-ask, Budgeted N, Unrestricted averaged over domains
        (Figure 3); each domain's Budgeted curve (Figure 5)."""
        path = ["no-ask", *(f"budgeted@{n}" for n in BUDGETS), "unrestricted"]
        for b in backbones(main):
            ran = [v for v in path if any(x["variant"] == v and x["axes"]["backbone"] == b
                                          for x in main)]
            assert fig3[b]["labels"] == ran and fig3[b]["source"] == "run"
            for v, y in zip(ran, fig3[b]["y"]):
                same(y, self.averaged(main, b, v, "R"), ("figure3", b, v))
            for d in self.domains:
                curve = fig5[d][b]
                assert curve["labels"] == [v for v in ran if v.startswith("budgeted@")]
                for v, y in zip(curve["labels"], curve["y"]):
                    same(y, self.cell(main, b, v, "R", d), ("figure5", d, b, v))

    def figure4(self, main: list[dict], data: dict) -> None:
        """MGR's cost saved and value change against Budgeted at the same N, per backbone and
        over all of them, where defined."""
        every = backbones(main)
        for who, entry in data["backbones"].items():
            among = every if who == "all backbones" else [who]
            pairs = [n for n in BUDGETS if all(labels([x for x in main if x["axes"]["backbone"]
                                                       in among], p, n)
                                               for p in ("budgeted", "budgeted+mgr"))]
            mgr, bud = [f"budgeted+mgr@{n}" for n in pairs], [f"budgeted@{n}" for n in pairs]
            same(entry["saved"] and entry["saved"]["estimate"],
                 self.saved(main, mgr, bud, "full", among), ("figure4", who, "saved"))
            value = 10 * (self.nested(main, mgr, "V", among=among)
                          - self.nested(main, bud, "V", among=among))
            same(entry["value"] and entry["value"]["estimate"], value, ("figure4", who))

    def figure6(self, main: list[dict], data: dict, sidecar: dict) -> None:
        """Asking efficiency over No-ask of Budgeted N=3 and Unrestricted, where defined."""
        for b in backbones(main):
            for v in ("budgeted@3", "unrestricted"):
                expected = efficiency(main, b, v, domains=self.domains)
                same(data["backbones"][b][v]["estimate"], expected, ("figure6", b, v))
                drawn = sidecar["series"][b].get(v)
                if math.isnan(expected):
                    assert drawn is None, (b, v, drawn)
                else:
                    assert close(drawn["estimate"], expected)

    def figure7(self, main: list[dict], data: dict, sidecar: dict) -> None:
        """U = R − λ·A at the study's λ of every policy whose A is defined (No-ask: A = 0)."""
        policies = ["no-ask", "unrestricted", "frugal", *labels(main, "voi-gate-as-run"),
                    *(f"budgeted@{n}" for n in BUDGETS), *(f"budgeted+mgr@{n}" for n in BUDGETS)]
        for b in backbones(main):
            lines = data["backbones"][b]["lines"]
            for v in policies:
                if not any(x["variant"] == v and x["axes"]["backbone"] == b for x in main):
                    assert v not in lines
                    continue
                a = self.averaged(main, b, v, "A")
                if v == "no-ask" and math.isnan(a):
                    a = 0.0
                if math.isnan(a):  # no judged session: no line, not a line at A = 0
                    assert v not in lines and v not in sidecar[b], (b, v)
                    continue
                u = self.averaged(main, b, v, "R") - self.lam * a
                assert close(lines[v]["U_at_lam"], u), (b, v)
                drawn = sidecar[b][v]
                assert close(drawn["y"][drawn["x"].index(self.lam)], u), (b, v)

    def figure8(self, main: list[dict], data: dict, plot: dict) -> None:
        """Unrestricted's messages per session and reward gain over No-ask, per domain."""
        for b in backbones(main):
            drawn = plot["series"]["messages"][b]
            assert drawn["x"] == self.domains
            for d, y in zip(self.domains, drawn["y"]):
                requests = self.cell(main, b, "unrestricted", "requests", d)
                same(data["backbones"][b][d]["requests"], requests, ("figure8", b, d))
                assert close(y, requests)
                gain = 100 * (self.cell(main, b, "unrestricted", "R", d)
                              - self.cell(main, b, "no-ask", "R", d))
                same(data["backbones"][b][d]["gain"], gain, ("figure8", b, d, "gain"))

    def table7_and_8(self, grids: dict[str, list[dict]], t7: dict, t8: dict) -> None:
        """Requests per session and reward of every row: the gate's variants from its grid, the
        others from grid main on the grid's backbones and tasks."""
        voi_as_run = labels(grids["main"], "voi-gate-as-run")
        rows7 = {"Unrestricted": "unrestricted", "VoI gate as run": voi_as_run[0],
                 "VoI gate, enforced veto (c=0.50)": "voi-gate(c=0.5)",
                 "VoI gate, enforced veto (c=0.65)": "voi-gate(c=0.65)",
                 "Budgeted (N=1)": "budgeted@1"}
        rows8 = {(n, name): v for n in BUDGETS for name, v in (
            ("Budgeted", f"budgeted@{n}"), ("Budgeted + VoI gate", f"voi-gate@{n}(c=0.27)"),
            ("Budgeted + MGR", f"budgeted+mgr@{n}"))}
        for grid, data, wanted in (("table7", t7, rows7), ("table8", t8, rows8)):
            own = grids[grid]
            tasks = {(x["domain"], x["task_id"]) for x in own}
            borrowed = [x for x in grids["main"] if x["axes"]["backbone"] in backbones(own)
                        and (x["domain"], x["task_id"]) in tasks]
            assert [r.get("N", r["row"]) if grid == "table7" else (r["N"], r["row"])
                    for r in data["rows"]] == list(wanted)
            for row, variant in zip(data["rows"], wanted.values()):
                source = own if policy_of(variant)[0] == "voi-gate" else borrowed
                if not any(x["variant"] == variant for x in source):
                    assert row["variant"] is None and row["requests"] is None, row
                    continue
                assert row["variant"] == variant, row
                among = backbones(own)
                same(row["requests"], self.nested(source, [variant], "requests", among=among),
                     (grid, variant))
                same(row["R"], 100 * self.nested(source, [variant], "R", among=among),
                     (grid, variant))

    def table17(self, grids: dict[str, list[dict]], data: dict) -> None:
        """Wide window minus Budgeted + Review and minus Budgeted + MGR: cost change (%) and
        value change over the N both ran."""
        own = grids["table17"]
        tasks = {(x["domain"], x["task_id"]) for x in own}
        among = backbones(own)
        lines = own + [x for x in grids["main"] if x["axes"]["backbone"] in among
                       and (x["domain"], x["task_id"]) in tasks]
        for policy in ("budgeted+review", "budgeted+mgr"):
            pairs = [(f"budgeted+review@{n}(evidence=9072)", f"{policy}@{n}") for n in BUDGETS
                     if any(x["variant"] == f"budgeted+review@{n}(evidence=9072)" for x in own)
                     and any(x["variant"] == f"{policy}@{n}" for x in lines)]
            entry = data[policy]
            assert entry["pairs"] == [[[b, w], [b, o]] for w, o in pairs for b in among
                                      if all(any(x["variant"] == v and x["axes"]["backbone"] == b
                                                 for x in lines) for v in (w, o))], policy
            wide, other = [w for w, _ in pairs], [o for _, o in pairs]
            a_w, a_o = (self.nested(lines, v, "A", among=among) for v in (wide, other))
            change = 100 * (a_w / a_o - 1) if pairs and a_o and not math.isnan(a_o) else math.nan
            same(entry["dA_pct"] and entry["dA_pct"]["estimate"], change, ("table17", policy))
            value = 10 * (self.nested(lines, wide, "V", among=among)
                          - self.nested(lines, other, "V", among=among)) if pairs else math.nan
            same(entry["dV_tilde"] and entry["dV_tilde"]["estimate"], value, ("table17", policy))

    def table25(self, lines: list[dict], data: dict, recipe: Any) -> None:
        """R, A, Ū and V of each row, per simulator regime."""
        runs = {(x["axes"]["simulator"], x["axes"]["backbone"]) for x in lines}
        assert {(r["simulator"], r["backbone"]) for r in data["rows"]} == runs
        assert {s for s, _ in runs} == set(recipe.study.axes["simulator"])
        for row in data["rows"]:
            mine = [x for x in lines if x["axes"]["simulator"] == row["simulator"]]
            for metric, key in (("R", "R"), ("A", "A"), ("U", "U_bar"), ("V", "V")):
                same(row[key], self.averaged(mine, row["backbone"], row["variant"], metric),
                     ("table25", row["simulator"], row["variant"], metric))


def table12_from_the_run(folder: Path, results: dict[str, dict], data: dict,
                         recipe: Any) -> None:
    """The second judge scored a sample of the questions the first judge scored in this run; the
    table counts them (or says it has none)."""
    path = folder / "second_judge.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    latest = {r["id"]: r for r in rows}
    eligible = {f"{'|'.join(map(str, line['key']))}#{q['message_index']}"
                for line in results.values() for q in line["attention"]["requests"]
                if q["discretionary"] and not q.get("fallback") and q.get("text")
                and q["reading_effort"] is not None and q["value"] is not None}
    assert set(latest) <= eligible
    assert len(latest) == min(recipe.study.second_judge_sample, len(eligible))
    both = [r for r in latest.values() if r["second"] and all(
        r[j][d] is not None for j in ("first", "second") for d in ("value", "reading_effort"))]
    if not both:
        assert data["status"] == "not run", data
        return
    assert data["status"] == "scored" and data["questions"] == len(both)
    value = data["dimensions"]["value"]
    assert close(value["mean_first"], 10 * mean(r["first"]["value"] for r in both))
    assert close(value["mean_second"], 10 * nan_mean(r["second"]["value"] for r in both))


# ---- the tests -----------------------------------------------------------------------------------


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_the_cut_rehearsal_makes_every_item_from_its_run(
        tmp_path: Path, vllm_python: Path, rehearsal_model: Callable[[Path], None]) -> None:
    rehearse(tmp_path, vllm_python, rehearsal_model, CI_CUT, timeout=2400)


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.full
@pytest.mark.timeout(10800)
def test_the_whole_rehearsal_makes_every_item_from_its_run(
        tmp_path: Path, vllm_python: Path, rehearsal_model: Callable[[Path], None]) -> None:
    rehearse(tmp_path, vllm_python, rehearsal_model, (), timeout=9000)


def asking_line(rng: random.Random, key: list[Any], variant: str, axes: dict[str, str],
                ) -> dict[str, Any]:
    """A result line of the study's shape whose agent asked: seeded rewards, discretionary and
    exempt requests, a fifth of them unjudged (what the tiny model seldom gives)."""
    policy, budget = policy_of(variant)
    requests = []
    for i in range(0 if policy == "no-ask" else rng.randint(0, 3)):
        discretionary, unjudged = rng.random() < 0.7, rng.random() < 0.2
        requests.append({"discretionary": discretionary,
                         "label": "discretionary" if discretionary else "required",
                         "atomic_questions": rng.randint(1, 3),
                         "reading_effort": None if unjudged else rng.randint(0, 20),
                         "value": None if unjudged else rng.randint(0, 10), "fallback": False,
                         "judge_error": "not valid JSON" if unjudged else None,
                         "text": "Which size do you need?", "message_index": 3 + 2 * i})
    reviews = rng.randint(0, 2)
    return {"key": key, "method": "base", "variant": variant, "axes": axes, "domain": key[0],
            "task_id": key[1], "seed": key[2], "score": float(rng.random() < 0.5),
            "error": False, "termination": "max_steps",
            "attention": {"policy": policy, "budget": budget, "accounting": "full", "lam": 0.03,
                          "requests": requests, "spent": 0, "blocked": 0, "fallbacks": 0,
                          "discretionary": sum(q["discretionary"] for q in requests),
                          "reviews": reviews, "vetoes": rng.randint(0, reviews),
                          "judged": True,
                          "judge_failures": sum(q["value"] is None for q in requests)}}


def test_the_checks_hold_on_a_study_whose_agent_asks(tmp_path: Path) -> None:
    """The checks above where the tiny model gives them little to check: a result line that
    asks for every episode the cut rehearsal plans (a table25 episode shared with main written
    once), a second judge's lines for its sample, and the report that `prour study report`
    makes of them; costs, values and efficiencies defined in some cells and missing in others."""
    from prour.eval.study import agent_key, study_dir, study_plan
    from prour.recipes import load_recipe

    run_dir = tmp_path / "runs" / "ask-less-rehearsal"
    recipe = load_recipe(REHEARSAL, [*CI_CUT, f"run_dir={run_dir}"])
    folder = study_dir(recipe)
    folder.mkdir(parents=True)
    rng = random.Random(3)
    lines = [asking_line(rng, [p.domain, p.task_id, p.seed, agent_key(p, cell)], p.variant,
                         cell.axes) for cell, planned in study_plan(recipe).items()
             for p in planned]
    (folder / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    asked = sorted((f"{'|'.join(map(str, x['key']))}#{q['message_index']}", x, q) for x in lines
                   for q in x["attention"]["requests"]
                   if q["discretionary"] and q["value"] is not None)
    judged = [{"id": qid, "first": {"reading_effort": q["reading_effort"], "value": q["value"]},
               "second": None if i == 0 else {"reading_effort": rng.randint(0, 20),
                                             "value": rng.randint(0, 10)},
               "error": "not valid JSON" if i == 0 else None, "backbone": x["axes"]["backbone"],
               "variant": x["variant"], "domain": x["domain"], "task_id": x["task_id"],
               "seed": x["seed"], "message_index": q["message_index"], "text": q["text"]}
              for i, (qid, x, q) in enumerate(asked[:recipe.study.second_judge_sample])]
    (folder / "second_judge.jsonl").write_text("".join(json.dumps(x) + "\n" for x in judged))
    sets = [part for item in (*CI_CUT, f"run_dir={run_dir}") for part in ("--set", item)]
    made = subprocess.run(prour_argv("study", "report", "--recipe", str(REHEARSAL), *sets,
                                     "--n-boot", "200"), cwd=tmp_path, capture_output=True,
                          text=True, timeout=600, check=False)
    assert made.returncode == 0, made.stdout + made.stderr
    report_is_made_from_the_run(recipe)
    items = json.loads((folder / "report" / "ask-less" / "report.json").read_text())["items"]
    costs = [m["A"] for t in items["backbones"]["data"].values() for row in t["rows"].values()
             for m in row.values()]
    assert None in costs and any(a for a in costs)  # both branches of the checks were taken
    assert items["table12"]["data"]["status"] == "scored"


def test_the_dry_run_lists_steps_servers_and_the_estimate(tmp_path: Path) -> None:
    """The study's dry run by the installed script: each step's command, every grid with its
    episodes, the serving groups (the two served backbones apart), each backbone's endpoint,
    the missing keys and the estimate in hours."""
    from prour.recipes import load_recipe

    run_dir = tmp_path / "runs" / "ask-less"
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENAI_API_KEY", "XAI_API_KEY", "TOGETHER_API_KEY")}
    done = subprocess.run(prour_argv("run", "--recipe", str(STUDY), "--dry-run", "--set",
                                     f"run_dir={run_dir}"), cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    out = done.stdout
    assert done.returncode in (0, 2), out + done.stderr  # 2: this machine reaches no endpoint
    if done.returncode == 2:
        assert re.search(r"^problem: endpoint: ", out, re.MULTILINE), out
    recipe = load_recipe(STUDY, [f"run_dir={run_dir}"])
    for step in STUDY_STEPS:
        command = "report" if step == "study-report" else "run" if step == "study" else step
        assert re.search(rf"^  study/{re.escape(step)} +pending", out, re.MULTILINE), step
        assert re.search(rf"^ +prour study {command} --recipe {re.escape(str(STUDY))} --set "
                         rf"run_dir={re.escape(str(run_dir))}", out, re.MULTILINE), step
    for grid, episodes in GRID_EPISODES.items():
        assert re.search(rf"^ +grid {grid}: .* = {episodes} episodes$", out, re.MULTILINE), grid
    assert re.search(r"^ +study: 95,052 episodes in all", out, re.MULTILINE), out
    groups = re.findall(r"^ +serving group (\d+): serves (.*)$", out, re.MULTILINE)
    served = [s for _, s in groups]
    assert len(groups) == 2 and "meta-llama/Llama-3.3-70B-Instruct" in served[0] \
        and "openai/gpt-oss-120b" not in served[0] and "openai/gpt-oss-120b" in served[1]
    first, second = out.split("serving group 2: ")[0].split("serving group 1: ")[1], \
        out.split("serving group 2: ")[1].split("every cell: ")[0]
    assert "backbone=llama-3.3-70b " in first and "backbone=gpt-oss-120b " not in first
    assert "backbone=gpt-oss-120b " in second and "backbone=llama-3.3-70b " not in second
    for backbone, value in recipe.study.axes["backbone"].items():
        agent = value.set["models"]["agent"]
        where = (rf"{re.escape(agent['model'])} at {re.escape(agent['base_url'])} \(key "
                 rf"\${agent['api_key_env']}\)" if "base_url" in agent else
                 rf"{re.escape(agent['model'])} served")
        assert re.search(rf"^ +backbone={re.escape(backbone)} simulator=original: agent: {where}$",
                         out, re.MULTILINE), backbone
    for variable in ("OPENAI_API_KEY", "XAI_API_KEY", "TOGETHER_API_KEY"):
        assert re.search(rf"^ +missing key: .* takes its key from \${variable}, which is not set$",
                         out, re.MULTILINE), variable
    estimate = re.search(r"^estimate \(study\): 95,052 episodes in 2 serving group\(s\).*\n"
                         r"(?:  .*\n)*?  total: ([\d,.]+) h of episodes", out, re.MULTILINE)
    assert estimate and float(estimate.group(1).replace(",", "")) > 0, out
