"""InfoGainReward with scripted models: kinds, prior caching, batching, responder faults, verify mode."""

from __future__ import annotations

import json
import threading
import time

import pytest
import wall_clock
from loguru import logger

from prour.llm.base import BackendError
from prour.llm.scripted import ScriptedLLM, render_prompt, word_overlap_logprobs
from prour.rewards import InfoGainReward, RewardConfig, RewardState, belief_prompt, state_from_row
from prour.rollout import StrictUserSimulator, Verifier

logger.disable("tau2")

GOAL = "I want to exchange my keyboard for one with clicky switches and pay with my gift card."
HISTORY = [{"role": "user", "content": "Hi, I'd like to exchange an item from my order."}]
ASK_COLOR = "YES [QUESTION]Which switch type do you want?[/QUESTION]"
ASK_PAY = "<think>payment?</think>YES [QUESTION]How will you pay the difference?[/QUESTION]"


def expected_logprob(context_messages, target: str) -> float:
    """The scripted policy's score computed directly from its documented scoring rule."""
    return sum(word_overlap_logprobs(render_prompt(context_messages), target))


def user_llm() -> ScriptedLLM:
    return ScriptedLLM(
        rules=[
            ("user: Which switch", "Clicky switches, please."),
            ("user: How will you pay", "With my gift card."),
            ("user: Anything", "No, that's all."),
        ]
    )


def make_reward(user=None, config=None, policy=None):
    policy = policy or ScriptedLLM()
    return InfoGainReward(
        policy,
        StrictUserSimulator(user or user_llm(), RewardConfig()),
        None,
        config or RewardConfig(retry_backoff_s=0),
    ), policy


def state(**kw) -> RewardState:
    return RewardState(
        **{"mode": "clarify", "history": HISTORY, "target": GOAL, "domain": "retail", **kw}
    )


def test_kinds_and_rewards_match_hand_computation():
    reward, _ = make_reward()
    st = state()
    out = reward.score_group(st, ["NO", "no thanks", ASK_COLOR, ASK_PAY])
    assert [r.kind for r in out] == ["none", "invalid", "ask", "ask"]
    assert out[0].reward == 0.0 and out[0].prior is None
    assert out[1].reward == -1.0 and out[1].reason == "text outside the answer"
    prior = expected_logprob(belief_prompt("clarify", HISTORY), GOAL)
    for sample, q, a in [
        (out[2], "Which switch type do you want?", "Clicky switches, please."),
        (out[3], "How will you pay the difference?", "With my gift card."),
    ]:
        post = expected_logprob(belief_prompt("clarify", HISTORY, q, a), GOAL)
        assert (sample.question, sample.answer) == (q, a)
        assert sample.prior == pytest.approx(prior) and sample.post == pytest.approx(post)
        assert sample.reward == pytest.approx(post - prior) and not sample.failed
        assert sample.n_target_tokens == len(GOAL.split())
    assert out[3].reward > 0  # the answer mentions "gift card", which the goal contains


def test_prior_scored_once_per_state_and_posteriors_in_one_batch():
    reward, policy = make_reward()
    st = state()
    reward.score_group(st, [ASK_COLOR, ASK_PAY, ASK_COLOR, "NO"] * 2)
    # one prior call (1 request) + one posterior call (2 distinct exchanges)
    assert policy.calls["score"] == 2 and policy.calls["score_requests"] == 1 + 2
    reward.score_group(st, [ASK_PAY, ASK_COLOR])
    assert policy.calls["score"] == 3 and policy.calls["score_requests"] == 3 + 2  # prior reused
    reward.score_group(
        state(history=HISTORY + [{"role": "user", "content": "It is order #W1."}]), [ASK_PAY]
    )
    assert policy.calls["score_requests"] == 5 + 2  # a new state gets its own prior
    reward.policy_updated()
    reward.score_group(st, [ASK_PAY])
    assert policy.calls["score_requests"] == 7 + 2  # the updated policy rescored the prior


def test_groups_without_questions_call_nothing():
    user = user_llm()
    reward, policy = make_reward(user=user)
    out = reward.score_group(
        state(), ["NO", "", "<think>hmm", "YES [QUESTION]your question here[/QUESTION]"]
    )
    assert [r.reward for r in out] == [0.0, -1.0, -1.0, -1.0]
    assert policy.calls["score"] == 0 and user.calls["chat"] == 0


