"""`prour view` on a real two-method evaluation (base, prour) of retail task 65, opened in headless
Chromium: the episode page's decision table is in the DOM, a `<script>` a model wrote stays text,
and a screenshot of the page lands under the run folder."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import pytest
from eval_world import (
    CLARIFY_ANSWER,
    CLARIFY_Q,
    expected_uncertainty,
    generator_llm,
    recipe,
    scripted_llms,
)
from headless_chromium import headless
from typer.testing import CliRunner

from prour.build import Builder
from prour.cli.main import app
from prour.config import Recipe
from prour.env.trajectory import Trajectory, read_jsonl, read_trajectories
from prour.eval.agent import is_agent_turn
from prour.eval.harness import EPISODES_FILE, RESULTS_FILE, Evaluation
from prour.eval.posthoc import posthoc_uncertainty

SCRIPT = "<script>alert(1)</script>"
QUESTION = f"{CLARIFY_Q} {SCRIPT}"


class Dom(HTMLParser):
    """The dumped DOM's tags, the text of every cell of table#decisions, and all text."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.rows: list[list[str]] = []
        self.text: list[str] = []
        self._table = self._cell = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag == "table":
            self._table = ("id", "decisions") in attrs
        elif self._table and tag == "tr":
            self.rows.append([])
        elif self._table and tag in ("td", "th"):
            self._cell = True
            self.rows[-1].append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._table = False
        elif tag in ("td", "th"):
            self._cell = False

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._table and self._cell:
            self.rows[-1][-1] += data


def _evaluate(tmp_path: Path) -> Path:
    """base and prour on retail 65, the generator's clarify question carrying a script tag."""
    data = recipe(str(tmp_path), methods=["base", "prour"], tasks=["retail:65"],
                  domains=["retail"], attention={"policy": "unrestricted"})
    loaded = Recipe.model_validate(data)
    llms = {**scripted_llms(),
            "generator": generator_llm(clarify=f"YES [QUESTION]{QUESTION}[/QUESTION]")}
    run_dir = tmp_path / "run"
    evaluation = Evaluation(loaded, run_dir, progress=False, builder=Builder(loaded, llms))
    try:
        evaluation.run()
    finally:
        evaluation.close()
    return run_dir


@pytest.mark.browser
def test_view_pages_in_headless_chromium(tmp_path: Path, chromium: str) -> None:
    run_dir = _evaluate(tmp_path)
    done = CliRunner().invoke(app, ["view", str(run_dir)])
    assert done.exit_code == 0, done.output
    view = run_dir / "view"
    trajectories = {t.agent: t for t in read_trajectories(run_dir / EPISODES_FILE)}
    lines = {x["method"]: x for x in read_jsonl(run_dir / RESULTS_FILE)}
    assert set(lines) == {"base", "prour"} and len(trajectories) == 2
    pages = sorted(p.name for p in view.glob("episode-*.html"))
    assert len(pages) == 2 and f"{view / 'index.html'} (2 episode pages)" in done.output

    index = Dom()
    index.feed((view / "index.html").read_text())
    assert all(name in "".join(index.text) for name in ("base", "prour", "retail", "65"))
    assert sum(tag == "a" for tag in index.tags) == 2  # one link per episode

    [page] = [p for p in view.glob("episode-*prour*.html")]
    traj = trajectories[lines["prour"]["key"][3]]
    dom = Dom()
    dom.feed(headless(chromium, "--dump-dom", page.as_uri(), profile=tmp_path / "profile").stdout)
    assert "script" not in dom.tags  # the generator's <script> stayed text
    assert SCRIPT in "".join(dom.text)
    header, *rows = dom.rows
    assert header[:6] == ["turn", "message", "tag", "route", "AU", "EU"]
    turns = [s for s in traj.steps if is_agent_turn(s)]
    assert len(rows) == len(turns) >= 2
    assert [r[3] for r in rows] == [s.meta["route"] for s in turns]
    clarify = rows[[s.meta.get("turn") for s in turns].index("clarify")]
    au, eu = expected_uncertainty("clarify")
    assert (clarify[4], clarify[5]) == (f"{au:.3f}", f"{eu:.3f}")
    assert (clarify[7], clarify[8]) == (QUESTION, CLARIFY_ANSWER)
    [request] = [r for r in lines["prour"]["attention"]["requests"]
                 if r["text"] == QUESTION]  # full accounting: 1 + r/20 + (1 − v/10)
    cost = 1 + request["reading_effort"] / 20 + (1 - request["value"] / 10)
    assert clarify[9] == f"{cost:.3f}"
    _check_posthoc(tmp_path, run_dir, trajectories[lines["base"]["key"][3]])

    shot = run_dir / "episode.png"
    headless(chromium, f"--screenshot={shot}", "--window-size=1200,900", page.as_uri(),
             profile=tmp_path / "profile")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    _check_imported(tmp_path, run_dir)


