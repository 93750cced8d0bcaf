"""The Ask-Less study report on synthetic result lines (two backbones x three domains x three
tasks x two seeds x every variant of every grid, rewards and judge scores from a seeded RNG):
every file is written, the numbers in report.json equal means recomputed here with numpy from the
lines, the plots decode and their sidecars hold those numbers, the paper's values sit beside the
run's, a missing grid is said in words, run text is escaped, and the page opens in Chromium."""

from __future__ import annotations

import json
import re
from functools import partial
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import study_numbers as numbers
from plot_check import read_plot
from study_numbers import close, full_cost

from prour.eval.attention.study_items import StudyData
from prour.eval.attention.study_report import ITEMS, write_ask_less_report

DOMAINS = ("retail", "airline", "telecom")
TASKS = ("1", "2", "3")
SEEDS = (0, 1)
ODD = "<b>x|y</b>"  # a backbone name that must be escaped everywhere
BACKBONES = {"astra": "GPT-6-Astra", ODD: None}
LAM = 0.03
MAIN = ("no-ask", "unrestricted", "frugal", "voi-gate-as-run(c=0.27)",
        *(f"{p}@{n}" for p in ("budgeted", "budgeted+mgr", "budgeted+review",
                               "budgeted+review+summary") for n in (1, 2, 3)))
GRIDS = {"main": MAIN, "table7": ("voi-gate(c=0.5)", "voi-gate(c=0.65)"),
         "table8": tuple(f"voi-gate@{n}(c=0.27)" for n in (1, 2, 3)),
         "table17": tuple(f"budgeted+review@{n}(evidence=9072)" for n in (1, 2, 3)),
         "table25": ("unrestricted", "budgeted@1", "budgeted+mgr@1", "budgeted@2")}
FILES = {"table3": "table3.md", "figure3": "figure3_paths.png", "table5": "table5.md",
         "table7": "table7.md", "table8": "table8.md", "table13": "table13.md",
         "table14": "table14.md", "figure4": "figure4_mgr.png", "figure5": "figure5_domains.png",
         "figure6": "figure6_efficiency.png", "figure7": "figure7_lambda.png",
         "figure8": "figure8_frequency.png", "table17": "table17.md", "table25": "table25.md",
         "table12": "table12.md"}


# ---- synthetic result lines (the shape of a study's results.jsonl) ---------------------------


def _request(rng: np.random.Generator, discretionary: bool, unjudged: float) -> dict[str, Any]:
    return {"discretionary": discretionary,
            "label": "discretionary" if discretionary else "required",
            "atomic_questions": int(rng.integers(1, 4)),
            "reading_effort": int(rng.integers(0, 21)),
            "value": None if rng.random() < unjudged else int(rng.integers(0, 11)),
            "fallback": False, "judge_error": None, "text": "Which size?", "message_index": 3}


def result_line(rng: np.random.Generator, backbone: str, variant: str, domain: str, task: str,
                seed: int, simulator: str = "original", unjudged: float = 0.04) -> dict[str, Any]:
    """One result line; more questions make success likelier, budgets cap the questions."""
    policy, _, rest = variant.partition("@")
    policy = policy.split("(")[0]
    budget = int(rest.split("(")[0]) if rest else None
    n = int(rng.integers(0, (0 if policy == "no-ask" else budget or 4) + 1))
    requests = [_request(rng, True, unjudged) for _ in range(n)]
    requests += [_request(rng, False, unjudged) for _ in range(int(rng.integers(0, 3)))]
    reviews = n + int(rng.integers(0, 3)) if policy in (
        "voi-gate", "budgeted+review", "budgeted+review+summary", "budgeted+mgr") else 0
    return {"key": [domain, task, seed, f"{backbone}|{variant}|{simulator}"], "method": "base",
            "variant": variant, "axes": {"backbone": backbone, "simulator": simulator},
            "domain": domain, "task_id": task, "seed": seed,
            "score": float(rng.random() < 0.3 + 0.1 * n), "error": False,
            "termination": "user_stop",
            "attention": {"policy": policy, "budget": budget, "accounting": "full", "lam": LAM,
                          "requests": requests, "discretionary": n, "spent": n, "blocked": 0,
                          "fallbacks": int(rng.random() < 0.15), "reviews": reviews,
                          "vetoes": int(rng.integers(0, reviews + 1)), "judged": True}}


