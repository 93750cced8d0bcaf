"""A trade-off sweep (``eval.sweep``: router.budget 1,2 x router.every_n 1,2) into one run
folder on real tau2 retail task 55, with the replay world of ``eval_world`` (the agent replays
the reference actions; the scheduled decomposer routes clarify after every tool result), and the
report's Figures 5/8 (success versus decomposer calls) and 6 (AU/EU over steps) checked against
series recomputed here from the result lines."""

from __future__ import annotations

import csv
import itertools
import json

import pytest
from eval_world import TAU_AU, TAU_EU, replay_llms
from plot_check import read_plot

from prour.build import Builder
from prour.config import Recipe
from prour.config.eval import EvalConfig
from prour.config.router import RouterConfig
from prour.env.trajectory import read_jsonl
from prour.eval.harness import RESULTS_FILE, Evaluation
from prour.eval.report import write_report

BUDGETS, EVERY = [1, 2], [1, 2]
ASK_ALWAYS = tuple(range(1, 64))


def sweep_recipe() -> Recipe:
    cfg = EvalConfig(methods=["prour", "base"], seeds=[0], domains=["retail"],
                     tasks=["retail:55"], concurrency=2, judge=False,
                     sweep={"router.budget": BUDGETS, "router.every_n": EVERY})
    router = RouterConfig(n_interpretations=2, n_actions=2, tau_au=TAU_AU, tau_eu=TAU_EU,
                          tool_detail="brief")
    return Recipe(name="sweep", eval=cfg, router=router,
                  train={"rollout": {"max_response_tokens": 64}})


def run(recipe: Recipe, run_dir):
    evaluation = Evaluation(recipe, run_dir, progress=False,
                            builder=Builder(recipe, replay_llms("retail", "55", ASK_ALWAYS)))
    try:
        return evaluation.run()
    finally:
        evaluation.close()


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("router-sweep") / "eval"
    recipe = sweep_recipe()
    results = run(recipe, run_dir)
    return recipe, run_dir, results


def test_one_folder_holds_every_point_and_resume_runs_nothing(swept) -> None:
    recipe, run_dir, _ = swept
    lines = read_jsonl(run_dir / RESULTS_FILE)
    points = {(line["sweep"]["router.budget"], line["sweep"]["router.every_n"])
              for line in lines if line["method"] == "prour"}
    assert points == set(itertools.product(BUDGETS, EVERY))
    assert [line["sweep"] for line in lines if line["method"] == "base"] == [None]
    assert len(lines) == 5
    for line in lines:
        if line["method"] == "prour":  # the episode ran under its point's router settings
            point = line["sweep"]
            assert line["router"]["budget"] == point["router.budget"]
            assert line["router"]["every_n"] == point["router.every_n"]
            assert line["key"][3] == (f"prour [budget={point['router.budget']} "
                                      f"every_n={point['router.every_n']}]")
            assert 1 <= line["router"]["calls"] <= point["router.budget"]
    # budget 2 every step: decisions 0 and 1 ran; every 2nd step: decisions 0 and 2
    by_point = {(x["sweep"]["router.budget"], x["sweep"]["router.every_n"]): x
                for x in lines if x["sweep"]}
    assert [d["step"] for d in by_point[(2, 1)]["decisions"]] == [0, 1]
    assert [d["step"] for d in by_point[(2, 2)]["decisions"]] == [0, 2]
    # a rerun finds every point's episode done: nothing new is appended
    again = run(recipe, run_dir)
    assert len(read_jsonl(run_dir / RESULTS_FILE)) == 5 and len(again) == 5
    # eval.sweep is no run setting (folders made before it still resume; points are in the keys)
    assert "sweep" not in json.loads((run_dir / "run.json").read_text())["settings"]["eval"]
    # the chain's planned-episode count counts the points
    from prour.eval.steps import _evaluated

    done = recipe.model_copy(update={"run_dir": str(run_dir.parent)})
    assert _evaluated(done)
    more = done.eval.model_copy(update={"sweep": {"router.budget": [*BUDGETS, 3],
                                                  "router.every_n": EVERY}})
    assert not _evaluated(done.model_copy(update={"eval": more}))  # 2 more points planned


def test_sweep_flag_and_key_checks(tmp_path) -> None:
    from prour.cli.eval import _sweep

    assert _sweep(["router.budget=1,none", "router.every_n=2"]) == {
        "router.budget": [1, None], "router.every_n": [2]}
    with pytest.raises(ValueError, match="eval.sweep key"):
        EvalConfig(sweep={"router.tau_au": [1]})
    with pytest.raises(ValueError, match="router.every_n: 0"):
        EvalConfig(sweep={"router.every_n": [0]})
    assert EvalConfig(sweep={"router.every_n": [1, 4], "router.budget": [None]}).sweep_points() \
        == [{"router.budget": None, "router.every_n": 1}, {"router.budget": None,
                                                           "router.every_n": 4}]


def test_report_draws_the_tradeoff_and_uncertainty_figures_from_the_lines(swept) -> None:
    _, run_dir, _ = swept
    written = write_report([run_dir], run_dir / "report", n_boot=20)
    lines = [x for x in read_jsonl(run_dir / RESULTS_FILE) if x["sweep"]]
    # recomputed here: one point per (budget, every_n); x = router calls, y = success %
    expected = {(x["sweep"]["router.budget"], x["sweep"]["router.every_n"]):
                (float(x["router"]["calls"]), 100.0 * bool(x["success"])) for x in lines}
    budget = read_plot(written["tradeoff_budget"])["series"]
    for every_n in EVERY:
        series = budget[f"prour retail (every_n={every_n})"]
        assert series["router.budget"] == BUDGETS
        assert list(zip(series["x"], series["y"])) == [expected[(b, every_n)] for b in BUDGETS]
    frequency = read_plot(written["tradeoff_every_n"])["series"]
    for b in BUDGETS:
        series = frequency[f"prour retail (budget={b})"]
        assert series["router.every_n"] == EVERY
        assert list(zip(series["x"], series["y"])) == [expected[(b, n)] for n in EVERY]
    with open(written["tradeoff_csv"]) as handle:
        rows = list(csv.DictReader(handle))
    assert {(int(r["budget"]), int(r["every_n"])): (float(r["decomposer_calls"]),
                                                    float(r["success"])) for r in rows} == expected
    # Figure 6: per step, the mean over the point's recorded decisions (one episode each here)
    curves = read_plot(written["uncertainty_over_steps"])["series"]
    for line in lines:
        label = (f"prour [budget={line['sweep']['router.budget']} "
                 f"every_n={line['sweep']['router.every_n']}]")
        for key in ("au", "eu", "total"):
            want = {d["step"] + 1: d[key] for d in line["decisions"] if d[key] is not None}
            got = dict(zip(curves[key][label]["x"], curves[key][label]["y"]))
            assert got == pytest.approx(want)
