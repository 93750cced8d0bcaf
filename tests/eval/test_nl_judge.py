"""The NL-assertion judge pass on a small run folder of τ³ retail episodes, with a scripted judge
that answers in tau2's reply format: each unscored line gets the product of its checks computed
by hand, a judge that never answers validly leaves its lines unscored with the reason, a rerun
and a pass that finds the verdicts cached ask nothing, and the CLI runs it from a recipe."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from prour.build import Builder
from prour.cli.main import app
from prour.config import EnvConfig, Recipe
from prour.config.attention import AttentionConfig
from prour.env.agents import LLMAgent, OracleAgent
from prour.env.domains import get_task
from prour.env.runner import run_episode
from prour.env.trajectory import Trajectory, read_jsonl
from prour.env.users import LLMUser, OracleUser
from prour.eval.arms import Arm
from prour.eval.harness import EPISODES_FILE, RESULTS_FILE, load_result_lines, result_key
from prour.eval.nl_judge import CACHE_FILE, judge_nl_assertions
from prour.eval.results import result_line
from prour.files import append_jsonl
from prour.llm.scripted import ScriptedLLM, register_script

SPLIT = "tau3"
UNMET = "exchanging the pet bed"  # the scripted judge finds this assertion (task 19's second) unmet
ATTEMPTS = AttentionConfig().judge_attempts  # the judge's strict-JSON attempts (recipe default)
# τ³ retail tasks (reward basis DB and NL_ASSERTION) and what the episode's DB check is:
# 0 lists no assertion (its episode recorded as before prour followed tau2 there: unscored);
# 2 has one assertion, 19 two (the second unmet), 3 one; the oracle passes the DB check, the
# idle agent never writes, so task 3's (modify_pending_order_items) fails.
DB = {"0": 1.0, "2": 1.0, "19": 1.0, "3": 0.0}
NL = {"0": 1.0, "2": 1.0, "19": 0.0, "3": 1.0}
EXPECTED = {"0": 1.0 * 1.0, "2": 1.0 * 1.0, "19": 1.0 * 0.0, "3": 0.0 * 1.0}
COST, LAM = 1.6, 0.03  # an attention block on task 2's line (a study's): U = R - λA


def _idle(task_id: str) -> Trajectory:
    env = EnvConfig()
    agent = LLMAgent(ScriptedLLM(replies=["Could you tell me more?", "Thanks."]), env)
    user = LLMUser(ScriptedLLM(replies=["I need help with an order.", "###STOP###"]), env)
    return run_episode("retail", get_task("retail", task_id, SPLIT), agent, user, limits=env,
                       split=SPLIT)


def _oracle(task_id: str) -> Trajectory:
    return run_episode("retail", get_task("retail", task_id, SPLIT), OracleAgent(), OracleUser(),
                       limits=EnvConfig(max_steps=200), split=SPLIT)


@pytest.fixture(scope="module")
def episodes() -> dict[str, Trajectory]:
    out = {task_id: _oracle(task_id) for task_id in ("0", "2", "19")}
    out["3"] = _idle("3")
    old = out["0"]  # as scored before: the NL check listed as not evaluated, no reward
    assert old.reward_breakdown["checks"] == {"DB": 1.0, "NL_ASSERTION": 1.0}
    old.reward = None
    old.reward_breakdown = {**old.reward_breakdown, "checks": {"DB": 1.0},
                            "not_evaluated": ["NL_ASSERTION"]}
    return out


def write_run(folder: Path, episodes: dict[str, Trajectory]) -> Path:
    folder.mkdir(parents=True)
    for task_id, trajectory in episodes.items():
        append_jsonl(folder / EPISODES_FILE, json.loads(trajectory.to_json()))
        line = result_line(trajectory, Arm("base"))
        if task_id == "2":
            line["axes"] = {"backbone": "gpt-4.1"}
            line["attention"] = {"cost": COST, "lam": LAM, "utility": 0.0 - LAM * COST}
        append_jsonl(folder / RESULTS_FILE, line)
    return folder


def judge_reply(messages: list[dict[str, Any]]) -> str:
    """tau2's reply format: every expected outcome graded, met unless it is the UNMET one."""
    text = messages[1]["content"]
    outcomes = ast.literal_eval(text.split("expectedOutcomes:", 1)[1].strip())
    return json.dumps({"results": [
        {"expectedOutcome": o, "reasoning": "read the conversation",
         "metExpectation": UNMET not in o} for o in outcomes]})


