"""The decomposer with a scripted backend: strict parsing of a mix of malformed and valid samples,
the exact candidate set, hand-computed AU/EU, three backend calls, budget of requests."""

from __future__ import annotations

import json
import math
import re

import pytest

from prour.llm.scripted import ScriptedLLM
from prour.router import Decomposer, RouterConfig
from prour.router.candidates import canonical_json

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_order_details",
            "description": "Look up an order.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "cancel_pending_order",
            "description": "Cancel a pending order.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}, "reason": {"type": "string"}},
                "required": ["order_id", "reason"],
            },
        },
    },
]
MESSAGES = [
    {"role": "system", "content": "policy text"},
    {"role": "user", "content": "Hi, something is wrong with my order #W1."},
]
GOAL_A, GOAL_B = "I want to know where order #W1 is.", "I want to cancel order #W1."
GET = canonical_json({"tool": "get_order_details", "arguments": {"order_id": "#W1"}})
RESPOND = canonical_json({"tool": "respond", "arguments": {}})
CANCEL = canonical_json(
    {
        "tool": "cancel_pending_order",
        "arguments": {"order_id": "#W1", "reason": "ordered by mistake"},
    }
)
ACTIONS = {
    GOAL_A: [
        '{"tool": "get_order_details", "arguments": {"order_id": "#W1"}}',
        '{"tool": "get_order_details", "arguments": {"order_id": "#W1"',  # truncated -> not_json
        '<think>the user is vague</think>{"tool":"respond","arguments":{}}',
        '```json\n{"tool": "respond", "arguments": {}}\n```',  # markdown -> not_json
    ],
    GOAL_B: [
        '{"arguments": {"reason": "ordered by mistake", "order_id": "#W1"}, "tool": "cancel_pending_order"}',
        '{"tool": "get_order_details", "arguments": {"order_id": "#W1"}, "why": "x"}',  # wrong_keys
        '{"tool": "get_order_details", "arguments": {"order_id": 7}}',  # schema
        '{"tool": "refund_everything", "arguments": {}}',  # unknown_tool
    ],
}
# hand-set log-likelihoods: goal A prefers GET 2:1:1, goal B prefers CANCEL 2:1:1
LOGLIK = {
    GOAL_A: {GET: math.log(2), RESPOND: 0.0, CANCEL: 0.0},
    GOAL_B: {GET: 0.0, RESPOND: 0.0, CANCEL: math.log(2)},
}
SECRET = "You want to cancel because you ordered by mistake"


def _action_reply():
    turns: dict[str, int] = {}

    def reply(messages):
        goal = re.search(r"Assume the customer's goal is: (.*)", messages[-1]["content"]).group(1)
        i = turns.get(goal, 0)
        turns[goal] = i + 1
        return ACTIONS[goal][i % 4]

    return reply


def _scorer(context: str, target: str) -> list[float]:
    assert target.endswith("<|im_end|>"), "the completion marker must be part of the target"
    goal = re.search(r"Assume the customer's goal is: (.*)", context).group(1)
    return [LOGLIK[goal][target.removesuffix("<|im_end|>")]]


def _llm(goals: list[str]) -> ScriptedLLM:
    return ScriptedLLM(
        rules=[
            (r"The customer's goal, in one sentence:", goals),
            (r"Propose one plausible next action", _action_reply()),
        ],
        scorer=_scorer,
    )


def _entropy(p: list[float]) -> float:
    return -sum(x * math.log(x) for x in p if x > 0)


def test_mixed_outputs_give_exact_candidates_and_hand_computed_uncertainty() -> None:
    llm = _llm([GOAL_A, GOAL_B])
    config = RouterConfig(n_interpretations=2, n_actions=4, tau_au=0.04, tau_eu=0.5)
    decision = Decomposer(llm, TOOLS, config).decide(MESSAGES, seed=3)
    assert decision.interpretations == [GOAL_A, GOAL_B]
    assert decision.candidates == [GET, RESPOND, CANCEL]  # first-seen order, de-duplicated
    assert decision.invalid == {"not_json": 2, "wrong_keys": 1, "schema": 1, "unknown_tool": 1}
    assert decision.n_action_samples == 8
    p_a, p_b = [0.5, 0.25, 0.25], [0.25, 0.25, 0.5]
    for row, expected in zip(decision.probs, (p_a, p_b)):
        assert row == pytest.approx(expected, abs=1e-12)
        assert sum(row) == pytest.approx(1.0, abs=1e-12)
    eu = (_entropy(p_a) + _entropy(p_b)) / 2
    total = _entropy([0.375, 0.25, 0.375])
    assert (decision.eu, decision.au, decision.total) == pytest.approx(
        (eu, total - eu, total), abs=1e-12
    )
    assert decision.au == pytest.approx(0.0425, abs=1e-4)
    assert decision.route == "clarify"  # AU >= 0.04
    again = Decomposer(_llm([GOAL_A, GOAL_B]), TOOLS, config, thresholds=(0.05, 0.5)).decide(
        MESSAGES
    )
    assert again.route == "verify"  # AU < 0.05, EU = 1.5 ln 2 >= 0.5
    assert decision.loglik[0] == pytest.approx([math.log(2), 0.0, 0.0])


