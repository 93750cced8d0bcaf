"""tau2's natural-language assertion check as prour runs it, on τ³ retail tasks: a task without
assertions scores the product of its other checks offline, as tau2's own ``evaluate_simulation``
does; the judge's prompt is the one tau2's evaluator sends (tau2 imported with litellm from the
dev install, its model call replaced by a recorder), and a reply gives tau2's verdicts, check and
combined reward."""

from __future__ import annotations

import json
import os
import re
from typing import Any

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network call at litellm import

from prour.config import EnvConfig
from prour.env.agents import LLMAgent, OracleAgent
from prour.env.domains import get_task
from prour.env.nl_assertions import (
    judge_messages,
    nl_check,
    nl_prompt,
    parse_verdicts,
    reply_format,
    tau2_judge_model,
    tau2_judge_temperature,
)
from prour.env.runner import run_episode
from prour.env.scoring import score_episode, to_tau2_messages
from prour.env.trajectory import Trajectory
from prour.env.users import LLMUser, OracleUser
from prour.llm.scripted import ScriptedLLM

SPLIT = "tau3"
# τ³ retail 0 and 1 score on DB and NL_ASSERTION and list no assertion; both need a write
# (exchange_delivered_order_items), so an agent that never writes fails the DB check.
NO_ASSERTIONS = ("0", "1")
TWO = ["Agent should tell the user the order total is $829.43.",
       "Agent should tell the user the tracking number is 840887978435."]


def idle_episode(task_id: str) -> Trajectory:
    """An agent that asks one question and never calls a tool, a user who then stops."""
    env = EnvConfig()
    agent = LLMAgent(ScriptedLLM(replies=["Could you tell me more?", "Thanks."]), env)
    user = LLMUser(ScriptedLLM(replies=["I need help with an order.", "###STOP###"]), env)
    return run_episode("retail", get_task("retail", task_id, SPLIT), agent, user, limits=env,
                       split=SPLIT)


def oracle_episode(task_id: str) -> Trajectory:
    return run_episode("retail", get_task("retail", task_id, SPLIT), OracleAgent(), OracleUser(),
                       limits=EnvConfig(max_steps=200), split=SPLIT)


@pytest.fixture(scope="module")
def episodes() -> dict[str, Trajectory]:
    return {"oracle": oracle_episode("0"), "idle": idle_episode("1")}


@pytest.fixture(scope="module")
def litellm() -> None:
    """tau2's evaluator modules import litellm (the dev extra brings it: `make install-dev`)."""
    pytest.importorskip("litellm", reason="tau2's NL-assertion evaluator needs litellm: "
                        "make install-dev (the dev extra pins it)")


def db_check(task: Any, trajectory: Trajectory) -> float:
    """tau2's database check of the episode, computed here with tau2's EnvironmentEvaluator."""
    from tau2.evaluator.evaluator_env import EnvironmentEvaluator

    from prour.env.environment import environment_constructor

    info = EnvironmentEvaluator.calculate_reward(
        environment_constructor=environment_constructor("retail"), task=task,
        full_trajectory=to_tau2_messages(trajectory))
    return float(info.db_check.db_reward)


@pytest.mark.parametrize("which, task_id, expected_db", [("oracle", "0", 1.0), ("idle", "1", 0.0)])
def test_a_task_without_assertions_scores_its_db_check(episodes, which, task_id,
                                                       expected_db) -> None:
    task = get_task("retail", task_id, SPLIT)
    assert [k.value for k in task.evaluation_criteria.reward_basis] == ["DB", "NL_ASSERTION"]
    assert not task.evaluation_criteria.nl_assertions
    trajectory = episodes[which]
    assert trajectory.termination == "user_stop"
    assert db_check(task, trajectory) == expected_db  # the oracle's writes match, none does not
    for assertions in (None, []):  # τ³ leaves the list out; an empty one is the same to tau2
        task.evaluation_criteria.nl_assertions = assertions
        reward, breakdown = score_episode("retail", task, trajectory)
        assert reward == expected_db * 1.0
        assert breakdown["checks"] == {"DB": expected_db, "NL_ASSERTION": 1.0}
        assert breakdown["not_evaluated"] == []
    assert trajectory.reward == expected_db  # what the episode recorded when it ran


def test_a_task_with_assertions_stays_unscored(episodes) -> None:
    task = get_task("retail", "0", SPLIT)
    task.evaluation_criteria.nl_assertions = TWO
    reward, breakdown = score_episode("retail", task, episodes["oracle"])
    assert reward is None
    assert breakdown["checks"] == {"DB": 1.0}
    assert breakdown["not_evaluated"] == ["NL_ASSERTION"]


def test_the_offline_score_is_tau2s_evaluate_simulation(episodes, litellm) -> None:
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation

    from prour.env.tau2_export import simulation_run

    for which, task_id in (("oracle", "0"), ("idle", "1")):
        task = get_task("retail", task_id, SPLIT)
        trajectory = episodes[which]
        info = evaluate_simulation(simulation_run(trajectory, 0), task,
                                   EvaluationType.ALL_WITH_NL_ASSERTIONS, False, "retail")
        assert score_episode("retail", task, trajectory)[0] == info.reward
        assert {k.value: v for k, v in info.reward_breakdown.items()} == \
            trajectory.reward_breakdown["checks"]


