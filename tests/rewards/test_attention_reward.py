"""The attention-aware reward R = IG − λ·cost(question) against hand computations on one state,
for each cost option (proxy: atomic asks; judge: the ask-less `full` cost), and its config."""

from __future__ import annotations

import json

import pytest

from prour.config import ConfigError, parse_recipe
from prour.llm.scripted import ScriptedLLM, render_prompt, word_overlap_logprobs
from prour.recipes import load_recipe
from prour.rewards import InfoGainReward, RewardConfig, RewardState, belief_prompt
from prour.rewards.attention import QuestionCost
from prour.rewards.judge import RequestJudge
from prour.rollout import StrictUserSimulator, Verifier

GOAL = "I want to exchange my keyboard for one with clicky switches and pay with my gift card."
HISTORY = [{"role": "user", "content": "Hi, I'd like to exchange an item from my order."}]
ONE_ASK = "Which switch type do you want?"
TWO_ASKS = "Which switch type do you want, and how will you pay the difference?"
VERIFY_TARGET = '{"arguments":{},"tool":"respond"}'
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


def hand_ig(question: str, answer: str, mode: str = "clarify") -> float:
    """post − prior by the scripted policy's documented scoring rule (sum aggregation)."""
    target = GOAL if mode == "clarify" else VERIFY_TARGET
    prior = sum(word_overlap_logprobs(render_prompt(belief_prompt(mode, HISTORY)), target))
    post = sum(word_overlap_logprobs(
        render_prompt(belief_prompt(mode, HISTORY, question, answer)), target))
    return post - prior


def state(mode: str = "clarify") -> RewardState:
    target = GOAL if mode == "clarify" else VERIFY_TARGET
    return RewardState(mode=mode, history=HISTORY, target=target, domain="retail")


def reward_of(
    cost: str, lam: float, judge: ScriptedLLM | None = None, verifier: ScriptedLLM | None = None
) -> InfoGainReward:
    config = RewardConfig(retry_backoff_s=0, attention={"lambda": lam, "cost": cost})
    pricing = None
    if judge is not None:
        pricing = QuestionCost(config.attention, RequestJudge(judge, max_attempts=2))
    verifiers = None if verifier is None else (lambda domain: Verifier(verifier, domain, config))
    return InfoGainReward(ScriptedLLM(), StrictUserSimulator(user_llm(), config), verifiers, config,
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


@pytest.mark.parametrize("cost", ["proxy", "judge"])
def test_verify_questions_cost_nothing_so_their_reward_is_the_information_gain(cost: str):
    """A verify question goes to the verifier, which reads tools, not the user: with λ > 0 its
    reward is still post − prior, while the same question in a clarify state is charged."""
    from prour.env.domains import get_task
    from prour.env.environment import make_env

    judge, verifier = judge_llm(), ScriptedLLM(default="insufficient evidence")
    reward = reward_of(cost, 0.5, judge, verifier)
    verify = RewardState(mode="verify", history=HISTORY, target=VERIFY_TARGET, domain="retail",
                         env=make_env("retail", get_task("retail", "0")))
    out = reward.score_group(verify, [ask(ONE_ASK), ask(TWO_ASKS), "NO"])
    assert [s.answer for s in out[:2]] == ["insufficient evidence"] * 2  # the verifier answered
    assert [s.attention_cost for s in out] == [None, None, None]
    for sample, question in zip(out[:2], (ONE_ASK, TWO_ASKS)):
        assert sample.ig == pytest.approx(hand_ig(question, "insufficient evidence", "verify"))
        assert sample.reward == sample.ig
    assert out[2].reward == 0.0
    assert judge.calls["chat_requests"] == 0  # nothing asked the judge to price a verify question
    charged = reward.score_group(state("clarify"), [ask(ONE_ASK)])[0]
    assert charged.attention_cost is not None and charged.attention_cost > 0  # λ is on
    assert charged.reward == pytest.approx(charged.ig - 0.5 * charged.attention_cost)


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


def run_relative(value: object, run_dir: str) -> object:
    """``value`` (a dumped section) with every path inside ``run_dir`` written as ``<run>/...``."""
    if isinstance(value, dict):
        return {key: run_relative(item, run_dir) for key, item in value.items()}
    if isinstance(value, list):
        return [run_relative(item, run_dir) for item in value]
    if isinstance(value, str) and (value == run_dir or value.startswith(run_dir + "/")):
        return "<run>" + value[len(run_dir):]
    return value


def test_paper_recipe_is_off_and_its_attention_variant_is_on():
    from pathlib import Path

    recipes = Path(__file__).resolve().parents[2] / "recipes"
    paper, variant = load_recipe(recipes / "paper.yaml"), load_recipe(recipes / "paper-attention.yaml")
    assert paper.reward.attention.lam == 0.0
    assert variant.reward.attention.lam > 0 and variant.reward.attention.cost == "judge"
    assert "judge" in variant.models
    # the variant is the paper recipe with the attention term: every other section is the same,
    # up to where each run keeps its files (paths are absolute under each recipe's own run_dir)
    for section in ("data", "router", "env", "train", "eval"):
        mine = run_relative(getattr(paper, section).model_dump(), paper.run_dir)
        # (its calibration states are the paper run's own: see below)
        theirs = run_relative(run_relative(getattr(variant, section).model_dump(),
                                           variant.run_dir), paper.run_dir)
        if section == "eval":  # the sweeps of Figures 5 and 8 are the paper run's, not repeated
            assert mine["tradeoff"]["run"] and not theirs["tradeoff"]["run"]
            mine["tradeoff"]["run"] = theirs["tradeoff"]["run"]
        assert mine == theirs, section
    # the variant reads the paper run's calibration states, not states of its own
    assert variant.router.calibration.dev_states == paper.router.calibration.dev_states
    assert paper.reward.model_copy(update={"attention": variant.reward.attention}) == variant.reward


def test_the_paper_attention_reward_builds_its_judge_without_an_eval_attention_section():
    """paper-attention evaluates without the attention protocol (no ``eval.attention``) yet prices
    its training questions with the judge: the judge takes that section's default attempts, and
    a recipe without ``models.judge`` is told which key is missing."""
    from pathlib import Path

    from prour.build import Builder
    from prour.config.attention import AttentionConfig
    from prour.train.reward import question_cost

    recipes = Path(__file__).resolve().parents[2] / "recipes"
    variant = load_recipe(recipes / "paper-attention.yaml")
    assert variant.eval.attention is None
    priced = question_cost(Builder(variant, llms={"judge": judge_llm()}))
    assert priced is not None and priced.judge is not None
    assert priced.judge.max_attempts == AttentionConfig.model_fields["judge_attempts"].default
    without = variant.model_copy(update={"models": {}})
    with pytest.raises(ValueError, match="models.judge is not in the recipe; reward.attention"):
        question_cost(Builder(without))
