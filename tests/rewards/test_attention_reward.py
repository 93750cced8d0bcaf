"""The attention-aware reward R = IG − λ·cost(question) against hand computations on one state,
for each cost option (proxy: atomic asks; judge: the ask-less `full` cost), and its config."""

from __future__ import annotations

import json

import pytest

from prour.config import ConfigError, parse_recipe
from prour.eval.attention.judge import RequestJudge
from prour.llm.scripted import ScriptedLLM, render_prompt, word_overlap_logprobs
from prour.recipes import load_recipe
from prour.rewards import InfoGainReward, RewardConfig, RewardState, belief_prompt
from prour.rewards.attention import QuestionCost
from prour.rollout import StrictUserSimulator

GOAL = "I want to exchange my keyboard for one with clicky switches and pay with my gift card."
HISTORY = [{"role": "user", "content": "Hi, I'd like to exchange an item from my order."}]
ONE_ASK = "Which switch type do you want?"
TWO_ASKS = "Which switch type do you want, and how will you pay the difference?"
# Judge verdicts: ratings (5 = easiest) and value, so r = Σ(5 − s) and v are known by hand.
VERDICT_ONE = {"goal_clarity": 5, "single_ask": 5, "answer_effort": 4, "actionability": 5,
               "conciseness": 4, "needed": True, "not_in_context": True, "not_lookup": True,
               "precise": True, "value": 8}  # r = 2, v = 8
VERDICT_TWO = {"goal_clarity": 3, "single_ask": 1, "answer_effort": 3, "actionability": 5,
               "conciseness": 2, "needed": True, "not_in_context": True, "not_lookup": False,
               "precise": False, "value": 4}  # r = 11, v = 4


def user_llm() -> ScriptedLLM:
    return ScriptedLLM(rules=[("user: Which switch type do you want\\?$", "Clicky switches."),
                              ("user: Which switch type do you want, and", "Clicky, gift card.")])


def judge_llm() -> ScriptedLLM:
    return ScriptedLLM(rules=[
        ("\\[Request to judge\\]\nWhich switch type do you want\\?$", json.dumps(VERDICT_ONE)),
        ("\\[Request to judge\\]\nWhich switch type do you want, and", json.dumps(VERDICT_TWO)),
    ])


def hand_ig(question: str, answer: str) -> float:
    """post − prior by the scripted policy's documented scoring rule (sum aggregation)."""
    prior = sum(word_overlap_logprobs(render_prompt(belief_prompt("clarify", HISTORY)), GOAL))
    post = sum(word_overlap_logprobs(
        render_prompt(belief_prompt("clarify", HISTORY, question, answer)), GOAL))
    return post - prior


def state(mode: str = "clarify") -> RewardState:
    target = GOAL if mode == "clarify" else '{"arguments":{},"tool":"respond"}'
    return RewardState(mode=mode, history=HISTORY, target=target, domain="retail")


def reward_of(cost: str, lam: float, judge: ScriptedLLM | None = None) -> InfoGainReward:
    config = RewardConfig(retry_backoff_s=0, attention={"lambda": lam, "cost": cost})
    pricing = None
    if judge is not None:
        pricing = QuestionCost(config.attention, RequestJudge(judge, max_attempts=2))
    return InfoGainReward(ScriptedLLM(), StrictUserSimulator(user_llm(), config), None, config,
                          pricing)


def ask(question: str) -> str:
    return f"YES [QUESTION]{question}[/QUESTION]"


def test_proxy_cost_is_the_number_of_atomic_asks():
    out = reward_of("proxy", 0.25).score_group(state(), [ask(ONE_ASK), ask(TWO_ASKS), "NO", "x"])
    ig_one, ig_two = hand_ig(ONE_ASK, "Clicky switches."), hand_ig(TWO_ASKS, "Clicky, gift card.")
    assert [s.attention_cost for s in out] == [1.0, 2.0, None, None]
    assert out[0].ig == pytest.approx(ig_one) and out[1].ig == pytest.approx(ig_two)
    assert out[0].reward == pytest.approx(ig_one - 0.25 * 1)
    assert out[1].reward == pytest.approx(ig_two - 0.25 * 2)
    assert (out[2].reward, out[3].reward) == (0.0, -1.0)  # NO and invalid are never charged