def study_lines(seed: int = 0, grids: dict[str, tuple[str, ...]] = GRIDS,
                backbones: tuple[str, ...] = tuple(BACKBONES), unjudged: float = 0.04,
                ) -> dict[str, list[dict]]:
    """Every grid's lines (``unjudged``: the share of requests the judge failed on); grid
    table25 runs under two simulator regimes."""
    rng = np.random.default_rng(seed)
    out = {}
    for grid, variants in grids.items():
        simulators = ("original", "guarded") if grid == "table25" else ("original",)
        out[grid] = [result_line(rng, b, v, d, t, s, sim, unjudged) for sim in simulators
                     for b in backbones for v in variants for d in DOMAINS for t in TASKS
                     for s in SEEDS]
    return out


def study_data(grids: dict[str, list[dict]]) -> StudyData:
    return StudyData(grids=grids, backbones=dict(BACKBONES),
                     simulators={"original": "Original", "guarded": "Guarded"},
                     second_judge=[], header=["synthetic study for the report test"])


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("ask-less")
    data = study_data(study_lines())
    files = write_ask_less_report(data, out, n_boot=200)
    return {"data": data, "files": files, "out": out,
            "json": json.loads((out / "report.json").read_text())["items"]}


# ---- the numbers, recomputed by hand (tests/study_numbers.py) with this test's constants ---

cell = partial(numbers.cell, lam=LAM)
averaged = partial(numbers.averaged, domains=DOMAINS, lam=LAM)
nested = partial(numbers.nested, domains=DOMAINS, backbones=tuple(BACKBONES), lam=LAM)


# ---- tests -----------------------------------------------------------------------------------


def test_every_item_has_its_file(report) -> None:
    out, files = report["out"], report["files"]
    for item, name in FILES.items():
        assert files[item] == out / name and (out / name).stat().st_size > 0, item
    for name in ("summary.txt", "report.json", "index.html", "backbones.md",
                 "backbone_astra.md", "backbone_b_x_y_b.md"):
        assert (out / name).is_file(), name
    assert set(report["json"]) == set(ITEMS)
    summary = (out / "summary.txt").read_text()
    assert "Table 3: reward" in summary and "synthetic study for the report test" in summary


def test_table3_means(report) -> None:
    lines = report["data"].grids["main"]
    rows = {r["policy"]: r for r in report["json"]["table3"]["data"]["rows"]}
    budgets = [f"budgeted@{n}" for n in (1, 2, 3)]
    assert close(rows["unrestricted"]["R"], 100 * nested(lines, ["unrestricted"], "R"))
    assert close(rows["frugal"]["A"], nested(lines, ["frugal"], "A"))
    assert close(rows["budgeted"]["R"], 100 * nested(lines, budgets, "R"))
    assert close(rows["budgeted"]["A"], nested(lines, budgets, "A"))
    assert close(rows["budgeted+mgr"]["V_tilde"],
                 10 * nested(lines, [f"budgeted+mgr@{n}" for n in (1, 2, 3)], "V"))
    assert rows["unrestricted"]["paper"] == {"R": "49.4", "A_tilde": "29.5", "V_tilde": "63.5"}


def test_published_value_sits_beside_its_run_number(report) -> None:
    table3 = (report["out"] / "table3.md").read_text()
    run = report["json"]["table3"]["data"]["rows"][0]
    row = next(x for x in table3.splitlines() if x.startswith("| Unrestricted |"))
    assert row.startswith(f"| Unrestricted | {run['R']:.1f} | 49.4 | {run['A']:.2f} | 29.5 |")
    assert "table3.unrestricted.R.customer-service" in table3  # the source is listed
    backbone = (report["out"] / "backbone_astra.md").read_text().splitlines()
    at = next(i for i, x in enumerate(backbone) if x.startswith("| Unrestricted | ∞ | this run"))
    assert backbone[at + 1].startswith("| Unrestricted | ∞ | paper (GPT-6-Astra) | 0.73 | 3.36 |")


def test_table13_saved_and_table14_bundled(report) -> None:
    lines = report["data"].grids["main"]
    data = report["json"]["table13"]["data"]["atomic"]["saved"]
    saved = 100 * (1 - nested(lines, ["budgeted@2"], "A", "atomic")
                   / nested(lines, ["unrestricted"], "A", "atomic"))
    assert close(data[1]["estimate"], saved) and data[1]["low"] < saved < data[1]["high"]
    mgr = 100 * (1 - nested(lines, [f"budgeted+mgr@{n}" for n in (1, 2, 3)], "A", "messages")
                 / nested(lines, [f"budgeted@{n}" for n in (1, 2, 3)], "A", "messages"))
    assert close(report["json"]["table13"]["data"]["messages"]["saved"][3]["estimate"], mgr)
    disc = [q for x in lines if x["variant"] == "unrestricted"
            for q in x["attention"]["requests"] if q["discretionary"]]
    bundled = 100 * sum(q["atomic_questions"] > 1 for q in disc) / len(disc)
    rows = report["json"]["table14"]["data"]["rows"]
    assert close(rows[0]["bundled"]["estimate"], bundled)
    assert rows[0]["paper"][3] == "52.5 [51.0, 54.0]"