def good_judge() -> ScriptedLLM:
    return ScriptedLLM(rules=[("expectedOutcomes:", judge_reply)])


def bad_judge() -> ScriptedLLM:
    return ScriptedLLM(default="All outcomes look met to me.")


def idle_judge() -> ScriptedLLM:
    return ScriptedLLM()  # no rule, no reply: any call fails


def run_pass(folder: Path, llm: ScriptedLLM):
    recipe = Recipe(name="nl", run_dir=str(folder.parent))
    return judge_nl_assertions(folder, recipe, Builder(recipe, {"nl_judge": llm}),
                               say=lambda _: None)


def latest(folder: Path) -> dict[str, dict[str, Any]]:
    return {line["task_id"]: line for line in load_result_lines(folder / RESULTS_FILE).values()}


def test_the_episodes_are_what_the_expectations_assume(episodes) -> None:
    for task_id, trajectory in episodes.items():
        assert trajectory.termination == "user_stop"
        assert trajectory.reward is None  # unscored: NL assertions
        assert trajectory.reward_breakdown["checks"] == {"DB": DB[task_id]}
        assert bool(get_task("retail", task_id, SPLIT).evaluation_criteria.nl_assertions) == \
            (task_id != "0")


def test_the_pass_scores_each_line_with_the_product_of_its_checks(episodes, tmp_path) -> None:
    folder = write_run(tmp_path / "run", episodes)
    before = len(read_jsonl(folder / RESULTS_FILE))
    judge = good_judge()
    tally = run_pass(folder, judge)
    assert (tally.pending, tally.offline, tally.judged, tally.failed) == (4, 1, 3, 0)
    assert judge.calls["chat_requests"] == 3  # one call per judged episode, none for task 0
    assert len(read_jsonl(folder / RESULTS_FILE)) == before + 4
    lines = latest(folder)
    for task_id, line in lines.items():
        assert line["reward"] == line["score"] == EXPECTED[task_id], task_id
        assert line["unscored"] is False and line["success"] is (EXPECTED[task_id] == 1.0)
        block = line["nl_assertions"]
        assert block["check"] == NL[task_id]
        assert block["checks"] == {"DB": DB[task_id], "NL_ASSERTION": NL[task_id]}
    assert lines["0"]["nl_assertions"]["judge"] is None  # no assertion: no model
    assert lines["2"]["nl_assertions"]["judge"] == {"role": "nl_judge", "model": "given"}
    assertions = get_task("retail", "19", SPLIT).evaluation_criteria.nl_assertions
    assert [(v["assertion"], v["met"]) for v in lines["19"]["nl_assertions"]["verdicts"]] == \
        [(assertions[0], True), (assertions[1], False)]
    # a study's line keeps its axes, and its utility follows the reward
    assert lines["2"]["axes"] == {"backbone": "gpt-4.1"}
    assert lines["2"]["attention"]["utility"] == pytest.approx(1.0 - LAM * COST)

    # a rerun judges nothing new and appends nothing
    again = run_pass(folder, idle_judge())
    assert again.pending == 0
    assert len(read_jsonl(folder / RESULTS_FILE)) == before + 4


