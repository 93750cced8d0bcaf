"""The read-only verifier on real tau2 retail and airline states, driven by a scripted model."""

from __future__ import annotations

import copy
import json

import pytest
from loguru import logger

from prour.config.rewards import RewardConfig
from prour.env.domains import get_task
from prour.env.environment import db_hash, execute_tool_call, make_env
from prour.llm.scripted import ScriptedLLM
from prour.rollout.grounding import INSUFFICIENT
from prour.rollout.verifier import ReadOnlyViolation, Verifier, environment_at

logger.disable("tau2")

RETAIL_TASK, RETAIL_ORDER = "0", "#W2378156"
AIRLINE_TASK, AIRLINE_USER = "0", "emma_kim_9957"


def _call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def _last_tool_output(messages) -> str:
    return [m for m in messages if m["role"] == "tool"][-1]["content"]


def _history(domain: str, task_id: str, user_text: str, name: str, arguments: dict) -> list[dict]:
    """A short real history: the user's request, one agent tool call and tau2's observation."""
    env = make_env(domain, get_task(domain, task_id))
    output, error = execute_tool_call(env, name, arguments, call_id="h1")
    assert not error, output
    call = {
        "id": "h1",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }
    return [
        {"role": "user", "content": user_text},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "h1", "name": name, "content": output},
    ]


@pytest.fixture(scope="module")
def retail():
    history = _history(
        "retail",
        RETAIL_TASK,
        "I am Yusuf Rossi, zip 19122; I want to exchange items.",
        "find_user_id_by_name_zip",
        {"first_name": "Yusuf", "last_name": "Rossi", "zip": "19122"},
    )
    return history, environment_at("retail", RETAIL_TASK, history)


@pytest.fixture(scope="module")
def airline():
    history = _history(
        "airline",
        AIRLINE_TASK,
        "Hi, I'm Emma Kim and I want to cancel a trip.",
        "get_user_details",
        {"user_id": AIRLINE_USER},
    )
    return history, environment_at("airline", AIRLINE_TASK, history)


def test_grounded_retail_answer_cites_the_tool_output(retail):
    history, env = retail
    truth = json.loads(
        execute_tool_call(copy.deepcopy(env), "get_order_details", {"order_id": RETAIL_ORDER})[0]
    )

    def answer(messages):
        status = json.loads(_last_tool_output(messages))["status"]
        return f'get_order_details(order_id="{RETAIL_ORDER}") returned status "{status}".'

    llm = ScriptedLLM(
        rules=[
            ("tool get_order_details returned", answer),
            ("Question to verify", _call("get_order_details", order_id=RETAIL_ORDER)),
        ]
    )
    before = db_hash(env)
    result = Verifier(llm, "retail", RewardConfig()).answer(
        f"What is the status of order {RETAIL_ORDER}?", history, env
    )
    assert result.grounded and result.evidence == "tool" and not result.failed
    assert f'"{truth["status"]}"' in result.answer
    assert [c.name for c in result.tool_calls] == ["get_order_details"]
    assert json.loads(result.tool_calls[0].output) == truth
    assert result.steps == 1 and result.refused == []
    assert db_hash(env) == before
    # only READ tools were offered to the model
    offered = {t["function"]["name"] for t in llm.chat_log[0].tools}
    assert (
        "get_order_details" in offered
        and "cancel_pending_order" not in offered
        and "calculate" not in offered
    )


def test_requested_write_tool_is_refused_and_db_unchanged_retail(retail):
    history, env = retail
    pending = next(o for o in env.tools.db.orders.values() if o.status == "pending")
    llm = ScriptedLLM(
        rules=[
            ("refused", "insufficient evidence"),
            (
                "Question",
                _call("cancel_pending_order", order_id=pending.order_id, reason="no longer needed"),
            ),
        ]
    )
    before = db_hash(env)
    result = Verifier(llm, "retail", RewardConfig()).answer("Can this order be cancelled?", history, env)
    assert result.refused == ["cancel_pending_order"]
    assert result.tool_calls[0].refused and "refused" in result.tool_calls[0].output
    assert result.answer == INSUFFICIENT and not result.grounded
    assert db_hash(env) == before and env.tools.db.orders[pending.order_id].status == "pending"


def test_write_and_generic_tools_refused_airline(airline):
    history, env = airline
    reservation = json.loads(history[-1]["content"])["reservations"][0]
    llm = ScriptedLLM(
        rules=[
            ("refused", "insufficient evidence"),
            (
                "Question",
                _call("cancel_reservation", reservation_id=reservation)
                + _call("calculate", expression="1+1"),
            ),
        ]
    )
    before = db_hash(env)
    result = Verifier(llm, "airline", RewardConfig()).answer(
        f"Is reservation {reservation} refundable?", history, env
    )
    assert result.refused == ["cancel_reservation", "calculate"]
    assert db_hash(env) == before
    assert env.tools.db.reservations[reservation].status != "cancelled"