def test_mean_aggregation_and_custom_penalty():
    reward, _ = make_reward(
        config=RewardConfig(aggregation="mean", invalid_penalty=-0.5, retry_backoff_s=0)
    )
    out = reward.score_group(state(), [ASK_PAY, "maybe"])
    n = len(GOAL.split())
    prior = expected_logprob(belief_prompt("clarify", HISTORY), GOAL) / n
    post = (
        expected_logprob(
            belief_prompt(
                "clarify", HISTORY, "How will you pay the difference?", "With my gift card."
            ),
            GOAL,
        )
        / n
    )
    assert out[0].reward == pytest.approx(post - prior)
    assert out[1].reward == -0.5


def test_target_reaches_only_the_user_simulator_and_the_scored_target():
    user = user_llm()
    reward, policy = make_reward(user=user)
    reward.score_group(state(), [ASK_COLOR, ASK_PAY])
    assert all(GOAL not in render_prompt(r.context) and r.target == GOAL for r in policy.score_log)
    assert all(GOAL in r.messages[0]["content"] for r in user.chat_log)


class FlakyLLM:
    """A responder backend failing the first ``failures`` calls (``error`` raised, or a hang)."""

    name = "flaky"

    def __init__(self, failures: int, error: Exception | None = None, hang_s: float = 0.0):
        self.failures, self.error, self.hang_s = failures, error, hang_s
        self.calls = 0
        self.inner = user_llm()
        self.release = threading.Event()

    def chat(self, requests):
        self.calls += 1
        if self.calls <= self.failures:
            if self.hang_s:
                self.release.wait(self.hang_s)
                return []
            raise self.error
        return self.inner.chat(requests)

    def score(self, requests):
        raise AssertionError("responders are never scored")

    def close(self):
        self.release.set()


def test_persistent_server_errors_mark_samples_failed_after_bounded_retries():
    flaky = FlakyLLM(failures=100, error=BackendError("HTTP 500 from http://127.0.0.1:9/v1/chat"))
    reward, policy = make_reward(
        user=flaky, config=RewardConfig(responder_retries=2, retry_backoff_s=0)
    )
    out = reward.score_group(state(), [ASK_COLOR, "NO", ASK_PAY])
    assert flaky.calls == 3  # one attempt + two retries
    assert [r.failed for r in out] == [True, False, True]
    assert out[0].reward is None and out[2].reward is None and "HTTP 500" in out[0].reason
    assert out[1].reward == 0.0
    assert policy.calls["score"] == 0  # nothing answered, nothing scored


def test_transient_error_is_retried_and_then_scored():
    flaky = FlakyLLM(failures=1, error=BackendError("HTTP 503"))
    reward, _ = make_reward(user=flaky, config=RewardConfig(responder_retries=1, retry_backoff_s=0))
    out = reward.score_group(state(), [ASK_COLOR])
    assert flaky.calls == 2 and not out[0].failed and out[0].reward is not None


def test_hanging_responder_times_out_and_nothing_hangs():
    hang_s = 30.0
    flaky = FlakyLLM(failures=100, hang_s=hang_s)
    config = RewardConfig(responder_retries=1, responder_timeout_s=0.2, retry_backoff_s=0)
    reward, _ = make_reward(user=flaky, config=config)
    start = time.monotonic()
    out = reward.score_group(state(), [ASK_COLOR, ASK_PAY])
    flaky.close()
    worst = wall_clock.retried_worst_s(
        config.responder_timeout_s, config.responder_retries + 1, config.retry_backoff_s
    )
    assert wall_clock.bound(worst) < hang_s  # the bound tells a timeout from a hang
    assert time.monotonic() - start < wall_clock.bound(worst)
    assert all(r.failed and "TimeoutError" in r.reason for r in out)
    assert flaky.calls == 2


