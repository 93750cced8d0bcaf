"""The paper section of ``prour report`` on a hand-built run folder (result lines, training metrics,
router evidence, trade-off sweep folders, post-hoc AU/EU written here): every cell of Tables 1
and 6 and every series of Figures 4 to 8 against numbers recomputed here from those files, the
paper's values beside them, what a missing input says, and the page in headless Chromium."""

from __future__ import annotations

import html
import json
import shutil
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import yaml
from plot_check import read_plot
from test_report import BASE, PROUR, _line, _write

from prour.config import Recipe
from prour.data.taxonomy_labels import approve
from prour.eval.harness import result_key
from prour.eval.paper import paper_value, paper_values
from prour.eval.paper_report import write_paper_report

OLD_RUN_DIR = "/moved/away/run"  # the run_dir the saved recipe records; --run-dir replaces it
BUDGETS, EVERY_N = [1, 2], [2, 4]  # eval.tradeoff: every_n 4 never ran (a missing point)
SECTIONS = ("table1", "table2", "table3", "table4", "figure2", "table5", "table6", "table7",
            "figure4", "figure5", "figure6", "figure7", "figure8")
PNG = b"\x89PNG\r\n\x1a\n"
# the reviewed taxonomy labels (domain, corrected): world 3 (tools 2, policy 1), user 1, none 1
TAXONOMY = [("retail", "tools"), ("retail", "preference"), ("airline", "tools"),
            ("airline", "policy"), ("airline", "none")]


def _episodes(method: str, table: dict, agent: str | None = None, **extra: Any) -> list[dict]:
    """One result line per (domain, task, seed) of ``table``; seconds and decisions vary by
    task and seed so that means are not trivial."""
    lines = []
    for domain, tasks in table.items():
        for t, (task, successes) in enumerate(tasks.items()):
            for seed, ok in enumerate(successes):
                decisions = [{"step": s, "route": "clarify", "au": 0.4 - 0.1 * s + 0.05 * seed,
                              "eu": 0.3 - 0.05 * s * (t + 1), "total": 0.7 - 0.2 * s}
                             for s in range(2 + t)] if method == "prour" else []
                line = _line(method, domain, task, seed, float(ok), decisions=decisions,
                             seconds=5.0 + 2 * t + seed, **extra)
                line["key"][3] = agent or method
                lines.append(line)
    return lines


def _routed(lines: list[dict], budget: int | None, every_n: int,
            sweep: dict | None = None) -> list[dict]:
    for line in lines:
        line["router"] = {"budget": budget, "every_n": every_n, "calls": 2, "skipped": 0}
        line["sweep"] = sweep
    return lines


def _sweep(key: str, value: int, table: dict, steps: tuple[int, int, int],
           **extra: Any) -> list[dict]:
    budget, every_n = (value, 1) if key == "router.budget" else (None, value)
    name = key.split(".")[1]
    return _routed(_episodes("prour", table, agent=f"prour [{name}={value}]", steps=steps,
                             **extra), budget, every_n, {key: value})


