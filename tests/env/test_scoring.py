"""Scoring with tau2's evaluators: the oracle replay scores 1.0 on every test task of the three
domains, one corrupted write scores 0, early endings score 0, NL assertions are not faked."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest

from prour.config import EnvConfig
from prour.env.agents import OracleAgent
from prour.env.domains import DOMAINS, get_task, load_tasks
from prour.env.environment import tool_types
from prour.env.runner import run_episode
from prour.env.scoring import score_episode, to_tau2_messages
from prour.env.trajectory import StepRecord
from prour.env.users import OracleUser


def _oracle(domain: str, task: Any, **kwargs: Any):
    return run_episode(domain, task, OracleAgent(), OracleUser(), limits=EnvConfig(max_steps=200),
                       **kwargs)


def _oracle_outcome(job: tuple[str, str]) -> tuple[str, Any, Any, Any, Any]:
    """Run the oracle on one task (in a worker process); return what the assertion needs."""
    domain, task_id = job
    traj = _oracle(domain, get_task(domain, task_id))
    checks = traj.reward_breakdown.get("checks", {})
    return task_id, traj.termination, traj.reward, checks, traj.errors


def _oracle_failures(domain: str, every: int) -> list[tuple[str, Any, Any, Any, Any]]:
    """Replay every ``every``-th test task of ``domain`` with the oracle; the outcomes that are
    not a user stop scored 1.0 by every check."""
    jobs = [(domain, task.id) for task in load_tasks(domain, "test")[::every]]
    # Two worker processes: the cost is loading tau2's databases (three per episode: the episode's
    # own and the evaluator's two), which is CPU-bound Python.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=2, mp_context=context) as pool:
        outcomes = list(pool.map(_oracle_outcome, jobs))
    assert len(outcomes) == len(jobs) > 0
    return [o for o in outcomes
            if o[1] != "user_stop" or o[2] != 1.0 or o[4] or set(o[3].values()) != {1.0}]


@pytest.mark.slow  # ~1-2 s of CPU per episode (tau2 database loads and hashes)
@pytest.mark.parametrize("domain", DOMAINS)
def test_oracle_scores_one_on_every_sixth_test_task(domain: str) -> None:
    """CI's share of the check below: a sixth of each domain's test tasks, spread over the split."""
    assert _oracle_failures(domain, every=6) == []


@pytest.mark.full  # the whole test split of each domain: ~75 s on two cores
@pytest.mark.parametrize("domain", DOMAINS)
def test_oracle_scores_one_on_every_test_task(domain: str) -> None:
    assert _oracle_failures(domain, every=1) == []


def _first_write_with_arguments(domain: str) -> tuple[Any, int]:
    """The first test task whose first write action has arguments, and that action's index."""
    kinds = {"assistant": tool_types(domain), "user": tool_types(domain, "user")}
    for task in load_tasks(domain, "test"):
        for index, action in enumerate(task.evaluation_criteria.actions or []):
            if kinds[action.requestor].get(action.name) == "write":
                if action.arguments:
                    return task, index
                break
    raise AssertionError(f"no {domain} test task starts its writes with arguments")