def test_backbone_cell_and_table25(report) -> None:
    main = report["data"].grids["main"]
    rows = report["json"]["backbones"]["data"][ODD]["rows"]
    assert close(rows["budgeted@2"]["airline"]["U"], cell(main, ODD, "budgeted@2", "U",
                                                          "airline"))
    assert close(rows["frugal"]["telecom"]["V"], cell(main, ODD, "frugal", "V", "telecom"))
    table25 = [x for x in report["data"].grids["table25"] if x["axes"]["simulator"] == "guarded"]
    found = next(r for r in report["json"]["table25"]["data"]["rows"]
                 if r["simulator"] == "guarded" and r["backbone"] == "astra"
                 and r["variant"] == "budgeted+mgr@1")
    for metric, key in (("R", "R"), ("A", "A"), ("U", "U_bar"), ("V", "V")):
        assert close(found[key], averaged(table25, "astra", "budgeted+mgr@1", metric)), key
    assert found["regime"] == "guarded" and found["paper"][0] == "0.700"


def test_figure6_estimate_and_figure7_utility(report) -> None:
    lines, out = report["data"].grids["main"], report["out"]
    efficiency = numbers.efficiency(lines, "astra", "budgeted@3", domains=DOMAINS)
    drawn = report["json"]["figure6"]["data"]["backbones"]["astra"]["budgeted@3"]
    assert close(drawn["estimate"], efficiency)
    sidecar = read_plot(out / "figure6_efficiency.png")["series"]
    assert close(sidecar["astra"]["budgeted@3"]["estimate"], efficiency)
    u = averaged(lines, "astra", "budgeted@2", "R") - 0.03 * averaged(
        lines, "astra", "budgeted@2", "A")
    line = report["json"]["figure7"]["data"]["backbones"]["astra"]["lines"]["budgeted@2"]
    assert close(line["U_at_0.03"], u)
    drawn7 = read_plot(out / "figure7_lambda.png")["series"]["astra"]["budgeted@2"]
    assert close(drawn7["y"][drawn7["x"].index(0.03)], u)


def test_plots_decode_and_sidecars_hold_the_numbers(report) -> None:
    out, items = report["out"], report["json"]
    figure3 = read_plot(out / "figure3_paths.png")["series"]
    path = items["figure3"]["data"]["backbones"]["astra"]["path"]
    assert figure3["astra"]["y"] == [p["R"] for p in path]
    assert figure3["astra"]["labels"] == ["no-ask", "budgeted@1", "budgeted@2", "budgeted@3",
                                            "unrestricted"]
    paper = figure3["paper: GPT-6-Astra (astra)"]  # Table 29: No-ask, then Budgeted N=1, ...
    assert paper["source"] == "paper" and close(paper["y"][0], (0.58 + 0.70 + 0.49) / 3)
    assert close(paper["x"][1], (1.27 + 1.15 + 1.20) / 3) and paper["labels"][1] == "budgeted@1"
    assert "backbone.gpt-6-astra.no-ask.R.retail" in paper["cells"]
    figure4 = read_plot(out / "figure4_mgr.png")["series"]
    assert figure4["saved"]["all backbones"]["estimate"] == \
        items["figure4"]["data"]["backbones"]["all backbones"]["saved"]["estimate"]
    assert close(figure4["saved"]["paper"]["estimate"], 12.7)
    figure5 = read_plot(out / "figure5_domains.png")["series"]
    curve = items["figure5"]["data"]["domains"]["airline"][ODD]["curve"]
    assert figure5["airline"][ODD]["x"] == [p["A"] for p in curve]
    figure8 = read_plot(out / "figure8_frequency.png")["series"]
    lines = report["data"].grids["main"]
    gain = 100 * (cell(lines, ODD, "unrestricted", "R", "telecom")
                  - cell(lines, ODD, "no-ask", "R", "telecom"))
    assert close(figure8["gain"][ODD]["y"][2], gain)
    assert close(figure8["gain"]["paper: GPT-6-Astra (astra)"]["y"][0], 100 * (0.73 - 0.58))


