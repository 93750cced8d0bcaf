"""``sage-agent`` end to end on 2 retail + 2 airline tasks with scripted models.

The task agent replays each task's reference actions (task_replay.py) and is unsure of its first
call once: asked for more candidates (role ``sampler``, the agent backbone) before any question,
it alternates its own call with one whose first text argument differs, so the belief is 3/5 vs
2/5 and that argument's EVPI is 2/5 (hand computation below); once the question is in the
dialogue every candidate agrees. Airline 26 has no reference action: the agent only closes.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from eval_world import TASKS, tool_call
from method_run import check_report, run_method
from task_replay import replay_for_task, user_llm

from prour.env.domains import get_task
from prour.eval.baselines.sage_agent import question_text
from prour.llm.scripted import ScriptedLLM, render_prompt

ASKS = "could you tell me"
SAMPLES = 4  # eval.sage_agent.samples (default)


def first_text_argument(domain: str, task_id: str) -> tuple[str, str] | None:
    """(key, value) of the first text argument of the task's reference calls, if any."""
    for action in get_task(domain, task_id).evaluation_criteria.actions or []:
        for key, value in action.arguments.items():
            if isinstance(value, str):
                return key, value
    return None


def hesitant_agent_llm() -> ScriptedLLM:
    """The replay agent; before a question, every second reply to a prompt alters the call's
    first text argument (the agent's own call is the first reply, the samples follow)."""
    replay, seen = replay_for_task(), Counter()

    def reply(messages: list[dict]) -> str:
        text, prompt = replay(messages), render_prompt(messages)
        seen[prompt] += 1
        if ASKS in prompt or "<tool_call>" not in text or seen[prompt] % 2 == 1:
            return text
        call = json.loads(text.split("<tool_call>")[1].split("</tool_call>")[0])
        key = next(k for k, v in call["arguments"].items() if isinstance(v, str))
        return tool_call(call["name"], {**call["arguments"], key: "other-value"})

    return ScriptedLLM(rules=[(r".", reply)])


@pytest.fixture(scope="module")
def sage_run(tmp_path_factory: pytest.TempPathFactory):
    return run_method("sage-agent", tmp_path_factory.mktemp("sage"),
                      llms={"agent": hesitant_agent_llm(), "user": user_llm()})


def test_sage_asks_the_highest_evpi_question_once(sage_run) -> None:
    run = sage_run
    own, other = 3 / (SAMPLES + 1), 2 / (SAMPLES + 1)  # own call, then other, own, other, own
    evpi = (own + other) - own  # the argument splits them: the best of each value, minus acting
    for key in TASKS:
        domain, task_id = key.split(":")
        n = len(get_task(domain, task_id).evaluation_criteria.actions or [])
        target = first_text_argument(domain, task_id)
        steps = run.agent_steps(domain, task_id)
        assert run.line(domain, task_id)["score"] == 1.0, key
        if target is None:  # no tool call: the agent's message is never questioned
            assert run.turns(domain, task_id) == ["act"]
            assert steps[0].meta["decision"]["skipped"]
            assert run.calls(domain, task_id) == {"agent.chat": 1, "user.chat": 2}
            continue
        argument, value = target
        assert run.turns(domain, task_id) == ["clarify", *["act"] * (n + 1)], key
        decision = steps[0].meta["decision"]
        assert decision["route"] == "clarify" and decision["asked"] == argument
        assert decision["aspects"] == [{"aspect": argument, "evpi": pytest.approx(evpi),
                                        "cost": 0.1}]
        assert [b["p"] for b in decision["belief"]] == [pytest.approx(own),
                                                         pytest.approx(other)]
        question = run.episode(domain, task_id).messages[steps[0].message_index]["content"]
        assert question == question_text(argument, [json.dumps(value), '"other-value"'])
        assert all(s.meta["decision"]["asked"] is None for s in steps[1:-1])
        assert steps[-1].meta["decision"]["skipped"]  # the closing message
        # one own call and one batched sampler call per tool-call decision, one to close
        assert run.calls(domain, task_id) == {"agent.chat": n + 2, "sampler.chat": n + 1,
                                              "user.chat": 3}, key
        assert run.line(domain, task_id)["steps"] == {"act": n + 1, "clarify": 1, "verify": 0}
    check_report(run)


def test_the_sampler_asks_for_n_candidates_in_one_call(sage_run) -> None:
    traj = sage_run.episode("retail", "65")
    second = sage_run.agent_steps("retail", "65")[1]
    assert traj.messages[second.message_index]["tool_calls"][0]["function"]["name"] == \
        get_task("retail", "65").evaluation_criteria.actions[0].name
    assert [b["p"] for b in second.meta["decision"]["belief"]] == [1.0]
    assert second.meta["decision"]["aspects"] == []