SWEPT = {  # router key -> value -> (successes, steps); every_n 2 has one errored episode
    "router.budget": {1: ({"retail": {"t1": [0, 0], "t2": [1, 0]},
                           "airline": {"a1": [1, 1], "a2": [0, 0]}}, (4, 1, 0)),
                      2: ({"retail": {"t1": [1, 1], "t2": [1, 0]},
                           "airline": {"a1": [0, 1], "a2": [0, 0]}}, (2, 2, 1))},
    "router.every_n": {2: ({"retail": {"t1": [1, 0], "t2": [0, 0]},
                            "airline": {"a1": [1, 1], "a2": [1, 0]}}, (5, 0, 1))},
}
METRICS = [  # steps 1-2 as the local trainer logs them, step 3 as verl's file logger does
    {"step": 1, "reward_mean": 0.05, "reward_mean_clarify": 0.1, "reward_mean_verify": 0.0,
     "prior_mean": -3.0, "post_mean": -2.9},
    {"step": 2, "reward_mean": 0.2, "reward_mean_clarify": 0.3, "reward_mean_verify": 0.1,
     "prior_mean": -2.8, "post_mean": -2.9},
    {"step": 3, "data": {"training/prour/reward_mean": 0.35,
                         "training/prour/reward_mean_clarify": 0.4,
                         "training/prour/reward_mean_verify": 0.3,
                         "training/prour/prior_mean": -2.7, "training/prour/post_mean": -2.2}},
]
EVIDENCE = {
    "schema": "prour.router-evidence/1", "decomposer_model": "tiny-qwen3",
    "thresholds": {"tau_au": 0.31, "tau_eu": 0.12}, "labels": ["act", "clarify", "verify"],
    "dev": {"states": 6, "macro_f1": 0.6667, "per_class_f1": {"act": 0.5, "clarify": 0.8333,
                                                             "verify": None},
            "confusion": [[1, 2, 0], [0, 3, 0], [0, 0, 0]],
            "notes": ["no dev state is labelled verify: macro-F1 averages act and clarify"]},
    "heldout": {"decomposer": {"states": 12, "macro_f1": 0.5678, "confusion": [],
                               "per_class_f1": {"act": 0.5, "clarify": 0.6, "verify": 0.6},
                               "notes": []},
                "llm_router": {"lacking": "models.llm_router is not set"}},
    "dev_mix": {"target": {"clarify": 3, "verify": 3, "act": 3},
                "used": {"clarify": 3, "verify": 3, "act": 3}, "short": {},
                "policy": "annotate", "complete": True},
    "written_at": "2026-01-01T00:00:00",
}


def _posthoc_rows(lines: list[dict]) -> list[dict]:
    """Post-hoc AU/EU of base's episodes at steps 0 and 1."""
    rows = []
    for i, line in enumerate(lines):
        for step in (0, 1):
            au, eu = 0.5 - 0.1 * step, 0.2 + 0.01 * i
            rows.append({"key": result_key(line["key"]), "method": "base",
                         "domain": line["domain"], "episode_started_at": "t", "step": step,
                         "au": au, "eu": eu, "total": au + eu, "route": None})
    return rows


def _recipe(run_dir: str, **tradeoff: Any) -> str:
    recipe = Recipe(name="paper-test", run_dir=run_dir, train={"output_dir": "checkpoints"},
                    eval={"tradeoff": {"methods": ["prour"], "budget": BUDGETS,
                                       "every_n": EVERY_N, **tradeoff}}, taxonomy={"run": True})
    return yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False)


def _eval_folder(run_dir: Path, recipe_run_dir: str | None) -> tuple[Path, dict[str, list]]:
    """The main evaluation: prour (budget unlimited, every step), base, and one eval.sweep
    point of prour (budget 3) in the same folder."""
    systems = {"prour": _routed(_episodes("prour", PROUR), None, 1),
               "base": _episodes("base", BASE, steps=(6, 0, 0)),
               "prour [budget=3]": _routed(_episodes("prour", BASE, agent="prour [budget=3]",
                                                     steps=(1, 1, 1)), 3, 1,
                                           {"router.budget": 3})}
    eval_dir = _write(run_dir / "eval", [line for lines in systems.values() for line in lines])
    if recipe_run_dir is not None:
        (eval_dir / "recipe.resolved.yaml").write_text(_recipe(recipe_run_dir))
    return eval_dir, systems