def reply(assertions: list[str], met: list[bool]) -> str:
    """A judge reply in the format tau2's prompt asks for."""
    return json.dumps({"results": [
        {"expectedOutcome": a, "reasoning": f"checked {i}", "metExpectation": m}
        for i, (a, m) in enumerate(zip(assertions, met))]})


@pytest.fixture
def tau2_judge(monkeypatch, litellm):
    """tau2's NL-assertion evaluator module with its model call replaced: ``sent`` records what
    tau2 sends, ``answer[0]`` is what the model replies."""
    import tau2.evaluator.evaluator_nl_assertions as module
    from tau2.data_model.message import AssistantMessage

    sent: dict[str, Any] = {}
    answer: list[str] = [""]

    def generate(model: str, messages: list[Any], **kwargs: Any) -> Any:
        sent.update(model=model, messages=messages, kwargs=kwargs)
        return AssistantMessage(role="assistant", content=answer[0])

    monkeypatch.setattr(module, "generate", generate)
    return module, sent, answer


@pytest.mark.parametrize("met", [[True, True], [True, False]])
def test_the_prompt_verdicts_and_check_are_tau2s(episodes, tau2_judge, met) -> None:
    module, sent, answer = tau2_judge
    task = get_task("retail", "0", SPLIT)
    task.evaluation_criteria.nl_assertions = TWO
    messages = to_tau2_messages(episodes["oracle"])
    answer[0] = reply(TWO, met)
    info = module.NLAssertionsEvaluator.calculate_reward(task=task, full_trajectory=messages)

    ours = judge_messages(messages, TWO)
    assert [m.role for m in sent["messages"]] == ["system", "user"]
    assert ours == [{"role": m.role, "content": m.content} for m in sent["messages"]]
    assert "expectedOutcomes" in ours[1]["content"] and str(TWO) in ours[1]["content"]
    assert sent["model"] == tau2_judge_model()
    assert sent["kwargs"] == {"temperature": tau2_judge_temperature()}
    verdicts = parse_verdicts(json.loads(answer[0]), len(TWO))
    assert [(v["assertion"], v["met"], v["reasoning"]) for v in verdicts] == \
        [(c.nl_assertion, c.met, c.justification) for c in info.nl_assertions]
    assert nl_check(verdicts) == info.reward == (1.0 if all(met) else 0.0)


@pytest.mark.parametrize("which, task_id", [("oracle", "0"), ("idle", "1")])
@pytest.mark.parametrize("met", [[True, True], [False, True]])
def test_a_judged_line_has_tau2s_reward(episodes, tau2_judge, which, task_id, met) -> None:
    """The judge pass's product (prour.eval.nl_judge.scored_line) equals tau2's
    evaluate_simulation with NL assertions, given the same reply."""
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation

    from prour.env.tau2_export import simulation_run
    from prour.eval.nl_judge import scored_line

    _, _, answer = tau2_judge
    task = get_task("retail", task_id, SPLIT)
    task.evaluation_criteria.nl_assertions = TWO
    trajectory = episodes[which]
    answer[0] = reply(TWO, met)
    info = evaluate_simulation(simulation_run(trajectory, 0), task,
                               EvaluationType.ALL_WITH_NL_ASSERTIONS, False, "retail")
    checks = {"DB": trajectory.reward_breakdown["checks"]["DB"]}
    nl = nl_check(parse_verdicts(json.loads(answer[0]), len(TWO)))
    line = scored_line({"key": ["retail", task_id, 0, "x"], "unscored": True},
                       ["DB", "NL_ASSERTION"], checks, nl, {"judge": None})
    assert line["reward"] == info.reward == checks["DB"] * (1.0 if all(met) else 0.0)


@pytest.mark.parametrize("data, error", [
    ({"result": []}, "expected a list under 'results'"),
    ({"results": [{"expectedOutcome": "a", "reasoning": "r", "metExpectation": True}]},
     "grades 1 outcome(s); the input lists 2"),
    ({"results": [{"expectedOutcome": "a", "reasoning": "r", "metExpectation": "true"},
                  {"expectedOutcome": "b", "reasoning": "r", "metExpectation": True}]},
     "results[0].metExpectation must be true or false, got 'true'"),
    ({"results": [{"expectedOutcome": "a", "metExpectation": True},
                  {"expectedOutcome": "b", "reasoning": "r", "metExpectation": True}]},
     "results[0] lacks ['reasoning']"),
])
def test_a_reply_that_does_not_grade_every_assertion_is_refused(data, error) -> None:
    with pytest.raises(ValueError, match=re.escape(error)):
        parse_verdicts(data, 2)


def test_the_prompt_and_reply_format_are_read_from_tau2s_source() -> None:
    """Without importing tau2's evaluator: the texts are its literals (spot checks of what the
    litellm test compares in full)."""
    prompt = nl_prompt()
    assert "expectedOutcome" in prompt.system and "metExpectation" in prompt.system
    names = [name for _, name in prompt.user if name is not None]
    assert names == ["trajectory_str", "nl_assertions"]
    fmt = reply_format()
    assert (fmt.results, fmt.assertion, fmt.met, fmt.reasoning) == \
        ("results", "expectedOutcome", "metExpectation", "reasoning")