def test_grounded_airline_computation(airline):
    history, env = airline
    reservation = json.loads(history[-1]["content"])["reservations"][0]

    def answer(messages):
        flights = json.loads(_last_tool_output(messages))["flights"]
        prices = [f["price"] for f in flights]
        return (
            f"Total = {' + '.join(map(str, prices))} = {sum(prices)} from get_reservation_details."
        )

    llm = ScriptedLLM(
        rules=[
            ("tool get_reservation_details returned", answer),
            ("Question", _call("get_reservation_details", reservation_id=reservation)),
        ]
    )
    result = Verifier(llm, "airline", RewardConfig()).answer(
        f"What did the flights of {reservation} cost?", history, env
    )
    truth = json.loads(
        execute_tool_call(env, "get_reservation_details", {"reservation_id": reservation})[0]
    )
    assert result.grounded and result.evidence in ("computation", "tool")
    assert str(sum(f["price"] for f in truth["flights"])) in result.answer


@pytest.mark.parametrize("final", ["The order is pending, I believe.", "insufficient evidence"])
def test_missing_data_gives_insufficient_evidence(retail, final):
    history, env = retail
    llm = ScriptedLLM(
        rules=[
            ("Order not found", final),
            ("Question", _call("get_order_details", order_id="#W0000000")),
        ]
    )
    result = Verifier(llm, "retail", RewardConfig()).answer("What is the status of order #W0000000?", history, env)
    assert result.tool_calls[0].error and "not found" in result.tool_calls[0].output
    assert result.answer == INSUFFICIENT and not result.grounded and not result.failed


def test_policy_quote_is_grounded_without_tools(airline):
    history, env = airline
    llm = ScriptedLLM(
        default='The policy says "You should deny user requests that are against this policy."'
    )
    result = Verifier(llm, "airline", RewardConfig()).answer("May the agent bend the rules?", history, env)
    assert result.grounded and result.evidence == "policy" and result.steps == 0


def test_at_most_max_steps_tool_rounds_and_batched_calls(retail):
    history, env = retail
    llm = ScriptedLLM(default=_call("get_order_details", order_id=RETAIL_ORDER))
    results = Verifier(llm, "retail", RewardConfig(verifier_max_steps=2)).answer_many(["q1?", "q2?", "q3?"], history, env)
    assert [r.steps for r in results] == [2, 2, 2]
    assert all(r.answer == INSUFFICIENT and not r.grounded for r in results)
    assert llm.calls["chat"] == 3 and llm.calls["chat_requests"] == 9  # one batched call per round
    assert llm.chat_log[-1].tools is None  # the last round offers no tools


def test_history_is_not_modified_and_verifier_calls_stay_out(retail):
    history, env = retail
    saved = copy.deepcopy(history)
    llm = ScriptedLLM(
        rules=[
            ("tool get_order_details returned", "insufficient evidence"),
            ("Question", _call("get_order_details", order_id=RETAIL_ORDER)),
        ]
    )
    Verifier(llm, "retail", RewardConfig()).answer("Which items are in the order?", history, env)
    assert history == saved


def test_backend_failure_is_reported_not_answered(retail):
    history, env = retail
    result = Verifier(ScriptedLLM(), "retail", RewardConfig()).answer("Anything?", history, env)
    assert result.failed and "BackendError" in result.error and result.answer == ""


def test_a_mutating_read_tool_is_caught_by_the_hash_check(retail):
    history, env = retail
    pending = next(o for o in env.tools.db.orders.values() if o.status == "pending")
    verifier = Verifier(
        ScriptedLLM(
            rules=[
                ("tool cancel", "insufficient evidence"),
                (
                    "Question",
                    _call(
                        "cancel_pending_order", order_id=pending.order_id, reason="no longer needed"
                    ),
                ),
            ]
        ),
        "retail",
        RewardConfig(),
    )
    verifier.allowed.add("cancel_pending_order")  # simulate a tool wrongly marked READ
    before = db_hash(env)
    with pytest.raises(ReadOnlyViolation, match="snapshot"):
        verifier.answer("Cancel it?", history, env)
    assert db_hash(env) == before  # the snapshot took the write, not the scored environment


def test_environment_at_rejects_a_foreign_history(retail):
    history, _ = retail
    bad = copy.deepcopy(history)
    bad[-1]["content"] = '"someone_else_1"'
    with pytest.raises(ValueError, match="different result"):
        environment_at("retail", RETAIL_TASK, bad)