def _run_folder(root: Path) -> dict[str, Any]:
    run_dir = root / "run"
    eval_dir, systems = _eval_folder(run_dir, OLD_RUN_DIR)
    posthoc = _posthoc_rows(systems["base"])
    (eval_dir / "posthoc_uncertainty.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in posthoc))
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in METRICS))
    (run_dir / "calibration").mkdir()
    (run_dir / "calibration" / "router_evidence.json").write_text(json.dumps(EVIDENCE))
    (run_dir / "taxonomy").mkdir()
    (run_dir / "taxonomy" / "labels.jsonl").write_text("".join(
        json.dumps({"decision_id": f"d{i}", "domain": domain, "annotation": None,
                    "corrected": source}) + "\n" for i, (domain, source) in enumerate(TAXONOMY)))
    approve(run_dir / "taxonomy", "the test")
    swept = {}
    for key, folder in (("router.budget", "eval-budget"), ("router.every_n", "eval-every-n")):
        swept[key] = {v: _sweep(key, v, table, steps, error=False)
                      for v, (table, steps) in SWEPT[key].items()}
        lines = [line for points in swept[key].values() for line in points]
        if key == "router.every_n":
            lines[-1]["error"] = True
        _write(run_dir / folder, lines)
    return {"run_dir": run_dir, "eval_dir": eval_dir, "systems": systems, "swept": swept,
            "posthoc": posthoc}


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The run folder and the paper section written from it (the recipe's run_dir moved)."""
    built = _run_folder(tmp_path_factory.mktemp("paper"))
    built["paper"] = write_paper_report([built["eval_dir"]], built["eval_dir"] / "report",
                                        run_dir=built["run_dir"], n_boot=200)
    return built


# ---- independent recomputation -------------------------------------------------------------


def _by_domain(lines: list[dict], value: Any) -> float:
    """Mean of ``value(line)`` within each domain, then over domains."""
    domains = sorted({line["domain"] for line in lines})
    means = [sum(value(x) for x in lines if x["domain"] == d)
             / sum(x["domain"] == d for x in lines) for d in domains]
    return sum(means) / len(means)


def _pass(lines: list[dict], domain: str | None = None) -> float:
    """Pass@1 (%): per task the mean over seeds, the mean over tasks, then over domains."""
    domains = [domain] if domain else sorted({line["domain"] for line in lines})
    means = []
    for d in domains:
        tasks = sorted({x["task_id"] for x in lines if x["domain"] == d})
        means.append(sum(sum(x["score"] for x in lines if x["task_id"] == t and x["domain"] == d)
                         / sum(x["task_id"] == t and x["domain"] == d for x in lines)
                         for t in tasks) / len(tasks))
    return 100 * sum(means) / len(means)


def _steps(lines: list[dict]) -> float:
    return _by_domain(lines, lambda x: sum(x["steps"].values()))


def _curve(episodes: list[list[dict]], key: str) -> dict[int, float]:
    """Step (1-based) -> mean of ``key`` over the episodes that recorded that step."""
    values: dict[int, list[float]] = {}
    for records in episodes:
        for r in records:
            values.setdefault(r["step"] + 1, []).append(r[key])
    return {s: sum(v) / len(v) for s, v in sorted(values.items())}


def _md_rows(markdown: str) -> list[list[str]]:
    """The cells of the first markdown table (the run beside the paper), header left out."""
    table = markdown.split("\n| ", 1)[1].split("\n\n")[0].splitlines()
    return [[c.strip() for c in row.strip("|").split("|")] for row in table[2:]]


def _paper_text(item: str, **where: str) -> str:
    return paper_value(item, **where).text


# ---- Table 1 -------------------------------------------------------------------------------


def test_table1_cells_are_the_main_systems_beside_the_papers(chain) -> None:
    markdown = (chain["paper"].folder / "table1.md").read_text()
    rows = {(r[0], r[1]): r[2:] for r in _md_rows(markdown)}
    assert not any("budget=" in label for label, _ in rows)  # sweep points are no rows
    for method in ("prour", "base"):
        lines = chain["systems"][method]
        run = rows[(method, "this run")]
        for cell, domain in zip(run[:3], ("retail", "airline", None)):
            assert cell.startswith(f"{_pass(lines, domain):.2f} [")
        act, clarify, verify = (_by_domain(lines, lambda x, k=k: x["steps"][k])
                                for k in ("act", "clarify", "verify"))
        assert run[3:] == [f"{v:.2f}" for v in (act, clarify, verify, _steps(lines))]
    assert rows[("prour", "paper (Prour)")] == [
        "–", "–", _paper_text("table1", method="prour", metric="pass_at_1", domain="average"),
        "–", "–", "–", _paper_text("table1", method="prour", metric="steps", domain="average")]
    assert rows[("prour", "paper (Prour)")][2] == "28.17"
    assert rows[("base", "paper (Base agent)")][2::4] == ["17.40", "28.90"]
    # a method the run did not evaluate: its paper row, and the run row says so
    assert rows[("verify-only", "paper (Verify-only)")][:3] == ["15.7", "30.0", "–"]
    assert rows[("verify-only", "this run")] == ["not evaluated", *["–"] * 6]
    assert ("verify-only (Verify-only): not evaluated in this run; add `verify-only` to "
            "eval.methods") in markdown
    assert "0.00" not in "".join(rows[("verifiagent", "this run")])


# ---- Table 6 and Figure 7 ------------------------------------------------------------------


def test_table6_and_figure7_come_from_the_router_evidence(chain) -> None:
    markdown = (chain["paper"].folder / "table6.md").read_text()
    rows = {(r[0], r[1]): r[2:] for r in _md_rows(markdown)}
    dev = EVIDENCE["dev"]
    f1 = [f"{dev['per_class_f1'][k]:.3f}" for k in ("act", "clarify")]
    assert rows[("tiny-qwen3", "this run (dev)")] == [  # no verify label: no F1, not a 0
        str(dev["states"]), *f1, "no label", f"{dev['macro_f1']:.3f}", "0.31", "0.12"]
    assert f"dev: {dev['notes'][0]}" in markdown
    assert rows[("Qwen3-8B", "paper")] == ["–", "–", "–", "–", "0.714", "0.25", "0.20"]
    assert rows[("GLM-4-32B", "paper")][4:] == ["0.711", "0.20", "0.08"]
    assert ("dev mix used: 3 clarify / 3 verify / 3 act (target 3 / 3 / 3; short: none; policy "
            "`annotate`; walk complete) | paper: 60 clarify, 90 verify, 90 act") in markdown

    figure = read_plot(chain["paper"].folder / "figure7_router_f1.png")
    bars = figure["series"]["macro_f1"]
    assert bars["this run"] == {"x": ["decomposer"], "y": [pytest.approx(56.78)],
                                "source": "run"}
    assert bars["paper"]["y"] == [74.04, 54.24]
    assert figure["series"]["missing"] == ["held-out LLM router: lacking: models.llm_router is not set"]
    section = _section(chain, "figure7")
    assert "56.78" in section and "lacking: models.llm_router is not set" in section


# ---- Figure 4 ------------------------------------------------------------------------------


def test_figure4_draws_the_training_metrics_of_both_backends(chain) -> None:
    figure = read_plot(chain["paper"].folder / "figure4_training.png")
    flat = [{"step": r["step"], **{k.removeprefix("training/prour/"): v
                                   for k, v in r.get("data", r).items()}} for r in METRICS]
    for panel, key, label in (("belief", "prior_mean", "prior ℓ_prior"),
                              ("belief", "post_mean", "posterior ℓ_post"),
                              ("reward", "reward_mean", "all samples"),
                              ("reward", "reward_mean_verify", "verify")):
        drawn = figure["series"][panel][label]
        assert drawn["x"] == [1, 2, 3] and drawn["source"] == "run"
        assert drawn["y"] == pytest.approx([r[key] for r in flat])
    paper = figure["series"]["reward"]["paper"]
    assert (paper["x"], paper["y"], paper["source"]) == ([2010], [0.7], "paper")
    assert figure["series"]["missing"] == []
    # posterior above prior at steps 1 and 3 of the 3
    assert "posterior above prior at 2 of 3 steps" in "\n".join(chain["paper"].lines)


# ---- Figures 5 and 8 -----------------------------------------------------------------------


def test_figure5_and_8_hold_the_sweeps_and_the_main_evaluations_point(chain) -> None:
    main, swept = chain["systems"]["prour"], chain["swept"]
    budget = read_plot(chain["paper"].folder / "figure5_budget.png")["series"]
    points = {**swept["router.budget"], 3: chain["systems"]["prour [budget=3]"]}
    order = [1, 2, 3]
    assert budget["pass_at_1"]["prour"]["x"] == [*order, "unlimited"]
    assert budget["pass_at_1"]["prour"]["y"] == pytest.approx(
        [_pass(points[v]) for v in order] + [_pass(main)])
    assert budget["steps"]["prour"]["y"] == pytest.approx(
        [_steps(points[v]) for v in order] + [_steps(main)])
    assert budget["pass_at_1"]["prour"]["folder"] == ["eval-budget", "eval-budget", "eval",
                                                      "eval"]
    assert (budget["pass_at_1"]["paper"]["x"], budget["pass_at_1"]["paper"]["y"]) == ([16],
                                                                                       [29.42])
    assert budget["steps"]["paper"]["y"] == [20.42]
    unplaced = budget["pass_at_1"]["paper (figure5.prour.pass_at_1.first)"]
    assert unplaced["y"] == [18.37] and unplaced["drawn"] == "horizontal line"

    every = read_plot(chain["paper"].folder / "figure8_frequency.png")
    series = every["series"]
    # every_n 2 has an errored episode: no success point, its steps and seconds are drawn
    assert series["pass_at_1"]["prour"]["x"] == [1]
    assert series["pass_at_1"]["prour"]["y"] == pytest.approx([_pass(main)])
    two = swept["router.every_n"][2]
    assert series["steps"]["prour"]["y"] == pytest.approx([_steps(main), _steps(two)])
    assert series["seconds"]["prour"]["y"] == pytest.approx(
        [_by_domain(x, lambda line: line["seconds"]) for x in (main, two)])
    assert series["pass_at_1"]["paper"] == {"x": [1, 2, 4, 8], "y": [28.17, 27.32, 23.0, 19.55],
                                            "source": "paper"}
    assert series["seconds"]["paper"]["y"] == [696.51, 708.27]
    [missing] = every["series"]["missing"]
    assert "no `prour` episodes at router.every_n=4" in missing and "eval-every-n" in missing
    rows = {r[1]: r for r in _table(chain, "figure8")}
    assert rows["2"][4] == "error (1/8)"


# ---- Figure 6 ------------------------------------------------------------------------------


def test_figure6_has_recorded_and_posthoc_curves_and_the_papers_points(chain) -> None:
    series = read_plot(chain["paper"].folder / "figure6_uncertainty.png")["series"]
    decisions = [line["decisions"] for line in chain["systems"]["prour"]]
    by_key: dict[str, list[list[dict]]] = {}
    for row in chain["posthoc"]:
        by_key.setdefault(row["key"], []).append(row)
    for key in ("total", "au", "eu"):
        for label, episodes in (("prour", decisions), ("base (post-hoc)", list(by_key.values()))):
            want = _curve(episodes, key)
            drawn = series[key][label]
            assert drawn["x"] == list(want) and drawn["y"] == pytest.approx(list(want.values()))
    assert not any("budget=3" in label for label in series["total"])  # main systems only
    assert series["total"]["paper: Prour"] == {"x": [1, 16], "y": [0.58, 0.11],
                                               "source": "paper"}
    assert series["eu"]["paper: Prour"]["y"] == [0.26, 0.08]
    assert "paper: Prour" not in series["au"]  # the text gives no AU numbers


# ---- the terminal, the HTML page, missing inputs --------------------------------------------


def _section(chain: dict, key: str) -> str:
    page = (chain["paper"].folder / "index.html").read_text()
    return page.split(f'<section id="{key}">')[1].split("</section>")[0]


def _table(chain: dict, key: str) -> list[list[str]]:
    """The rows of a section's run-beside-paper table, as text."""
    parser = _Dom()
    parser.feed(_section(chain, key).split("</table>")[0])
    return parser.rows[1:]


class _Dom(HTMLParser):
    """Cells of the tables and the attributes of sections and images in an HTML text."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.sections: list[str] = []
        self.images: list[dict[str, str | None]] = []
        self._cell = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = True
            self.rows[-1].append("")
        elif tag == "section":
            self.sections.append(dict(attrs)["id"])
        elif tag == "img":
            self.images.append({**dict(attrs),
                                "section": self.sections[-1] if self.sections else None})

    def handle_endtag(self, tag: str) -> None:
        self._cell = self._cell and tag not in ("td", "th")

    def handle_data(self, data: str) -> None:
        if self._cell:
            self.rows[-1][-1] += data


def test_the_cli_prints_a_line_per_row_and_takes_the_run_folder(chain, tmp_path) -> None:
    from typer.testing import CliRunner

    from prour.cli.main import app

    out = tmp_path / "rep"
    done = CliRunner().invoke(app, ["report", str(chain["eval_dir"]), "--out", str(out),
                                    "--n-boot", "50", "--run-dir", str(chain["run_dir"])])
    assert done.exit_code == 0, done.output
    assert f"The paper beside this run: {out / 'paper' / 'index.html'}" in done.output
    lines = done.output.splitlines()
    prour = next(line for line in lines if line.startswith("  prour: retail"))
    assert prour.endswith("| paper: average 28.17 %, total steps 21.33")
    assert f"average {_pass(chain['systems']['prour']):.2f} %" in prour
    assert "  prour budget=1 (eval-budget): Pass@1" in done.output
    assert "  calibrated decomposer: held-out macro-F1 56.78 % on 12 states" in done.output
    assert (out / "paper" / "summary.txt").read_text().splitlines() == lines[-len(
        (out / "paper" / "summary.txt").read_text().splitlines()):]


def test_without_a_run_folder_every_item_says_what_is_missing(tmp_path) -> None:
    eval_dir, _ = _eval_folder(tmp_path / "run", None)  # no recipe.resolved.yaml
    paper = write_paper_report([eval_dir], tmp_path / "rep", n_boot=50)
    want = (f"{eval_dir / 'recipe.resolved.yaml'} is missing or unreadable (`prour eval` writes "
            "it): pass the run folder with --run-dir RUN_DIR")
    for name in ("figure4_training", "figure5_budget", "figure7_router_f1", "figure8_frequency"):
        figure = read_plot(paper.folder / f"{name}.png")
        assert want in figure["series"]["missing"]
        runs = [s for panel in figure["series"].values() if isinstance(panel, dict)
                for s in panel.values() if s["source"] == "run" and s["y"]]
        assert not runs
    table6 = (paper.folder / "table6.md").read_text()
    assert f"- missing: {want}" in table6
    assert _md_rows(table6)[0] == ["–", "this run", "missing", *["–"] * 6]
    page = (paper.folder / "index.html").read_text()
    assert all(f'<section id="{key}">' in page for key in SECTIONS)
    assert "0.00" not in (paper.folder / "table6.md").read_text()


def test_an_empty_run_folder_names_the_step_or_key_that_fills_each_item(tmp_path) -> None:
    run_dir = tmp_path / "run"
    eval_dir, _ = _eval_folder(run_dir, str(run_dir))
    paper = write_paper_report([eval_dir], tmp_path / "rep", n_boot=50)
    text = "\n".join(paper.lines)
    assert (f"missing: {run_dir / 'checkpoints'} holds no metrics.jsonl (train.output_dir): the "
            "chain's `train` step writes it (`prour train --recipe R`)") in text
    assert (f"missing: {run_dir / 'calibration' / 'router_evidence.json'} is missing: the "
            "chain's `heldout` step writes it") in text
    assert (f"missing: {run_dir / 'eval-budget'} holds no results.jsonl: the chain's "
            "eval-budget step (eval.tradeoff.budget) writes it") in text
    # the main evaluation's point is there all the same
    budget = read_plot(paper.folder / "figure5_budget.png")["series"]
    assert budget["pass_at_1"]["prour"]["x"] == [3, "unlimited"]
    (eval_dir / "recipe.resolved.yaml").write_text(_recipe(str(run_dir), every_n=[], run=True))
    paper = write_paper_report([eval_dir], tmp_path / "rep2", n_boot=50)
    assert ("missing: eval.tradeoff.every_n lists no values: the chain's eval-every-n step "
            "(eval.tradeoff.every_n) runs only when it does") in "\n".join(paper.lines)


def test_table5_and_figure2_count_the_reviewed_taxonomy_labels(chain) -> None:
    folder = chain["paper"].folder
    rows = {row[0]: row for row in _md_rows((folder / "table5.md").read_text())}
    # columns: source, side, retail, airline, events, share, open labels, paper
    assert rows["tools"][2:6] == ["1", "1", "2", "50.0"]
    assert rows["world side"][2:6] == ["1", "2", "3", "75.0"]
    assert rows["world side"][-1] == "16,947 events (89.1 %)"
    assert rows["user side"][2:6] == ["1", "0", "1", "25.0"]
    assert rows["no uncertainty"][4] == "1"
    figure = read_plot(folder / "figure2_sources.png")["series"]
    assert figure["share"]["this run"]["y"] == [75.0, 25.0]
    assert figure["share"]["paper"]["y"] == [89.1, 10.9]
    assert figure["labels"]["approved"] is True
    page = _section(chain, "table5")
    assert "not the paper&#x27;s nine cases" in page or "not the paper's nine cases" in page


def test_every_paper_value_on_the_page_names_its_source(chain) -> None:
    for value in paper_values():
        section = _section(chain, value.item)
        assert html.escape(value.source) in section
        assert html.escape(value.claim) in section and html.escape(value.phrase) in section


@pytest.mark.browser
def test_the_page_opens_in_headless_chromium(chain, tmp_path, chromium: str) -> None:
    from headless_chromium import headless
    from PIL import Image

    folder = chain["paper"].folder
    page = folder / "index.html"
    shot = tmp_path / "paper.png"
    headless(chromium, f"--screenshot={shot}", "--window-size=1280,2400", page.as_uri(),
             profile=tmp_path / "profile")
    assert shot.read_bytes()[:8] == PNG
    with Image.open(shot) as image:  # the page as drawn: its size, and not one flat colour
        assert image.size == (1280, 2400)
        low, high = image.convert("L").getextrema()
        assert high - low > 100
        assert len(image.convert("L").getcolors(maxcolors=1 << 16) or []) > 50
    # a copy beside the PNGs records each image's natural width once the page has loaded
    probe = tmp_path / "site"
    shutil.copytree(folder, probe)
    script = ("<script>window.addEventListener('load',()=>{for(const i of document.images)"
              "i.setAttribute('data-natural-width',i.naturalWidth)});</script></body>")
    (probe / "probe.html").write_text(page.read_text().replace("</body>", script))
    dom = _Dom()
    dom.feed(headless(chromium, "--dump-dom", "--virtual-time-budget=5000",
                      (probe / "probe.html").as_uri(), profile=tmp_path / "profile").stdout)
    assert dom.sections == list(SECTIONS)
    loaded = {image["section"]: int(image["data-natural-width"]) for image in dom.images}
    assert set(loaded) == {"figure2", "figure4", "figure5", "figure6", "figure7", "figure8"}
    assert all(width > 0 for width in loaded.values()), loaded


def test_table1_names_the_model_that_wrote_ig_clarifiers_questions() -> None:
    """A.2.1 reimplements the baselines on Qwen3-8B; prour trains IG-Clarifier's clarifier from
    models.generator: Table 1 says which model wrote its questions, and why, from the lines."""
    from prour.eval.paper import table1_item
    from prour.eval.systems import System, summarize

    writer = "hf:/runs/paper/checkpoints-ig-clarifier/step_2010"
    lines = [{**line, "question_writer": writer} for line in _episodes("ig-clarifier", BASE)]
    system = System("eval", "ig-clarifier", None, lines, "ig-clarifier")
    note = [n for n in table1_item([system], [summarize(system, 0)]).notes
            if n.startswith("ig-clarifier:")]
    assert len(note) == 1 and writer in note[0] and "Qwen3-8B backbone (A.2.1)" in note[0]
    base = System("eval", "base", None, [{**line, "question_writer": None}
                                          for line in _episodes("base", BASE)], "base")
    assert not [n for n in table1_item([base], [summarize(base, 0)]).notes
                if n.startswith("ig-clarifier:")]