def test_a_missing_grid_is_said_in_words(tmp_path: Path) -> None:
    grids = study_lines(1, {"main": ("no-ask", "unrestricted", "budgeted@1", "budgeted@2")},
                        ("astra",))  # no Frugal, no other grid
    files = write_ask_less_report(study_data(grids), tmp_path, n_boot=20)
    table7 = files["table7"].read_text()
    assert "grid `table7` has no result lines in this study" in table7
    assert "| VoI gate, enforced veto (c=0.50) | this run | – | – | – | – | – |" in table7
    assert "| VoI gate, enforced veto (c=0.50) | paper | 1.73 | 17.2 | 51.0 |" in table7
    table3 = files["table3"].read_text()
    assert "no Frugal prompt episodes in the grid" in table3
    assert "| Frugal prompt | – | 47.0 | – | 24.9 | – | 65.7 |" in table3
    for name in ("table17", "table25", "table8"):
        assert f"grid `{name}` has no result lines" in files[name].read_text()
    data = json.loads(files["report"].read_text())["items"]
    assert data["table7"]["data"]["rows"][2]["R"] is None  # missing, not 0
    page = files["index"].read_text()
    assert "missing: grid `table25` has no result lines" in page


def test_equal_cost_cell_agrees_with_the_analysis_module() -> None:
    """On fully judged lines, one backbone's ΔR at equal cost from the report's panel equals
    analysis.equal_cost_comparison on (task, seed) arrays of the same lines."""
    from prour.eval.attention.analysis import equal_cost_comparison
    from prour.eval.attention.study_items import Study
    from prour.eval.attention.study_panel import estimate, match_cost, matched_mean

    ladder_variants = ("no-ask", "budgeted@1", "budgeted@2", "budgeted@3")
    lines = study_lines(2, {"main": (*ladder_variants, "budgeted+mgr@1", "budgeted+mgr@2")},
                        ("astra",), unjudged=0.0)["main"]
    panel = Study.of(study_data({"main": lines}), 50, 0.95).grid("main")
    ladder = {n: ("astra", v) for n, v in enumerate(ladder_variants)}
    strata = [d for d in DOMAINS for _ in TASKS]

    def table(variant: str, value: Any) -> np.ndarray:
        return np.array([[value(next(x for x in lines if x["variant"] == variant
                                     and x["domain"] == d and x["task_id"] == t
                                     and x["seed"] == s)) for s in SEEDS]
                         for d in DOMAINS for t in TASKS])

    for n in (1, 2):
        match = match_cost(panel, ("astra", f"budgeted+mgr@{n}"), ladder)
        assert not isinstance(match, str), match
        ours = estimate(panel, matched_mean(panel, [match], "R"))
        compared = (f"budgeted+mgr@{n}", ladder[match.n][1], ladder[match.n + 1][1])
        theirs = equal_cost_comparison(tuple(table(v, full_cost) for v in compared),
                                       tuple(table(v, lambda x: x["score"]) for v in compared),
                                       n_boot=50, strata=strata)
        assert close(match.weight, theirs.mixture.weight) and close(ours, theirs.delta.estimate)


def _table_rows(text: str) -> list[list[str]]:
    return [re.split(r"(?<!\\)\|", row.strip())[1:-1] for row in text.splitlines()
            if row.startswith("|")]


def test_run_text_is_escaped(report) -> None:
    out = report["out"]
    page = (out / "index.html").read_text()
    assert ODD not in page and "&lt;b&gt;x|y&lt;/b&gt;" in page
    for md in out.glob("*.md"):
        text = md.read_text()
        assert ODD not in text, md.name
        blocks = re.split(r"\n(?!\|)", text)  # each markdown table keeps its column count
        for block in (b for b in blocks if b.startswith("|")):
            widths = {len(row) for row in _table_rows(block)}
            assert len(widths) == 1, (md.name, widths)
    backbone = (out / "backbone_b_x_y_b.md").read_text()
    assert "## Backbone &lt;b&gt;x\\|y&lt;/b&gt;" in backbone


class _Sections(HTMLParser):
    """The id of every section and the text of its first heading."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: list[list[str]] = []
        self._title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "section":
            self.sections.append([dict(attrs)["id"] or "", ""])
        self._title = tag == "h2" and bool(self.sections)

    def handle_endtag(self, tag: str) -> None:
        self._title = self._title and tag != "h2"

    def handle_data(self, data: str) -> None:
        if self._title:
            self.sections[-1][1] += data


@pytest.mark.browser
def test_the_page_opens_in_headless_chromium(report, tmp_path: Path, chromium: str) -> None:
    from headless_chromium import headless

    page = report["out"] / "index.html"
    dom = _Sections()
    dom.feed(headless(chromium, "--dump-dom", page.as_uri(), profile=tmp_path / "profile").stdout)
    assert [s[0] for s in dom.sections] == list(ITEMS)
    titles = {key: item["title"] for key, item in report["json"].items()}
    assert all(title == titles[key] for key, title in dom.sections)
