"""End to end on a real tau2 retail state with the tiny Qwen3 on CPU.

The state: a hand-written opening user message (what tau2's user simulator would say for retail
test task 0, without its hidden instructions) and two real tool calls executed by tau2's retail
tools. Generation comes from a scripted backend (the random tiny model writes noise, so its
samples would all be invalid) and scoring from the tiny hf model; a second test lets the tiny
model generate too and checks that its noise is counted as invalid without a crash.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import pytest

from prour.env.domains import load_tasks
from prour.env.environment import execute_tool_call, make_env, tool_schemas
from prour.llm.base import ChatRequest, Completion, ScoreRequest, ScoreResult
from prour.llm.scripted import ScriptedLLM
from prour.router import ROUTES, Decomposer, RouterConfig
from prour.router.candidates import ToolCatalog, parse_action

OPENING = "Hi! I'd like to exchange a couple of things I received. I'm Mei Kovacs, zip code 28236."


def _call(env, messages: list[dict], name: str, arguments: dict) -> str:
    call_id = f"call_{len(messages)}"
    messages.append(
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
            ],
        }
    )
    observation, is_error = execute_tool_call(env, name, arguments, call_id=call_id)
    assert not is_error, observation
    messages.append({"role": "tool", "tool_call_id": call_id, "name": name, "content": observation})
    return observation


@pytest.fixture(scope="module")
def retail_state():
    task = load_tasks("retail", "test")[0]
    env = make_env("retail", task)
    messages: list[dict] = [{"role": "user", "content": OPENING}]
    user_id = _call(
        env,
        messages,
        "find_user_id_by_name_zip",
        {"first_name": "Mei", "last_name": "Kovacs", "zip": "28236"},
    )
    user = json.loads(_call(env, messages, "get_user_details", {"user_id": user_id}))
    return task, messages, user


@pytest.fixture(scope="module")
def tiny_hf(tiny_model_dir):
    from prour.llm.hf import HFLLM

    return HFLLM(str(tiny_model_dir), device="cpu", dtype="float32", seed=0)


class SplitLLM:
    """Chat from one backend, scores from another; records every prompt either one sees."""

    name = "split"

    def __init__(self, chat_llm, score_llm):
        self.chat_llm, self.score_llm = chat_llm, score_llm
        self.prompts: list[str] = []

    def chat(self, requests: Sequence[ChatRequest]) -> list[list[Completion]]:
        self.prompts += [json.dumps(r.messages) for r in requests]
        return self.chat_llm.chat(requests)

    def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        self.prompts += [json.dumps(r.context) for r in requests]
        return self.score_llm.score(requests)

    def close(self) -> None:
        pass


def _scripted_generation(user: dict) -> ScriptedLLM:
    orders = user["orders"]
    actions = [
        json.dumps({"tool": "get_order_details", "arguments": {"order_id": orders[0]}}),
        json.dumps({"tool": "get_order_details", "arguments": {"order_id": orders[1]}}),
        '{"tool": "respond", "arguments": {}}',
        '{"tool": "get_order_details", "arguments": {"order_id": "' + orders[0] + '"',  # truncated
        json.dumps(
            {"tool": "exchange_delivered_order_items", "arguments": {"order_id": orders[0]}}
        ),  # schema
        json.dumps({"tool": "get_product_details", "arguments": {"product_id": "8310926033"}}),
    ]
    goals = [
        "I want to exchange two items from one of my delivered orders.",
        "I want to swap some items I received for different versions of them.",
    ]
    return ScriptedLLM(
        rules=[
            (r"The customer's goal, in one sentence:", goals),
            (r"Propose one plausible next action", actions),
        ]
    )


def _direct_loglik(model_dir, context: list[dict], target: str) -> float:
    """Summed log-prob of ``target`` after the chat-rendered ``context``, by a plain forward pass."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompt = tok.apply_chat_template(
        context, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    ctx = tok(prompt, add_special_tokens=False)["input_ids"]
    tgt = tok(target, add_special_tokens=False)["input_ids"]
    assert tgt[-1] == tok.convert_tokens_to_ids("<|im_end|>")  # the completion token is scored
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ctx + tgt])).logits[0].float(), dim=-1)
    return float(sum(logp[len(ctx) - 1 + j, t] for j, t in enumerate(tgt)))


