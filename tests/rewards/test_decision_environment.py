"""The verifier's environment of a row is the environment at the state's decision.

A truncated verify row (``tests/write_world.py``): the prompt history lost the early return of an
item, yet the reward's verifier must see the order as "return requested", in a database whose
hash equals a full replay of the episode with tau2's API and the hash recorded at extraction.
An edited row is an error naming its state, never a silently different reward.
"""

from __future__ import annotations

import copy
import json
from typing import ClassVar

import pytest
import write_world as world_lib
from loguru import logger

from prour.env.environment import db_hash
from prour.llm.scripted import ScriptedLLM
from prour.rewards import InfoGainReward, RewardConfig, state_from_row
from prour.rollout import StrictUserSimulator, Verifier

logger.disable("tau2")

ORDER_READ = {"name": "get_order_details", "arguments": {"order_id": world_lib.ORDER}}
ASK = "YES [QUESTION]What is the status of order #W2378156?[/QUESTION]"


class SeeingVerifier(Verifier):
    """The real verifier, remembering the DB hash of each environment it is given."""

    seen: ClassVar[list[str]] = []

    def answer_many(self, questions, history, env, copy_env=True):
        self.seen.append(db_hash(env))
        return super().answer_many(questions, history, env, copy_env)


def _verifier_llm() -> ScriptedLLM:
    def status(messages: list[dict]) -> str:
        order = json.loads([m for m in messages if m["role"] == "tool"][-1]["content"])
        return f"get_order_details returned status {order['status']}"

    read = f"<tool_call>{json.dumps(ORDER_READ)}</tool_call>"
    return ScriptedLLM(rules=[("tool get_order_details returned", status),
                              ("Question to verify", read)])


def _reward() -> tuple[InfoGainReward, list[str]]:
    SeeingVerifier.seen = []
    reward = InfoGainReward(
        ScriptedLLM(), StrictUserSimulator(ScriptedLLM(), RewardConfig()),
        lambda domain: SeeingVerifier(_verifier_llm(), domain, RewardConfig(verifier_max_steps=2)),
        RewardConfig(retry_backoff_s=0, responder_retries=0),
    )
    return reward, SeeingVerifier.seen


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model_dir):
    return world_lib.build_world(tmp_path_factory.mktemp("env"), tiny_model_dir)


@pytest.fixture
def verify_row(world) -> dict:
    row = next(r for r in world.rows if r["extra_info"]["mode"] == "verify")
    kept = [c["function"]["name"] for m in json.loads(row["extra_info"]["history"])
            for c in m.get("tool_calls") or []]
    assert row["extra_info"]["truncated"] and kept == ["get_product_details"]  # the return left
    return copy.deepcopy(row)


def test_truncated_verify_row_rebuilds_the_environment_at_the_decision(world, verify_row):
    traj = world_lib.trajectory_of(world, verify_row)
    reward, seen = _reward()
    [sample] = reward.score_group(state_from_row(verify_row), [ASK])
    assert not sample.failed, sample.reason
    assert seen == [world_lib.replayed_hash(traj, world_lib.VERIFY_STEP)]
    assert seen == [verify_row["extra_info"]["db_hash"]]
    status = world_lib.order_status_after_return()
    assert status == "return requested"
    assert sample.answer == f"get_order_details returned status {status}"


def _without_the_return(row: dict) -> dict:
    history = json.loads(row["extra_info"]["env_history"])
    row["extra_info"]["env_history"] = json.dumps(history[:2] + history[4:])
    return row


def _with_an_edited_result(row: dict) -> dict:
    history = json.loads(row["extra_info"]["env_history"])
    history[3]["content"] = history[3]["content"].replace("return requested", "delivered")
    row["extra_info"]["env_history"] = json.dumps(history)
    return row


@pytest.mark.parametrize(("tamper", "message"), [
    (_without_the_return, "DB hash"),
    (_with_an_edited_result, "gave a different result"),
])
def test_an_edited_row_is_an_error_naming_the_state(verify_row, tamper, message):
    from prour.data.schema import EnvironmentMismatch

    row = tamper(verify_row)
    state_id = row["extra_info"]["state_id"]
    reward, seen = _reward()
    with pytest.raises(EnvironmentMismatch, match=message) as error:
        reward.score_group(state_from_row(row), [ASK])
    assert state_id in str(error.value) and "prour extract" in str(error.value)
    assert seen == []  # the verifier never ran on the wrong environment