def _corrupt(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "_x"
    if isinstance(value, list) and value:
        return [_corrupt(value[0]), *value[1:]]
    raise AssertionError(f"cannot corrupt {value!r}")


@pytest.mark.parametrize("domain", DOMAINS)
def test_one_corrupted_write_scores_zero(domain: str) -> None:
    task, index = _first_write_with_arguments(domain)
    actions = [action.model_copy(deep=True) for action in task.evaluation_criteria.actions]
    first_key = next(iter(actions[index].arguments))
    actions[index].arguments[first_key] = _corrupt(actions[index].arguments[first_key])
    communicate = list(task.evaluation_criteria.communicate_info or [])
    traj = run_episode(
        domain, task, OracleAgent(actions, communicate), OracleUser(actions),
        limits=EnvConfig(max_steps=200),
    )
    assert traj.termination == "user_stop"
    assert traj.errors == []
    assert traj.reward == 0.0
    assert 0.0 in traj.reward_breakdown["checks"].values()
    assert traj.reward_breakdown["failed"]
    honest = _oracle(domain, task)
    assert honest.reward == 1.0


def test_an_episode_cut_by_the_step_limit_scores_zero() -> None:
    task = get_task("airline", "2")
    traj = run_episode("airline", task, OracleAgent(), OracleUser(), limits=EnvConfig(max_steps=2))
    assert traj.termination == "max_steps"
    assert traj.reward == 0.0
    assert "ended early" in traj.reward_breakdown["note"]


def test_nl_assertions_in_the_basis_are_reported_not_evaluated() -> None:
    from tau2.data_model.tasks import RewardType

    task = get_task("retail", "5")
    traj = _oracle("retail", task)
    task.evaluation_criteria.reward_basis = [RewardType.DB, RewardType.NL_ASSERTION]
    task.evaluation_criteria.nl_assertions = ["Agent should confirm the change to the user."]
    reward, breakdown = score_episode("retail", task, traj)
    assert reward is None
    assert breakdown["not_evaluated"] == ["NL_ASSERTION"]
    assert breakdown["checks"] == {"DB": 1.0}
    # no assertion to judge: tau2 scores the check 1 without a model (tests/env/test_nl_assertions)
    task.evaluation_criteria.nl_assertions = []
    assert score_episode("retail", task, traj)[0] == 1.0


def _insert(traj: Any, index: int, message: dict[str, Any], step: StepRecord) -> None:
    """Put ``message`` at ``index`` of the transcript, its step among the steps in order."""
    traj.messages.insert(index, message)
    for other in traj.steps:
        if other.message_index >= index:
            other.message_index += 1
    step.message_index = index
    traj.steps.insert(sum(s.message_index < index for s in traj.steps), step)


def _unsent_call(call_id: str) -> dict[str, Any]:
    """A call that never reached the environment (well-formed JSON, so that only the step's
    ``executed: false`` keeps it out)."""
    return {"id": call_id, "type": "function",
            "function": {"name": "get_order_details", "arguments": '{"order_id": "#W0000000"}'}}


def _unsent_result(call_id: str) -> tuple[dict[str, Any], StepRecord]:
    return ({"role": "tool", "tool_call_id": call_id, "name": "get_order_details",
             "content": "Error: the call was malformed and not run"},
            StepRecord(kind="tool_result", message_index=0, requestor="assistant",
                       tool_name="get_order_details", tool_call_id=call_id, is_error=True,
                       executed=False))


def test_tau2_messages_leave_out_system_and_unexecuted_calls() -> None:
    """The oracle's episode with two calls that never ran added: one beside an executed call in
    the same assistant turn, one alone in a turn of its own, each with its (unexecuted) result.
    tau2 gets exactly the oracle's executed calls and results: no unexecuted call, no result of
    one, and no turn that held only such a call."""
    task = get_task("retail", "5")
    traj = _oracle("retail", task)
    before = to_tau2_messages(traj)
    first = next(s for s in traj.steps if s.kind == "agent_tool_call")
    traj.messages[first.message_index]["tool_calls"].append(_unsent_call("unsent-1"))
    after_results = max(s.message_index for s in traj.steps if s.kind == "tool_result"
                        and s.tool_call_id in {c["id"] for c in
                                               traj.messages[first.message_index]["tool_calls"]})
    _insert(traj, after_results + 1, *_unsent_result("unsent-1"))
    last = len(traj.messages) - 1  # before the user's closing message
    _insert(traj, last, {"role": "assistant", "content": "",
                         "tool_calls": [_unsent_call("unsent-2")]},
            StepRecord(kind="agent_tool_call", message_index=0, requestor="assistant"))
    _insert(traj, last + 1, *_unsent_result("unsent-2"))
    assert sum(not s.executed for s in traj.steps) == 2

    messages = to_tau2_messages(traj)
    assert [m.role for m in messages][:2] == ["assistant", "user"]
    assert all(m.role != "system" for m in messages)
    calls = [c.id for m in messages if m.role == "assistant" for c in m.tool_calls or []]
    results = [m.id for m in messages if m.role == "tool"]
    assert "unsent-1" not in calls + results and "unsent-2" not in calls + results
    assert len(calls) == len(task.evaluation_criteria.actions)
    assert calls == [c.id for m in before if m.role == "assistant" for c in m.tool_calls or []]
    assert results == [m.id for m in before if m.role == "tool"]
    assert len(messages) == len(before)  # the turn holding only an unsent call is left out