def test_judge_cost_is_the_full_ask_less_cost():
    out = reward_of("judge", 0.5, judge_llm()).score_group(state(), [ask(ONE_ASK), ask(TWO_ASKS)])
    cost_one = 1 + 2 / 20 + (1 - 8 / 10)  # 1 + r/20 + (1 − v/10)
    cost_two = 1 + 11 / 20 + (1 - 4 / 10)
    assert out[0].attention_cost == pytest.approx(cost_one)
    assert out[1].attention_cost == pytest.approx(cost_two)
    assert out[0].reward == pytest.approx(hand_ig(ONE_ASK, "Clicky switches.") - 0.5 * cost_one)
    assert out[1].reward == pytest.approx(hand_ig(TWO_ASKS, "Clicky, gift card.") - 0.5 * cost_two)


def test_a_question_repeated_in_the_group_is_judged_once():
    judge = judge_llm()
    out = reward_of("judge", 0.5, judge).score_group(
        state(), [ask(ONE_ASK), ask(TWO_ASKS), ask(ONE_ASK), ask(ONE_ASK)])
    assert judge.calls["chat_requests"] == 2  # two distinct questions, one verdict each
    assert [s.attention_cost for s in out] == pytest.approx(
        [1 + 2 / 20 + (1 - 8 / 10), 1 + 11 / 20 + (1 - 4 / 10)] + [1 + 2 / 20 + (1 - 8 / 10)] * 2)


def test_a_judge_without_a_valid_verdict_fails_the_sample():
    broken = ScriptedLLM(default="not json")
    out = reward_of("judge", 0.5, broken).score_group(state(), [ask(ONE_ASK)])
    assert out[0].failed and out[0].reward is None
    assert out[0].reason.startswith("attention cost failed: judge failed after 2 attempts")


def test_lambda_zero_is_the_papers_reward():
    out = reward_of("proxy", 0.0).score_group(state(), [ask(TWO_ASKS)])
    assert out[0].attention_cost is None
    assert out[0].reward == out[0].ig == pytest.approx(hand_ig(TWO_ASKS, "Clicky, gift card."))


def test_keys_live_under_reward_attention_and_judge_needs_a_judge_model():
    recipe = parse_recipe({"name": "r", "reward": {"attention": {"lambda": 0.2, "cost": "judge"}}})
    assert (recipe.reward.attention.lam, recipe.reward.attention.cost) == (0.2, "judge")
    with pytest.raises(ConfigError, match="reward.attention.cost"):
        parse_recipe({"name": "r", "reward": {"attention": {"cost": "length"}}})
    with pytest.raises(ConfigError, match="reward.attention.lambda"):
        parse_recipe({"name": "r", "reward": {"attention": {"lambda": -1}}})


def test_paper_recipe_is_off_and_its_attention_variant_is_on():
    from pathlib import Path

    recipes = Path(__file__).resolve().parents[2] / "recipes"
    paper, variant = load_recipe(recipes / "paper.yaml"), load_recipe(recipes / "paper-attention.yaml")
    assert paper.reward.attention.lam == 0.0
    assert variant.reward.attention.lam > 0 and variant.reward.attention.cost == "judge"
    assert "judge" in variant.models
    # the variant is the paper recipe with the attention term: every other section is the same
    same = ("data", "router", "env", "train", "eval")
    assert all(getattr(paper, s) == getattr(variant, s) for s in same)
    assert paper.reward.model_copy(update={"attention": variant.reward.attention}) == variant.reward