def test_decision_on_real_retail_state(retail_state, tiny_hf, tiny_model_dir) -> None:
    task, messages, user = retail_state
    llm = SplitLLM(_scripted_generation(user), tiny_hf)
    config = RouterConfig(
        n_interpretations=2, n_actions=6, tool_detail="brief", tau_au=0.25, tau_eu=0.2
    )
    decision = Decomposer(llm, tool_schemas("retail"), config).decide(messages, seed=0)

    catalog = ToolCatalog(tool_schemas("retail"))
    assert len(decision.candidates) == 4
    assert all(parse_action(c, catalog).canonical == c for c in decision.candidates)
    assert decision.invalid == {"not_json": 2, "schema": 2}
    assert len(decision.probs) == 2 and all(len(row) == 4 for row in decision.probs)
    assert all(sum(row) == pytest.approx(1.0, abs=1e-9) for row in decision.probs)
    assert all(math.isfinite(x) and x < 0 for row in decision.loglik for x in row)
    assert decision.route in ROUTES and decision.au + decision.eu == pytest.approx(decision.total)
    # the hf backend's shared-context scores equal a plain forward pass
    context = [{"role": "user", "content": json.loads(llm.prompts[-1])[-1]["content"]}]
    expected = _direct_loglik(tiny_model_dir, context, decision.candidates[-1] + "<|im_end|>")
    assert decision.loglik[-1][-1] == pytest.approx(expected, abs=1e-3)
    # nothing of the task's hidden instructions reached any prompt
    secret = task.user_scenario.instructions.reason_for_call
    assert all(secret[:60] not in p for p in llm.prompts)


def test_tiny_model_noise_is_counted_invalid_not_fatal(retail_state, tiny_hf) -> None:
    _, messages, _ = retail_state
    config = RouterConfig(
        n_interpretations=2,
        n_actions=2,
        goal_max_tokens=8,
        action_max_tokens=8,
        tool_detail="brief",
        tau_au=0.25,
        tau_eu=0.2,
    )
    decision = Decomposer(tiny_hf, tool_schemas("retail"), config).decide(messages, seed=0)
    # noise never parses as a strict action: every sample is counted, none is resampled
    assert len(decision.interpretations) == 2 and decision.n_action_samples == 4
    assert sum(decision.invalid.values()) == 4 and decision.candidates == []
    assert decision.empty and decision.route == config.empty_route and decision.au is None
    assert decision.model_calls["score_calls"] == 0


def test_batched_and_one_call_per_sample_decisions_are_identical(retail_state, tiny_hf) -> None:
    """Per-sample seeds: the tiny model's own samples and scores do not depend on batching."""
    _, messages, _ = retail_state
    config = RouterConfig(
        n_interpretations=2,
        n_actions=2,
        goal_max_tokens=6,
        action_max_tokens=6,
        tool_detail="brief",
        tau_au=0.25,
        tau_eu=0.2,
    )
    raw: dict[bool, list[str]] = {}
    for batched in (True, False):
        decomposer = Decomposer(tiny_hf, tool_schemas("retail"), config, batched=batched)
        goals = decomposer.propose_goals("history of the retail state", seed=9)
        raw[batched] = goals + decomposer.sample_actions("history", goals, seed=9)
        decision = decomposer.decide(messages, seed=9)
        raw[batched] += decision.interpretations + [json.dumps(decision.invalid)]
    assert raw[True] == raw[False]
    assert len(set(raw[True][:2])) == 2  # two different goal samples, not one copied