def test_only_failed_items_are_retried():
    user = ScriptedLLM(
        rules=[("user: Which switch", ["", "Clicky."]), ("user: How will", "Gift card.")]
    )
    reward, _ = make_reward(user=user)
    out = reward.score_group(state(), [ASK_COLOR, ASK_PAY])
    assert [r.answer for r in out] == ["Clicky.", "Gift card."]
    assert user.calls["chat_requests"] == 3  # two first, then only the empty one again


def test_verify_mode_uses_the_verifier_on_a_rebuilt_environment():
    from prour.env.domains import get_task
    from prour.env.environment import execute_tool_call, make_env

    args = {"first_name": "Yusuf", "last_name": "Rossi", "zip": "19122"}
    output, _ = execute_tool_call(
        make_env("retail", get_task("retail", "0")), "find_user_id_by_name_zip", args
    )
    history = [
        {"role": "user", "content": "I'm Yusuf Rossi, 19122."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "find_user_id_by_name_zip", "arguments": json.dumps(args)},
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "c1",
            "name": "find_user_id_by_name_zip",
            "content": output,
        },
    ]
    target = json.dumps(
        {"arguments": {"user_id": output}, "tool": "get_user_details"}, separators=(",", ":")
    )
    call = json.dumps({"name": "get_user_details", "arguments": {"user_id": output}})
    verifier_llm = ScriptedLLM(
        rules=[
            (
                "tool get_user_details returned",
                lambda m: (
                    "get_user_details returned email "
                    + json.loads([x for x in m if x["role"] == "tool"][-1]["content"])["email"]
                ),
            ),
            ("Question to verify", f"<tool_call>{call}</tool_call>"),
        ]
    )
    policy = ScriptedLLM()
    reward = InfoGainReward(
        policy,
        StrictUserSimulator(user_llm(), RewardConfig()),
        lambda domain: Verifier(verifier_llm, domain, RewardConfig(verifier_max_steps=2)),
        RewardConfig(retry_backoff_s=0),
    )
    st = RewardState(mode="verify", history=history, target=target, domain="retail", task_id="0")
    out = reward.score_group(st, ["YES [QUESTION]What is the user's email?[/QUESTION]", "NO"])
    assert out[0].answer.startswith("get_user_details returned email ") and "@" in out[0].answer
    post = expected_logprob(
        belief_prompt("verify", history, "What is the user's email?", out[0].answer), target
    )
    prior = expected_logprob(belief_prompt("verify", history), target)
    assert out[0].reward == pytest.approx(post - prior)
    assert "[Verification]" in render_prompt(policy.score_log[-1].context)


def test_state_from_a_parquet_row(tmp_path):
    """The row as the writer makes it (schema.Instance → write_rows), read back with pandas as
    ``prour reward probe`` does."""
    import pandas as pd

    from prour.data.dataset import write_rows
    from prour.data.schema import Instance, tool_traffic_hash
    from prour.rollout.query import PROMPTS_VERSION, query_prompt

    instance = Instance(
        mode="clarify", domain="retail", task_id="0", trajectory_id="retail/0/s0/t", step=2,
        history=HISTORY, prompt=query_prompt("clarify", HISTORY), target=GOAL, au=0.4, eu=0.1,
        total=0.5, truncated=False, dropped_messages=0, prompt_tokens=90, target_tokens=20,
        decomposer_calls=3, prompts_version=PROMPTS_VERSION, env_history=[],
        db_hash=tool_traffic_hash("retail", "0", []),
    )
    path = write_rows([instance.to_row(0)], tmp_path / "d.parquet")
    st = state_from_row(pd.read_parquet(path).iloc[0].to_dict())
    assert (st.mode, st.target, st.domain, st.task_id, st.state_id, st.history) == (
        "clarify",
        GOAL,
        "retail",
        "0",
        "retail/0/s0/t#2:clarify",
        HISTORY,
    )
    assert (st.env_history, st.db_hash) == ([], instance.db_hash)
    with pytest.raises(ValueError, match="schema_version is None"):
        state_from_row({"reward_model": {"ground_truth": GOAL}, "extra_info": {"domain": "retail"}})


def test_state_without_id_gets_a_content_id():
    assert state().state_id == state().state_id
    assert state().state_id != state(target=GOAL + " Soon.").state_id
    with pytest.raises(ValueError, match="mode"):
        state(mode="act")