def test_three_backend_calls_and_shared_contexts() -> None:
    llm = _llm([GOAL_A, GOAL_B, GOAL_A])  # K=3 with a repeated reading
    config = RouterConfig(n_interpretations=3, n_actions=4)
    decision = Decomposer(llm, TOOLS, config).decide(MESSAGES, seed=0)
    assert llm.calls["chat"] == 2 and llm.calls["score"] == 1
    assert llm.calls["chat_requests"] == 3 + 3 * 4  # one request per sample
    assert all(r.sampling.n == 1 for r in llm.chat_log)
    assert [r.sampling.seed for r in llm.chat_log] == list(range(15))  # sample j: seed + j
    # the action prompts of different readings share everything but the reading, which is last
    action_texts = [r.messages[-1]["content"] for r in llm.chat_log[3:]]
    for text, goal in zip(action_texts[::4], (GOAL_A, GOAL_B, GOAL_A)):
        assert text.endswith(goal) and text.removesuffix(goal) == action_texts[4].removesuffix(
            GOAL_B
        )
    # a repeated reading is scored once: 2 distinct goals x 3 candidates
    assert llm.calls["score_requests"] == 6
    contexts = [json.dumps(r.context) for r in llm.score_log]
    assert contexts[:3] == [contexts[0]] * 3 and contexts[3:] == [contexts[3]] * 3
    assert decision.probs[0] == decision.probs[2]
    assert decision.route is None  # no thresholds configured
    assert decision.model_calls == {
        "chat_calls": 2,
        "score_calls": 1,
        "chat_requests": 15,
        "generated": 15,
        "score_requests": 6,
    }


def test_unbatched_mode_issues_one_request_per_call_with_same_result() -> None:
    config = RouterConfig(n_interpretations=2, n_actions=4)
    batched = Decomposer(_llm([GOAL_A, GOAL_B]), TOOLS, config).decide(MESSAGES, seed=1)
    llm = _llm([GOAL_A, GOAL_B])
    single = Decomposer(llm, TOOLS, config, batched=False).decide(MESSAGES, seed=1)
    assert llm.calls["chat"] == 2 + 2 * 4 and llm.calls["score"] == 6  # K + K·L, K·|C|
    assert (single.candidates, single.probs, single.au) == (
        batched.candidates,
        batched.probs,
        batched.au,
    )


def test_no_valid_candidate_routes_by_config_and_counts() -> None:
    llm = ScriptedLLM(rules=[(r"The customer's goal", GOAL_A), (r"Propose one", "not json at all")])
    config = RouterConfig(
        n_interpretations=2, n_actions=3, tau_au=0.1, tau_eu=0.1, empty_route="verify"
    )
    decision = Decomposer(llm, TOOLS, config).decide(MESSAGES)
    assert decision.empty and decision.route == "verify" and decision.au is None
    assert decision.invalid == {"not_json": 6}
    assert llm.calls["score"] == 0


def test_blank_goals_are_dropped_and_counted() -> None:
    llm = ScriptedLLM(
        rules=[(r"The customer's goal", ["  ", GOAL_A]), (r"Propose one", ACTIONS[GOAL_A][0])]
    )
    decision = Decomposer(llm, TOOLS, RouterConfig(n_interpretations=2, n_actions=2)).decide(
        MESSAGES
    )
    assert decision.interpretations == [GOAL_A] and decision.empty_goals == 1
    assert decision.candidates == [GET] and (decision.au, decision.eu) == (0.0, 0.0)


def test_prompts_carry_dialogue_and_tools_but_no_system_policy_or_task_secret() -> None:
    llm = _llm([GOAL_A, GOAL_B])
    Decomposer(llm, TOOLS, RouterConfig(n_interpretations=2, n_actions=4)).decide(MESSAGES)
    texts = [r.messages[-1]["content"] for r in llm.chat_log] + [
        r.context[-1]["content"] for r in llm.score_log
    ]
    assert all("order #W1" in t for t in texts)
    assert all("policy text" not in t and SECRET not in t for t in texts)
    assert all("cancel_pending_order" in t for t in texts[2:])  # tools in action and score prompts
    assert (
        json.loads(Decomposer(llm, TOOLS).decide(MESSAGES).to_dict()["candidates"][0]) is not None
    )
