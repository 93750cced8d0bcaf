"""data.verify_target: the agent's own next call, or the task's next reference action (gold).

One episode on tau2 retail train task 30, collected with scripted models: the agent takes the
task's first reference action, replies to the user once, takes the second, then makes one call
the reference does not have (a detour) and goes on with the rest of the reference actions. The
expected targets are written from the task's reference actions and the transcript alone.
"""

from __future__ import annotations

import json

import pytest
from loguru import logger

from prour.config import EnvConfig
from prour.config.data import DataConfig
from prour.data.collect import EpisodeFactories, collect_trajectories, load_trajectories
from prour.data.decision_states import decision_states, target_of
from prour.env.agents import LLMAgent
from prour.env.domains import get_task, load_tasks
from prour.env.users import LLMUser
from prour.llm.scripted import ScriptedLLM

logger.disable("tau2")

TASK = "30"
CHECK = "I found that order. Shall I go on?"
CLOSING = "Thank you, your request is complete."
OPENING = "Hi, I am Olivia Lopez, zip 76171. I need help with my orders."
DETOUR = {"name": "list_all_product_types", "arguments": {}}
DETOUR_AT = 2  # the detour is the agent's third tool call


def gold_actions() -> list[dict]:
    actions = get_task("retail", TASK).evaluation_criteria.actions
    return [{"name": a.name, "arguments": a.arguments} for a in actions
            if a.requestor == "assistant"]


def canonical(call: dict) -> str:
    return json.dumps({"tool": call["name"], "arguments": call["arguments"]}, sort_keys=True,
                      separators=(",", ":"))


def agent_reply(messages: list[dict]) -> str:
    gold = gold_actions()
    done = sum(1 for m in messages if m.get("role") == "assistant" and m.get("tool_calls"))
    if done == 1 and messages[-1].get("role") == "tool":
        return CHECK
    if done == DETOUR_AT:
        return f"<tool_call>{json.dumps(DETOUR)}</tool_call>"
    k = done if done < DETOUR_AT else done - 1
    return f"<tool_call>{json.dumps(gold[k])}</tool_call>" if k < len(gold) else CLOSING


def user_reply(messages: list[dict]) -> str:
    said = messages[-1].get("content") or "" if messages else ""
    if "complete" in said:
        return "###STOP###"
    return "Yes, go ahead." if CHECK in said else OPENING


@pytest.fixture(scope="module")
def trajectory(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gold")
    cfg = DataConfig(num_trajectories=1, trial_seeds=[0], concurrency=1, teacher=False)
    tasks = [t for t in load_tasks("retail", "train") if t.id == TASK]
    factories = EpisodeFactories(lambda: LLMAgent(ScriptedLLM(rules=[(r".", agent_reply)]), EnvConfig()),
                                 lambda: LLMUser(ScriptedLLM(rules=[(r".", user_reply)]), EnvConfig()),
                                 None, cfg)
    collect_trajectories(tasks, factories, cfg, folder / "traj.jsonl", progress=False,
                         limits=EnvConfig())
    [traj] = load_trajectories(folder / "traj.jsonl", "error")
    return traj


def verify_targets(traj, **data) -> list[tuple[str | None, str | None]]:
    cfg = DataConfig(max_decisions=64, **data)
    return [target_of(state, "verify", {}, cfg) for state in decision_states(traj, cfg)]


def test_the_episode_is_the_scripted_one(trajectory) -> None:
    gold = gold_actions()
    calls = [c["function"] for m in trajectory.messages for c in m.get("tool_calls") or []]
    made = [{"name": c["name"], "arguments": json.loads(c["arguments"])} for c in calls]
    assert made == [gold[0], gold[1], DETOUR, *gold[2:]]
    assert len(gold) >= 4 and trajectory.termination == "user_stop"


def test_gold_targets_follow_the_reference_until_the_agent_leaves_it(trajectory) -> None:
    gold = [canonical(a) for a in gold_actions()]
    out = verify_targets(trajectory, verify_target="gold")
    # decisions: 0 call g0 | 1 reply | 2 call g1 | 3 detour | 4.. g2 .. | last: closing reply
    assert out[:4] == [(gold[0], None), (gold[1], None), (gold[1], None), (gold[2], None)]
    assert out[4:] == [(None, "verify_off_reference")] * (len(out) - 4)
    assert len(out) == 1 + 1 + 1 + 1 + (len(gold) - 2) + 1


def test_agent_targets_are_the_agents_own_calls(trajectory) -> None:
    gold = [canonical(a) for a in gold_actions()]
    out = verify_targets(trajectory)  # the default: data.verify_target = agent
    assert DataConfig().verify_target == "agent"
    assert out == [(gold[0], None), (None, "verify_reply"), (gold[1], None),
                   (canonical(DETOUR), None), *((g, None) for g in gold[2:]),
                   (None, "verify_reply")]


def test_after_the_last_reference_action_the_gold_target_is_a_reply(trajectory) -> None:
    """Once every reference action is taken, the gold next action is the reply: dropped or
    ``respond`` as data.verify_on_reply says. Calls out of order leave the reference path."""
    from dataclasses import replace

    from prour.data.decision_states import gold_next

    reference = [a for a in get_task("retail", TASK).evaluation_criteria.actions
                 if a.requestor == "assistant"]
    calls = [{"name": a.name, "arguments": json.dumps(a.arguments)} for a in reference]
    assert gold_next(reference, calls[:2]).action == canonical(gold_actions()[2])
    assert not gold_next(reference, [calls[1], calls[0]]).on_reference
    assert not gold_next(reference, [*calls, calls[0]]).on_reference
    done = gold_next(reference, calls)
    assert (done.action, done.on_reference) == (None, True)
    cfg = DataConfig(verify_target="gold")
    state = replace(decision_states(trajectory, cfg)[0], gold=done)
    assert target_of(state, "verify", {}, cfg) == (None, "verify_reply")
    respond = cfg.model_copy(update={"verify_on_reply": "respond"})
    assert target_of(state, "verify", {}, respond) == ('{"arguments":{},"tool":"respond"}', None)
