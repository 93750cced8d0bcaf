"""The post-hoc decomposer pass: ``base`` episodes on real tau2 tasks (eval_world's scripted
roles) get AU/EU at their first decisions from the scripted decomposer, whose values in each
state are known by hand (``eval_world.expected_uncertainty``), and the report draws them as
``base (post-hoc)`` curves."""

from __future__ import annotations

import pytest
from eval_world import CLARIFY_Q, expected_uncertainty, recipe, register_scripts, scripted_llms
from plot_check import read_plot
from typer.testing import CliRunner

from prour.build import Builder
from prour.cli.main import app
from prour.config import Recipe
from prour.env.trajectory import read_jsonl, read_trajectories
from prour.eval.agent import is_agent_turn
from prour.eval.harness import EPISODES_FILE, Evaluation, result_key
from prour.eval.posthoc import POSTHOC_FILE, posthoc_uncertainty


def expected_state(trajectory, step) -> str:
    """What the scripted decomposer sees before ``step``: no tool result and no question yet
    reads as two goals (clarify), afterwards one goal with two candidates (verify)."""
    before = [s for s in trajectory.steps if s.message_index < step.message_index]
    results = any(s.kind == "tool_result" and (s.requestor or "assistant") == "assistant"
                  for s in before)
    asked = any(CLARIFY_Q in str(trajectory.messages[s.message_index].get("content") or "")
                for s in before)
    return "verify" if results or asked else "clarify"


def test_posthoc_pass_gives_base_curves_and_resumes(tmp_path) -> None:
    loaded = Recipe.model_validate(recipe(
        str(tmp_path), methods=["base", "prour"], domains=["retail"], tasks=["retail:65"]))
    run_dir = tmp_path / "run"
    evaluation = Evaluation(loaded, run_dir, progress=False,
                            builder=Builder(loaded, scripted_llms()))
    try:
        evaluation.run()
    finally:
        evaluation.close()
    measured = posthoc_uncertainty(run_dir, loaded, Builder(loaded, scripted_llms()))
    base = [t for t in read_trajectories(run_dir / EPISODES_FILE) if t.agent == "base"]
    assert base and set(measured) == {result_key(t.key) for t in base}  # prour records its own
    states = set()
    for trajectory in base:
        decisions = [s for s in trajectory.steps if is_agent_turn(s)][:16]
        records = measured[result_key(trajectory.key)]
        assert [r["step"] for r in records] == list(range(len(decisions)))
        for record, step in zip(records, decisions):
            states.add(expected_state(trajectory, step))
            au, eu = expected_uncertainty(expected_state(trajectory, step))
            assert (record["au"], record["eu"]) == (pytest.approx(au), pytest.approx(eu))
            assert record["total"] == pytest.approx(au + eu)
    assert states == {"clarify", "verify"}  # both hand-computed cases (AU > 0 and AU = 0)
    rows = len(read_jsonl(run_dir / POSTHOC_FILE))
    # the report option reads the run's recipe.resolved.yaml and resumes: no new line
    register_scripts()
    result = CliRunner().invoke(app, ["report", str(run_dir), "--posthoc-uncertainty",
                                      "--n-boot", "20", "--out", str(tmp_path / "report")])
    assert result.exit_code == 0, result.output
    assert f"post-hoc AU/EU: {len(base)} episode(s)" in result.output
    assert len(read_jsonl(run_dir / POSTHOC_FILE)) == rows
    written = {"uncertainty_over_steps": tmp_path / "report" / "uncertainty_over_steps.png"}
    series = read_plot(written["uncertainty_over_steps"])["series"]
    assert "prour" in series["au"]  # the recorded curve beside the post-hoc one
    for key in ("au", "eu", "total"):
        curve = dict(zip(series[key]["base (post-hoc)"]["x"], series[key]["base (post-hoc)"]["y"]))
        by_step: dict[int, list[float]] = {}
        for records in measured.values():
            for r in records:
                by_step.setdefault(r["step"] + 1, []).append(r[key])
        assert curve == pytest.approx({s: sum(v) / len(v) for s, v in by_step.items()})
