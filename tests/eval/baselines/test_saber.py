"""``saber`` end to end on 2 retail + 2 airline tasks with scripted models.

The task agent replays each task's reference actions (task_replay.py). Retail 5 and airline 2 end
with a tau2 WRITE call, retail 65 and airline 26 only read. The reviewer (the agent backbone,
role ``reflection``) asks to revise retail 5's write once and lets airline 2's proceed; the user
says yes to every confirmation request. Expected turns and calls are derived from each task's
reference actions.
"""

from __future__ import annotations

import json

import pytest
from eval_world import TASKS
from method_run import check_report, run_method
from task_replay import CONSENT, replay_for_task, user_llm

from prour.env.domains import get_task
from prour.env.environment import tool_types
from prour.env.trajectory import user_view
from prour.eval.baselines.saber import REFLECTION_PREFIX, confirmation_text
from prour.llm.base import ToolCall
from prour.llm.scripted import ScriptedLLM

ISSUE = "Check that the order is delivered before returning items."
REVISED = {"retail:5"}  # the reviewer's first verdict on this task's write is "revise"


def reviewer_reply(messages: list[dict]) -> str:
    from task_replay import task_of

    domain, task_id = task_of(messages)
    if f"{domain}:{task_id}" in REVISED:
        return json.dumps({"verdict": "revise", "issue": ISSUE})
    return json.dumps({"verdict": "proceed"})


def saber_agent_llm() -> ScriptedLLM:
    return ScriptedLLM(rules=[(r"You review one action of a customer service agent",
                               reviewer_reply), (r".", replay_for_task())])


def reference_calls(domain: str, task_id: str) -> list[ToolCall]:
    actions = get_task(domain, task_id).evaluation_criteria.actions or []
    return [ToolCall(a.name, dict(a.arguments)) for a in actions if a.requestor == "assistant"]


def expected_episode(key: str) -> tuple[list[str], dict[str, int]]:
    """Turn tags and model calls by hand: reads act; a write is first a confirmation request
    (after one review, and a second proposal when the review asked to revise), then runs once
    the user said yes; the closing message acts."""
    domain, task_id = key.split(":")
    calls = reference_calls(domain, task_id)
    writes = [c for c in calls if tool_types(domain)[c.name] == "write"]
    turns, agent = [], 0
    for call in calls:
        if call in writes:
            turns += ["confirm", "act"]
            agent += 2 + (key in REVISED)
        else:
            turns.append("act")
            agent += 1
    counts = {"agent.chat": agent + 1, "user.chat": 2 + len(writes)}
    if writes:
        counts["reflection.chat"] = len(writes)
    return [*turns, "act"], counts


@pytest.fixture(scope="module")
def saber_run(tmp_path_factory: pytest.TempPathFactory):
    return run_method("saber", tmp_path_factory.mktemp("saber"),
                      llms={"agent": saber_agent_llm(), "user": user_llm()})


def test_saber_confirms_each_write_before_it_runs(saber_run) -> None:
    run = saber_run
    for key in TASKS:
        domain, task_id = key.split(":")
        turns, calls = expected_episode(key)
        assert run.turns(domain, task_id) == turns, key
        assert run.calls(domain, task_id) == calls, key
        assert run.line(domain, task_id)["score"] == 1.0, key
        assert run.line(domain, task_id)["steps"] == {
            "act": turns.count("act"), "clarify": turns.count("confirm"), "verify": 0}
    assert sum("confirm" in run.turns(*k.split(":")) for k in TASKS) == 2
    check_report(run)


def test_the_write_runs_only_after_the_users_yes(saber_run) -> None:
    run = saber_run
    for domain, task_id in (("retail", "5"), ("airline", "2")):
        traj = run.episode(domain, task_id)
        [write] = [c for c in reference_calls(domain, task_id)
                   if tool_types(domain)[c.name] == "write"]
        steps = run.agent_steps(domain, task_id)
        [ask] = [s for s in steps if s.meta["turn"] == "confirm"]
        assert traj.messages[ask.message_index]["content"] == confirmation_text([write])
        assert ask.meta["decision"]["route"] == "confirm"
        assert ask.meta["decision"]["calls"] == [write.name]
        reply = traj.steps[traj.steps.index(ask) + 1]
        assert traj.messages[reply.message_index] == {"role": "user", "content": CONSENT}
        done = traj.steps[traj.steps.index(reply) + 1]
        assert done.meta["decision"]["gate"] == "confirmed"
        [called] = traj.messages[done.message_index]["tool_calls"]
        assert called["function"]["name"] == write.name
        assert json.loads(called["function"]["arguments"]) == write.arguments
        assert {"role": "assistant", "content": confirmation_text([write])} in user_view(
            traj.messages, traj.steps)


def test_a_revise_review_reaches_the_agent_only(saber_run) -> None:
    traj = saber_run.episode("retail", "5")
    [note] = [s for s in traj.steps if s.kind == "agent_note"]
    text = traj.messages[note.message_index]["content"]
    assert text.startswith(REFLECTION_PREFIX) and ISSUE in text
    assert not any(REFLECTION_PREFIX in (m.get("content") or "")
                   for m in user_view(traj.messages, traj.steps))
    [ask] = [s for s in saber_run.agent_steps("retail", "5") if s.meta["turn"] == "confirm"]
    assert ask.meta["decision"]["reflection"] == {"verdict": "revise", "issue": ISSUE,
                                                  "valid": True, "error": None}
    [airline] = [s for s in saber_run.agent_steps("airline", "2") if s.meta["turn"] == "confirm"]
    assert airline.meta["decision"]["reflection"]["verdict"] == "proceed"
    assert not any(s.kind == "agent_note" for s in saber_run.episode("airline", "2").steps)
