"""The reward with the tiny Qwen3 as policy: R equals a direct transformers forward pass."""

from __future__ import annotations

import pytest
import torch

from prour.llm.scripted import ScriptedLLM
from prour.rewards import InfoGainReward, RewardConfig, RewardState, belief_prompt
from prour.rollout import StrictUserSimulator

GOAL = "I want to return the Water Bottle from order #W1234567 and get the refund on my gift card."
HISTORY = [
    {"role": "user", "content": "Hi, I want to return something I bought."},
    {"role": "assistant", "content": "Sure. Which order is it?"},
]
OUTPUTS = [
    "YES [QUESTION]Which item do you want to return?[/QUESTION]",
    "<think>refund method</think>YES [QUESTION]Where should the refund go?[/QUESTION]",
    "NO",
    "YES [QUESTION]Anything else?[/QUESTION]",
    "yes",
]
ANSWERS = {
    "Which item do you want to return?": "The Water Bottle from order #W1234567.",
    "Where should the refund go?": "To my gift card, please.",
    "Anything else?": "No, that's all.",
}


class CountingLLM:
    """Wraps a backend and counts score calls and scored requests."""

    def __init__(self, inner):
        self.inner, self.name = inner, inner.name
        self.score_calls, self.score_requests = 0, 0

    def chat(self, requests):
        return self.inner.chat(requests)

    def score(self, requests):
        self.score_calls += 1
        self.score_requests += len(requests)
        return self.inner.score(requests)

    def close(self):
        self.inner.close()


@pytest.fixture(scope="module")
def tiny(tiny_model_dir, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    from prour.llm.hf import HFLLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    return HFLLM(str(tiny_model_dir), device="cpu", dtype="float32"), model, tiny_tokenizer


@torch.inference_mode()
def direct_token_logprobs(model, tokenizer, messages, target: str) -> list[float]:
    """log p(target token | chat context, earlier target tokens), one per target token, from one
    plain forward pass over context + target."""
    context = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    ctx = tokenizer(context, add_special_tokens=False)["input_ids"]
    tgt = tokenizer(target, add_special_tokens=False)["input_ids"]
    logits = model(torch.tensor([ctx + tgt])).logits[0].float()
    logp = torch.log_softmax(logits[len(ctx) - 1 : -1], dim=-1)
    return logp.gather(1, torch.tensor(tgt)[:, None])[:, 0].tolist()


def direct_logprob(model, tokenizer, messages, target: str) -> float:
    """Summed log p(target | chat context)."""
    return sum(direct_token_logprobs(model, tokenizer, messages, target))


def answer_rules() -> ScriptedLLM:
    return ScriptedLLM(rules=[(f"user: {q.replace('?', '[?]')}", a) for q, a in ANSWERS.items()])


def test_reward_equals_direct_forward_pass_and_prior_is_scored_once(tiny):
    hf, model, tokenizer = tiny
    policy = CountingLLM(hf)
    reward = InfoGainReward(
        policy, StrictUserSimulator(answer_rules(), RewardConfig()), None,
        RewardConfig(retry_backoff_s=0)
    )
    state = RewardState(
        mode="clarify", history=HISTORY, target=GOAL, domain="retail", state_id="s0"
    )
    out = reward.score_group(state, OUTPUTS)

    prior = direct_logprob(model, tokenizer, belief_prompt("clarify", HISTORY), GOAL)
    n_target = len(tokenizer(GOAL, add_special_tokens=False)["input_ids"])
    for sample in out[:2] + out[3:4]:
        post = direct_logprob(
            model,
            tokenizer,
            belief_prompt("clarify", HISTORY, sample.question, ANSWERS[sample.question]),
            GOAL,
        )
        assert sample.prior == pytest.approx(prior, abs=1e-3)
        assert sample.post == pytest.approx(post, abs=1e-3)
        assert sample.reward == pytest.approx(post - prior, abs=1e-3)
        assert sample.n_target_tokens == n_target
    assert (
        out[2].reward == 0.0 and out[4].reward == -1.0 and out[4].reason == "YES without a question"
    )
    assert len({s.reward for s in out[:2] + out[3:4]}) == 3  # different exchanges, different gains
    assert (policy.score_calls, policy.score_requests) == (2, 1 + 3)

    again = reward.score_group(
        state, OUTPUTS[:2]
    )  # the same state again: prior comes from the cache
    assert (policy.score_calls, policy.score_requests) == (3, 4 + 2)
    assert [s.reward for s in again] == pytest.approx([s.reward for s in out[:2]], abs=1e-5)


def test_mean_and_sum_aggregation_match_a_hand_computation_on_one_state(tiny):
    """R under reward.aggregation = sum and = mean (the paper recipe's), from the token log-probs
    of a direct forward pass: sum(post) - sum(prior), and the same divided by the token count."""
    hf, model, tokenizer = tiny
    question = "Where should the refund go?"
    state = RewardState(
        mode="clarify", history=HISTORY, target=GOAL, domain="retail", state_id="agg"
    )
    prior_tokens = direct_token_logprobs(
        model, tokenizer, belief_prompt("clarify", HISTORY), GOAL
    )
    post_tokens = direct_token_logprobs(
        model, tokenizer, belief_prompt("clarify", HISTORY, question, ANSWERS[question]), GOAL
    )
    n = len(prior_tokens)
    assert n == len(post_tokens) > 1 and sum(post_tokens) != sum(prior_tokens)  # sum ≠ mean here
    hand = {
        "sum": (sum(prior_tokens), sum(post_tokens)),
        "mean": (sum(prior_tokens) / n, sum(post_tokens) / n),
    }
    for aggregation, (prior, post) in hand.items():
        reward = InfoGainReward(
            hf,
            StrictUserSimulator(answer_rules(), RewardConfig()),
            None,
            RewardConfig(aggregation=aggregation, retry_backoff_s=0),
        )
        [sample] = reward.score_group(state, [OUTPUTS[1]])
        assert sample.question == question and sample.n_target_tokens == n
        assert sample.prior == pytest.approx(prior, abs=1e-3)
        assert sample.post == pytest.approx(post, abs=1e-3)
        assert sample.reward == pytest.approx(post - prior, abs=1e-3)