def _check_posthoc(tmp_path: Path, run_dir: Path, base: Trajectory) -> None:
    """After the post-hoc decomposer pass, base's page shows its AU/EU per turn: the scripted
    decomposer's clarify state before any tool result, verify after it (hand-computed)."""
    loaded = Recipe.model_validate(recipe(str(tmp_path), methods=["base", "prour"]))
    posthoc_uncertainty(run_dir, loaded, Builder(loaded, scripted_llms()))
    done = CliRunner().invoke(app, ["view", str(run_dir)])
    assert done.exit_code == 0, done.output
    [page] = (run_dir / "view").glob("episode-*base*.html")
    dom = Dom()
    dom.feed(page.read_text())
    header, *rows = dom.rows
    assert header[-3:] == ["post-hoc AU", "post-hoc EU", "post-hoc route"]
    assert len(rows) == len([s for s in base.steps if is_agent_turn(s)])
    assert all(r[4] == r[5] == "" for r in rows)  # base recorded no AU/EU of its own
    for row, state in zip(rows, ["clarify", "verify"]):
        au, eu = expected_uncertainty(state)
        assert (row[-3], row[-2]) == (f"{au:.3f}", f"{eu:.3f}")


def _check_imported(tmp_path: Path, run_dir: Path) -> None:
    """prour's own tau2 export of the prour episode, imported back, viewed: inferred tags by
    hand (question, READ tool -> lookup, question, statement), the script still text, and tau2's
    per-check rewards in the reward table."""
    [exported] = (run_dir / "tau2_results").glob("retail__prour*.json")
    imported = tmp_path / "imported"
    runner = CliRunner()
    done = runner.invoke(app, ["import", "tau2", str(exported), "--run-dir", str(imported)])
    assert done.exit_code == 0, done.output
    done = runner.invoke(app, ["view", str(imported), "--out", str(tmp_path / "site")])
    assert done.exit_code == 0, done.output
    [page] = (tmp_path / "site").glob("episode-*.html")
    dom = Dom()
    dom.feed(page.read_text())
    assert "script" not in dom.tags and SCRIPT in "".join(dom.text)
    header, *rows = dom.rows
    assert header[2] == "inferred tag"
    assert [r[2] for r in rows] == ["question", "lookup", "question", "reply"]
    assert all(r[4] == r[5] == "" for r in rows)  # no router ran: no AU/EU
    [traj] = read_trajectories(imported / "trajectories.jsonl")
    checks = json.loads(exported.read_text())["simulations"][0]["reward_info"]["reward_breakdown"]
    assert checks and all(f"{name}{value:.2f}" in "".join(dom.text) for name, value in
                          checks.items())
    assert traj.reward == 1.0


@pytest.mark.parametrize(("setup", "fragment"), [
    ("tau2", ("it is a tau2 results file (one JSON object with `simulations`), not JSONL; convert "
             "it with `prour import tau2")),
    ("tau2-folder", "results.json: it is a tau2 results file"),
    ("none", "no episodes.jsonl or trajectories.jsonl (is it a run folder of"),
    ("empty", "episodes.jsonl: no episodes to show"),
    ("torn", ("episodes.jsonl: no episodes to show; 1 unreadable line of episodes.jsonl "
              "skipped (line 1)")),
])
def test_view_refuses_what_is_not_a_run_in_one_line(tmp_path: Path, setup: str,
                                                    fragment: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    target = run
    if setup.startswith("tau2"):
        tau2_file = run / "results.json"
        tau2_file.write_text(json.dumps({"info": {}, "tasks": [], "simulations": []}, indent=2))
        target = tau2_file if setup == "tau2" else run
    elif setup == "empty":
        (run / "episodes.jsonl").write_text("")
    elif setup == "torn":
        (run / "episodes.jsonl").write_text('{"schema_version": 1, "domain": "ret')
    done = CliRunner().invoke(app, ["view", str(target)])
    errors = [x for x in done.output.splitlines() if x.startswith("error: ")]
    assert done.exit_code == 2 and len(errors) == 1 and fragment in errors[0], done.output
    assert not (run / "view").exists()