def test_a_failing_judge_leaves_lines_unscored_with_the_reason(episodes, tmp_path) -> None:
    folder = write_run(tmp_path / "run", episodes)
    judge = bad_judge()
    tally = run_pass(folder, judge)
    assert (tally.offline, tally.judged, tally.failed) == (1, 0, 3)
    assert judge.calls["chat_requests"] == 3 * ATTEMPTS  # every attempt asked, then given up
    lines = latest(folder)
    assert lines["0"]["reward"] == 1.0  # needs no judge
    for task_id in ("2", "19", "3"):
        line = lines[task_id]
        assert (line["reward"], line["unscored"]) == (None, True)
        block = line["nl_assertions"]
        assert "not valid JSON" in block["error"] and block["attempts"] == ATTEMPTS
        assert "check" not in block
    assert not (folder / CACHE_FILE).exists() or not read_jsonl(folder / CACHE_FILE)

    # the next pass asks again and scores them
    tally = run_pass(folder, good_judge())
    assert (tally.pending, tally.judged, tally.failed) == (3, 3, 0)
    assert {k: v["reward"] for k, v in latest(folder).items()} == EXPECTED


def test_cached_verdicts_are_not_asked_again(episodes, tmp_path) -> None:
    """A pass cut after its judge answered (verdicts cached, lines not yet appended) resumes
    from the cache."""
    first = write_run(tmp_path / "first", episodes)
    run_pass(first, good_judge())
    second = write_run(tmp_path / "second", episodes)
    shutil.copy(first / CACHE_FILE, second / CACHE_FILE)
    judge = idle_judge()
    tally = run_pass(second, judge)
    assert (tally.judged, tally.cached) == (3, 3) and judge.calls["chat"] == 0
    lines = latest(second)
    assert {k: v["reward"] for k, v in lines.items()} == EXPECTED
    assert all(lines[k]["nl_assertions"]["cached"] for k in ("2", "19", "3"))


def test_unrelated_unscored_lines_are_left_alone(episodes, tmp_path) -> None:
    folder = write_run(tmp_path / "run", {"2": episodes["2"]})
    other = episodes["19"].model_copy(deep=True)
    other.reward_breakdown = {}  # scoring failed: nothing says NL assertions are missing
    append_jsonl(folder / EPISODES_FILE, json.loads(other.to_json()))
    append_jsonl(folder / RESULTS_FILE, result_line(other, Arm("base")))
    tally = run_pass(folder, good_judge())
    assert tally.judged == 1 and len(tally.skipped) == 1
    assert "unscored for another reason" in tally.skipped[0]
    assert latest(folder)["19"]["unscored"] is True


def _recipe(tmp_path: Path, script: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({"name": "nl", "run_dir": str(tmp_path),
                                    "models": {"judge": {"backend": "scripted",
                                                         "script": script}}}))
    return path


def test_the_command_judges_with_models_judge_when_nl_judge_is_absent(episodes, tmp_path) -> None:
    register_script("nl-judge-good", good_judge)
    register_script("nl-judge-bad", bad_judge)
    runner = CliRunner()
    folder = write_run(tmp_path / "run", episodes)
    failed = runner.invoke(app, ["nl-assertions", str(folder), "--recipe",
                                 str(_recipe(tmp_path, "nl-judge-bad"))])
    assert failed.exit_code == 1, failed.output
    assert "3 left unscored (last error: not valid JSON" in failed.output
    result = runner.invoke(app, ["nl-assertions", str(folder), "--recipe",
                                 str(_recipe(tmp_path, "nl-judge-good"))])
    assert result.exit_code == 0, result.output
    assert "3 judged by models.judge (scripted:nl-judge-good) (0 from the cache)" in result.output
    lines = latest(folder)
    assert {k: v["reward"] for k, v in lines.items()} == EXPECTED
    assert lines["19"]["nl_assertions"]["judge"] == {
        "role": "judge", "model": "scripted:nl-judge-good", "backend": "scripted"}
    assert result_key(lines["19"]["key"]) == result_key(episodes["19"].key)
