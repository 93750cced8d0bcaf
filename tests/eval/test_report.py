"""``prour report`` on hand-written result lines: every number against a hand computation."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from plot_check import read_plot
from typer.testing import CliRunner

from prour.cli.main import app
from prour.eval.harness import RESULTS_FILE
from prour.eval.plots import SystemPoint, mean_curves, plot_success_vs_steps
from prour.eval.report import load_systems, summarize, write_report
from prour.eval.stats import bootstrap_mean_ci

PNG = b"\x89PNG\r\n\x1a\n"

# success of (task, seed) per domain: system "prour" and "base" on the same tasks and seeds
PROUR = {"retail": {"t1": [1, 0], "t2": [1, 1]}, "airline": {"a1": [0, 0], "a2": [1, 0]}}
BASE = {"retail": {"t1": [0, 0], "t2": [1, 0]}, "airline": {"a1": [0, 0], "a2": [0, 0]}}


def _line(method: str, domain: str, task: str, seed: int, score: float, *,
          steps: tuple[int, int, int] = (3, 1, 1), seconds: float = 10.0, calls: int = 5,
          error: bool = False, variant: str | None = None, attention: dict | None = None,
          decisions: list | None = None, termination: str | None = None) -> dict:
    agent = method if variant is None else f"{method}/{variant}"
    termination = termination or ("error" if error else "user_stop")
    return {"schema": 1, "key": [domain, task, seed, agent], "method": method, "variant": variant,
            "domain": domain, "task_id": task, "seed": seed, "reward": score, "score": score,
            "success": score == 1.0, "termination": termination,
            "error": error, "timeout": False, "unscored": False, "errors": [],
            "steps": dict(zip(("act", "clarify", "verify"), steps)), "records": 9,
            "model_calls": {"agent.chat": calls}, "model_calls_total": calls,
            "seconds": seconds, "decisions": decisions or [], "episode_started_at": "t",
            "attention": attention}


def _write(run: Path, lines: list[dict]) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    (run / RESULTS_FILE).write_text("".join(json.dumps(line) + "\n" for line in lines))
    return run


@pytest.fixture
def run(tmp_path: Path) -> Path:
    lines = []
    for method, table, steps, seconds in (("prour", PROUR, (3, 1, 1), 10.0),
                                          ("base", BASE, (6, 0, 0), 4.0)):
        for domain, tasks in table.items():
            for task, successes in tasks.items():
                for seed, ok in enumerate(successes):
                    decisions = [{"step": 0, "route": "clarify", "au": 0.5, "eu": 0.25,
                                  "total": 0.75}] if method == "prour" else []
                    lines.append(_line(method, domain, task, seed, float(ok), steps=steps,
                                       seconds=seconds + seed, decisions=decisions,
                                       error=method == "base" and task == "a1" and seed == 1))
    return _write(tmp_path / "run", lines)


def _rows(markdown: str, title: str) -> list[list[str]]:
    section = markdown.split(f"## {title}")[1].split("\n## ")[0]
    table = [line for line in section.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in row.strip("|").split("|")] for row in table[2:]]


def test_pass_at_1_pass_hat_k_and_costs_by_hand(run: Path, tmp_path: Path) -> None:
    written = write_report([run], tmp_path / "rep", n_boot=500)
    markdown = written["markdown"].read_text()
    rows = {r[0]: r for r in _rows(markdown, "Pass@1 (%) and interaction cost")}
    # prour retail: seed 0 solves 2/2, seed 1 solves 1/2 -> 75; airline: 1/2 and 0/2 -> 25
    assert rows["prour"][1].startswith("75.00 [") and rows["prour"][2].startswith("25.00 [")
    assert rows["prour"][3].startswith("50.00 [")
    # base airline a1 seed 1 errored: its cells say so instead of a Pass@1 counting it as 0
    assert rows["base"][1].startswith("25.00 [") and rows["base"][2:4] == ["error (1/4)",
                                                                           "error (1/8)"]
    assert "error (n/N): n of the cell's N episodes ended in an error" in markdown
    assert rows["prour"][4:8] == ["3.00", "1.00", "1.00", "5.00"]
    assert rows["base"][4:8] == ["6.00", "0.00", "0.00", "6.00"]
    assert rows["prour"][8] == "10.50"  # seconds 10 and 11 in every domain
    assert rows["base"][10:] == ["1", "0", "0", "8"]  # errors, timeouts, cut, episodes
    interval = bootstrap_mean_ci([[1, 0], [1, 1]], n_boot=500, seed=0)
    assert rows["prour"][1] == (f"{100 * interval.estimate:.2f} [{100 * interval.low:.2f}, "
                                f"{100 * interval.high:.2f}]")
    hat = {(r[0], r[1]): r[2:] for r in _rows(markdown, "pass^k (%)")}
    # prour retail: t1 solved 1 of 2 trials, t2 2 of 2 -> pass^1 = 75, pass^2 = (0 + 1)/2 = 50
    assert hat[("prour", "retail")] == ["75.00", "50.00"]
    assert hat[("prour", "airline")] == ["25.00", "0.00"]
    assert hat[("prour", "average")] == ["50.00", "25.00"]
    assert hat[("base", "retail")] == ["25.00", "0.00"]
    assert hat[("base", "airline")] == ["error (1/4)"] * 2
    assert hat[("base", "average")] == ["error (1/8)"] * 2


def test_paired_difference_by_hand(run: Path, tmp_path: Path) -> None:
    written = write_report([run], tmp_path / "rep", baseline="base", n_boot=500)
    [row] = _rows(written["markdown"].read_text(), "Paired differences")
    # per task means, prour − base: retail t1 .5−0, t2 1−.5 -> .5; airline a1 0, a2 .5 -> .25
    assert row[:2] == ["prour", "base"]
    assert row[2].startswith("50.00 [")
    # airline holds base's errored episode (1 of both systems' 8), so does the average (1 of 16)
    assert row[3:5] == ["error (1/8)", "error (1/16)"]
    data = json.loads(written["json"].read_text())
    assert data["comparisons"][0]["deltas"]["airline"]["estimate"] == pytest.approx(0.25)
    delta = data["comparisons"][0]["deltas"]["average"]
    assert delta["estimate"] == pytest.approx(0.375)
    assert delta["low"] <= 0.375 <= delta["high"]


def test_plots_are_written(run: Path, tmp_path: Path) -> None:
    written = write_report([run], tmp_path / "rep", n_boot=200)
    systems = {s["label"]: s["pass_at_1"]["average"]
               for s in json.loads(written["json"].read_text())["systems"]}
    success = read_plot(written["success_vs_steps"])
    # Pass@1: prour (retail .75 + airline .25)/2 = 50 % at 5 steps; base has an errored episode,
    # so it holds no measurement and is not drawn (its table cells read "error (1/8)")
    assert sorted(success["series"]) == ["prour"]
    assert success["series"]["prour"]["x"] == [5.0]
    assert success["series"]["prour"]["y"] == [pytest.approx(50.0)]
    systems.pop("base")
    for label, interval in systems.items():  # error bars are the report's intervals, in %
        bar = success["series"][label]
        assert bar["low"] == [pytest.approx(100 * interval["low"])]
        assert bar["high"] == [pytest.approx(100 * interval["high"])]
        assert bar["low"][0] <= bar["y"][0] <= bar["high"][0]
    [axes] = success["axes"]
    assert 0.0 <= axes["ylim"][0] <= min(100 * i["low"] for i in systems.values())
    assert max(100 * i["high"] for i in systems.values()) <= axes["ylim"][1] <= 100.0
    uncertainty = read_plot(written["uncertainty_over_steps"])
    # only prour decides; one decision at step 0 (drawn at agent step 1): total .75, AU .5, EU .25
    for key, value in (("total", 0.75), ("au", 0.5), ("eu", 0.25)):
        assert uncertainty["series"][key] == {"prour": {"x": [1], "y": [value]}}
    # a single value gets the minimum span of 0.1 nats around it
    assert [a["ylim"] for a in uncertainty["axes"]] == [
        [pytest.approx(0.7), pytest.approx(0.8)], [pytest.approx(0.45), pytest.approx(0.55)],
        [pytest.approx(0.2), pytest.approx(0.3)]]
    curves = mean_curves([[{"step": 0, "au": 0.5, "eu": 0.1, "total": 0.6},
                           {"step": 1, "au": 0.2, "eu": None, "total": 0.3}],
                          [{"step": 0, "au": 0.3, "eu": 0.3, "total": 0.6}]], max_steps=3)
    assert curves["au"][:2] == pytest.approx([0.4, 0.2])
    assert curves["eu"][:2] == [pytest.approx(0.2), None] and curves["total"][2] is None


def test_coinciding_systems_get_readable_axes(tmp_path: Path) -> None:
    """Two systems on one point (the demo's "base" and "prour" at 0 %): both are legend entries
    with distinct markers, and the axes keep a minimum span clipped to [0, 100] %."""
    points = [SystemPoint("base", 4.0, 0.0, 0.0, 0.0), SystemPoint("prour", 4.0, 0.0, 0.0, 0.0)]
    sidecar = read_plot(plot_success_vs_steps(points, tmp_path / "s.png"))
    assert list(sidecar["series"]) == ["base", "prour"]
    [axes] = sidecar["axes"]
    assert axes["ylim"] == [0.0, 10.0]  # span 10 around 0 %, shifted up to start at 0
    assert axes["xlim"] == [3.0, 5.0]  # span 2 steps around 4
    top = plot_success_vs_steps([SystemPoint("a", 1.0, 100.0, 90.0, 100.0)], tmp_path / "t.png")
    assert read_plot(top)["axes"][0]["ylim"] == [pytest.approx(89.2), 100.0]  # 90 − 8 % of 10


def test_incomplete_system_is_reported_not_zeroed(run: Path, tmp_path: Path) -> None:
    lines = [json.loads(x) for x in (run / RESULTS_FILE).read_text().splitlines()]
    lines = [x for x in lines if not (x["method"] == "base" and x["task_id"] == "t2"
                                      and x["seed"] == 1)]
    _write(run, lines)
    [_, base] = load_systems([run])
    summary = summarize(base, n_boot=100)
    assert summary.pass_at_1 is None and "task 't2' seed 1" in summary.problem
    markdown = write_report([run], tmp_path / "rep", n_boot=100)["markdown"].read_text()
    assert "- base: retail: missing episodes: task 't2' seed 1" in markdown


def test_two_runs_get_prefixed_labels(run: Path, tmp_path: Path) -> None:
    other = _write(tmp_path / "other", [json.loads(x) for x in
                                        (run / RESULTS_FILE).read_text().splitlines()])
    labels = [s.label for s in load_systems([run, other])]
    assert labels == ["run:prour", "run:base", "other:prour", "other:base"]


# ---- attention ----------------------------------------------------------------------------

R_EFFORT, VALUE = 8.0, 5.0
PER_REQUEST = 1 + R_EFFORT / 20 + (1 - VALUE / 10)  # `full` accounting: 1.9


def _attention(n_requests: int) -> dict:
    requests = [{"discretionary": True, "atomic_questions": 1, "reading_effort": R_EFFORT,
                 "value": VALUE, "fallback": False, "judge_error": None}] * n_requests
    return {"policy": "x", "budget": None, "accounting": "full", "lam": 0.5,
            "weights": {"message": 1.0, "atomic": 1.0, "effort": 1.0, "avoidability": 1.0},
            "requests": requests, "fallbacks": 0}


@pytest.fixture
def attention_run(tmp_path: Path) -> Path:
    """Per policy and task t1..t4 (one seed): (requests in the conversation, success)."""
    plan = {"no-ask": [(0, 1), (0, 0), (0, 0), (0, 0)],
            "budgeted@1": [(1, 1), (1, 1), (1, 0), (1, 0)],
            "budgeted@2": [(2, 1), (2, 1), (2, 1), (2, 0)],
            "unrestricted": [(3, 1), (3, 1), (3, 1), (3, 1)],
            "budgeted+mgr@2": [(1, 1), (1, 1), (2, 1), (2, 0)]}
    lines = [_line("base", "retail", f"t{i + 1}", 0, float(ok), variant=variant,
                   attention=_attention(n))
             for variant, cells in plan.items() for i, (n, ok) in enumerate(cells)]
    return _write(tmp_path / "att", lines)


def test_attention_tables_by_hand(attention_run: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["report", str(attention_run), "--out", str(tmp_path / "r"),
                                      "--attention", "--n-boot", "300"])
    assert result.exit_code == 0, result.output
    markdown = (tmp_path / "r" / "report.md").read_text()
    rows = {(r[1], r[2]): r for r in _rows(markdown, "Attention: reward")}
    row = rows[("retail", "budgeted@2")]
    # R = 3/4; A = 2 requests × 1.9; U = R − 0.5·A; V = 5; efficiency (R − R_no-ask)/A
    assert float(row[4]) == pytest.approx(0.75, abs=5e-4)
    assert float(row[5]) == pytest.approx(2 * PER_REQUEST, abs=5e-4)
    assert float(row[6]) == pytest.approx(VALUE, abs=5e-3)
    assert float(row[7]) == pytest.approx(0.75 - 0.5 * 2 * PER_REQUEST, abs=5e-4)
    assert float(row[13]) == pytest.approx((0.75 - 0.25) / (2 * PER_REQUEST), abs=5e-4)
    [comparison] = _rows(markdown, "Equal-cost comparisons")
    # A_mgr = 1.5 × 1.9 lies between A_1 = 1.9 and A_2 = 3.8: w = (3.8 − 2.85)/(3.8 − 1.9) = 0.5,
    # R_mix = 0.5·0.5 + 0.5·0.75 = 0.625 and R_mgr − R_mix = 0.75 − 0.625
    assert comparison[:4] == ["base", "budgeted+mgr@2", "budgeted@1/2", "0.500"]
    assert comparison[4].startswith("+0.125 [")
    assert (tmp_path / "r" / "reward_vs_attention.png").read_bytes()[:8] == PNG
    assert not math.isnan(json.loads((tmp_path / "r" / "report.json").read_text())
                          ["attention"]["equal_cost"][0]["weight"])


def test_efficiency_intervals_and_holm_by_hand(attention_run: Path, tmp_path: Path) -> None:
    write_report([attention_run], tmp_path / "r", attention=True, n_boot=20_000)
    markdown = (tmp_path / "r" / "report.md").read_text()
    rows = {r[1]: r for r in _rows(markdown, "Asking efficiency")}
    assert set(rows) == {"budgeted@1", "budgeted@2", "budgeted+mgr@2", "unrestricted"}
    # budgeted@2 gains [0, 1, 1, 0] over No-ask at A = 3.8 on every task: estimate 0.5 / 3.8;
    # a resample's mean gain is Binomial(4, 1/2) / 4, so the 95% interval is [0, 1] / 3.8
    assert rows["budgeted@2"][2] == f"{0.5 / 3.8:+.4f} [+0.0000, {1 / 3.8:+.4f}]"
    assert rows["unrestricted"][2].startswith(f"{0.75 / 5.7:+.4f} [")
    assert rows["budgeted+mgr@2"][2].startswith(f"{0.5 / 2.85:+.4f} [")
    # P(no gain in a resample): budgeted@1 (3/4)^4, budgeted@2 and mgr (1/2)^4, unrestricted
    # (1/4)^4; p = 2·P. Holm over the four: 4·p_unres, then max(3·p, 2·p) = 3/8 for the pair
    holm = {policy: float(row[3]) for policy, row in rows.items()}
    assert holm["unrestricted"] == pytest.approx(4 * 2 / 4**4, abs=0.01)
    assert holm["budgeted@2"] == pytest.approx(3 * 2 / 2**4, abs=0.03)
    assert holm["budgeted+mgr@2"] == pytest.approx(3 * 2 / 2**4, abs=0.03)
    assert holm["budgeted@1"] == pytest.approx(2 * (3 / 4) ** 4, abs=0.03)
    data = json.loads((tmp_path / "r" / "report.json").read_text())["attention"]["efficiency"]
    assert {row["policy"]: row["holm"] for row in data} == pytest.approx(holm, abs=1e-4)
    averaged = {r[2]: r for r in _rows(markdown, "Attention: reward") if r[1] == "average"}
    assert float(averaged["budgeted@2"][13]) == pytest.approx(0.5 / 3.8, abs=5e-4)


# ---- human burden study -------------------------------------------------------------------

QUESTIONS = {"budgeted@1": "Which order, and which of its items, and why?",
             "budgeted+mgr@1": "Which order?"}
EFFORT = {"budgeted@1": 16.0, "budgeted+mgr@1": 0.0}  # full cost 1 + r/20 + 0.5: 2.3 and 1.5


@pytest.fixture
def burden_run(tmp_path: Path) -> Path:
    """Two policies asking one question each on tasks t1, t2; No-ask asks none."""
    from prour.env.trajectory import StepRecord, Trajectory
    from prour.files import append_jsonl

    run = tmp_path / "burden-run"
    lines = []
    for task in ("t1", "t2"):
        for variant in ("no-ask", *QUESTIONS):
            attention = _attention(0 if variant == "no-ask" else 1)
            attention["requests"] = [{**q, "reading_effort": EFFORT[variant]}
                                     for q in attention["requests"]]
            line = _line("base", "retail", task, 0, 1.0, variant=variant, attention=attention)
            lines.append(line)
            text = QUESTIONS.get(variant, "Done: your order is cancelled.")
            append_jsonl(run / "episodes.jsonl", Trajectory(
                domain="retail", task_id=task, seed=0, agent=line["key"][3], user="user",
                messages=[{"role": "system", "content": "secret policy"},
                          {"role": "user", "content": f"Help with {task}."},
                          {"role": "assistant", "content": text}],
                steps=[StepRecord(kind="user_message", message_index=1),
                       StepRecord(kind="agent_message", message_index=2)]))
    return _write(run, lines)


def test_burden_pairs_then_agreement_by_hand(burden_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "r"
    runner = CliRunner()
    exported = runner.invoke(app, ["report", str(burden_run), "--out", str(out), "--attention",
                                   "--burden-pairs", "10", "--n-boot", "200"])
    assert exported.exit_code == 0, exported.output
    shown = [json.loads(x) for x in (out / "burden" / "pairs.jsonl").read_text().splitlines()]
    keys = [json.loads(x) for x in (out / "burden" / "pairs_key.jsonl").read_text().splitlines()]
    # one equal-count pair per task (budgeted@1 against budgeted+mgr@1), costs 2.3 and 1.5
    assert sorted(s["task_id"] for s in shown) == ["t1", "t2"]
    answers = []
    for pair, key in zip(shown, keys):
        assert sorted([key["cost_a"], key["cost_b"]]) == pytest.approx([1.5, 2.3])
        higher = pair[f"conversation_{key['higher']}"]
        assert QUESTIONS["budgeted@1"] in higher and "secret policy" not in higher
        other = "b" if key["higher"] == "a" else "a"
        # t1: both answers agree; t2: one agrees, one disagrees, one tie
        choices = [key["higher"]] * 2 if pair["task_id"] == "t1" else [key["higher"], other,
                                                                          "same"]
        answers += [{"pair_id": key["pair_id"], "choice": c} for c in choices]
    answers_path = tmp_path / "answers.jsonl"
    answers_path.write_text("".join(json.dumps(a) + "\n" for a in answers))

    scored = runner.invoke(app, ["report", str(burden_run), "--out", str(out), "--attention",
                                 "--annotations", str(answers_path), "--n-boot", "20000"])
    assert scored.exit_code == 0, scored.output
    [row] = _rows((out / "report.md").read_text(), "Human burden study")
    # 3 of 4 non-tie answers agree; resampling the 2 pairs: t1 twice 4/4, t2 twice 2/4, mixed
    # 3/4 (probabilities 1/4, 1/4, 1/2), so the 95% interval is [50, 100] and p ≈ 2·1/4
    assert row[:4] == ["2", "4", "1", "75.00 [50.00, 100.00]"]
    assert float(row[4]) == pytest.approx(0.5, abs=0.02)


def test_burden_study_refuses_misuse(burden_run: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    args = ["report", str(burden_run), "--out", str(tmp_path / "r"), "--n-boot", "50"]
    alone = runner.invoke(app, [*args, "--burden-pairs", "3"])
    assert alone.exit_code == 2 and "add --attention" in alone.output
    unexported = runner.invoke(app, [*args, "--attention", "--annotations", "answers.jsonl"])
    assert unexported.exit_code == 2 and "export the pairs first" in unexported.output
    both = runner.invoke(app, [*args, "--attention", "--burden-pairs", "3",
                               "--annotations", "answers.jsonl"])
    assert both.exit_code == 2 and "separate runs" in both.output


def test_cut_episodes_have_their_own_column_in_every_table(tmp_path: Path) -> None:
    """Episodes that reached env.max_steps (termination max_steps, score 0) per system and per
    attention policy, in the main table and the attention table."""
    cut = {("no-ask", "t1"), ("budgeted@1", "t1"), ("budgeted@1", "t2")}
    lines = [_line("base", "retail", task, 0, 0.0 if (variant, task) in cut else 1.0,
                   variant=variant, attention=_attention(0 if variant == "no-ask" else 1),
                   termination="max_steps" if (variant, task) in cut else None)
             for variant in ("no-ask", "budgeted@1") for task in ("t1", "t2", "t3")]
    run = _write(tmp_path / "cut", lines)
    markdown = write_report([run], tmp_path / "r", attention=True, n_boot=200)["markdown"]
    text = markdown.read_text()
    main = {r[0]: r for r in _rows(text, "Pass@1 (%) and interaction cost")}
    assert main["base [no-ask]"][11] == "1" and main["base [budgeted@1]"][11] == "2"
    attention = {(r[1], r[2]): r for r in _rows(text, "Attention: reward")}
    assert [attention[(d, p)][14] for d in ("retail", "average")
            for p in ("budgeted@1", "no-ask")] == ["2", "1", "2", "1"]
