"""``ask-before-plan`` end to end on 2 retail + 2 airline tasks with scripted models.

The scripted task agent carries out its plan at once: one mutating call (a cancellation of an
order or reservation that does not exist, which tau2 refuses), then it closes. The scripted
clarification predictor (the agent backbone) predicts a need until the customer has answered a
question. So: decision 0 is predicted to need clarification and the question, written on the
backbone with the query generator's clarify prompt (never with models.generator), goes to the user; decision 1 is predicted clear and the agent makes its mutating call; decision 2 comes
after the plan started, so the predictor is not asked and the agent closes.
"""

from __future__ import annotations

import json

import pytest
from eval_world import (
    CLARIFY_ANSWER,
    CLARIFY_Q,
    CLOSING,
    TASKS,
    domain_of,
    generator_llm,
    tool_call,
)
from method_run import check_report, run_method

from prour.llm.scripted import ScriptedLLM

WRITE = {"retail": ("cancel_pending_order", {"order_id": "#W0000000", "reason": "not needed"}),
         "airline": ("cancel_reservation", {"reservation_id": "ZZZZZZ"})}
PREDICTOR = r"You are the clarification agent"


def planner_reply(messages: list[dict]) -> str:
    """The task agent: its mutating call first, then the closing message."""
    if any(m.get("role") == "tool" for m in messages):
        return CLOSING
    return tool_call(*WRITE[domain_of(messages)])


def prediction(messages: list[dict]) -> str:
    text = "\n".join(str(m.get("content") or "") for m in messages)
    needed = CLARIFY_ANSWER not in text
    return json.dumps({"clarification_needed": needed,
                       "missing": "which replacement the customer wants" if needed else ""})


def backbone(predictor_reply) -> ScriptedLLM:
    """The agent backbone: predictor, question writer (the clarify prompt) and task agent."""
    writer = generator_llm().rules[0]
    return ScriptedLLM(rules=[(PREDICTOR, predictor_reply), writer, (r".", planner_reply)])


@pytest.mark.parametrize("domain_task", TASKS)
def test_ask_before_plan_asks_only_before_the_first_mutating_action(abp_run, domain_task):
    domain, task = domain_task.split(":")
    run = abp_run
    assert run.turns(domain, task) == ["clarify", "act", "act"]
    steps = run.agent_steps(domain, task)
    decisions = [s.meta["decision"] for s in steps]
    assert decisions[0] == {"router": "ask-before-plan", "phase": "before-plan", "valid": True,
                            "route": "clarify", "needed": True,
                            "missing": "which replacement the customer wants"}
    assert decisions[1] == {"router": "ask-before-plan", "phase": "before-plan", "valid": True,
                            "route": "act", "needed": False, "missing": ""}
    assert decisions[2] == {"router": "ask-before-plan", "route": "act", "phase": "execution"}
    traj = run.episode(domain, task)
    assert traj.messages[steps[0].message_index] == {"role": "assistant", "content": CLARIFY_Q}
    assert steps[1].kind == "agent_tool_call"
    assert traj.messages[steps[1].message_index]["tool_calls"][0]["function"]["name"] == \
        WRITE[domain][0]
    # predictor at the two decisions before the plan, one question, the agent's two turns,
    # the user's opening, answer and stop
    assert run.calls(domain, task) == {"clarification_predictor.chat": 2,
                                       "question_writer.chat": 1, "agent.chat": 2, "user.chat": 3}


@pytest.fixture(scope="module")
def abp_run(tmp_path_factory):
    run = run_method("ask-before-plan", tmp_path_factory.mktemp("abp"),
                     llms={"agent": backbone(prediction)})
    check_report(run)
    assert run.system()["calls_by_role"]["clarification_predictor"] == pytest.approx(2.0)
    # its questions are the backbone's (models.agent), and the report says so
    assert {line["question_writer"] for line in run.lines} == {"eval-agent"}
    assert "| ask-before-plan | `eval-agent` |" in run.markdown
    return run


def test_an_invalid_prediction_lets_the_agent_act(tmp_path) -> None:
    run = run_method("ask-before-plan", tmp_path, llms={"agent": backbone("maybe?")},
                     tasks=["retail:65", "airline:26"])
    for domain, task in (("retail", "65"), ("airline", "26")):
        assert run.turns(domain, task) == ["act", "act"]
        first = run.agent_steps(domain, task)[0].meta["decision"]
        assert first["valid"] is False and first["route"] == "act"
        assert first["error"].startswith("not valid JSON")
        assert "question_writer.chat" not in run.calls(domain, task)
        assert "generator.chat" not in run.calls(domain, task)
