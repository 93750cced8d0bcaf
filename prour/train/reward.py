"""What the trainer needs from a reward: score one state's group of sampled outputs.

:class:`prour.rewards.InfoGainReward` is the paper's reward. :class:`VerifiableFormatReward` is
a rule-checked stand-in that needs no responder: it pays for a well-formed question, which lets
tests show that the trainer learns (its reward rises) without any model besides the policy.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from prour.llm.base import Completion
from prour.rewards.reward import SampleReward
from prour.rollout.query import parse_query

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe
    from prour.llm.base import LLM
    from prour.rewards.attention import QuestionCost
    from prour.rollout import StrictUserSimulator, Verifier


@runtime_checkable
class RewardFn(Protocol):
    """Scores the sampled outputs of one state, in order; ``failed`` samples carry no reward."""

    def score_group(self, state: Any, completions: Sequence[Completion]) -> list[SampleReward]: ...

    def policy_updated(self) -> None:
        """Called after every optimizer step (cached scores of the old policy become stale)."""
        ...


def score_groups(
    reward_fn: RewardFn, states: Sequence[Any], groups: Sequence[Sequence[Completion]]
) -> list[list[SampleReward]]:
    """A step's groups scored: through the reward's own ``score_groups`` when it has one (the
    information-gain reward answers the states side by side), else one group after another."""
    many = getattr(reward_fn, "score_groups", None)
    if many is not None:
        return many(states, groups)
    return [reward_fn.score_group(state, group) for state, group in zip(states, groups)]


class VerifiableFormatReward:
    """1 for a well-formed ``YES [QUESTION]…[/QUESTION]`` answer, 0 for anything else."""

    def __init__(self, ask_reward: float = 1.0, other_reward: float = 0.0):
        self.ask_reward = ask_reward
        self.other_reward = other_reward

    def score_group(self, state: Any, completions: Sequence[Completion]) -> list[SampleReward]:
        rewards = []
        for completion in completions:
            parsed = parse_query(completion.text)
            value = self.ask_reward if parsed.kind == "ask" else self.other_reward
            rewards.append(
                SampleReward(
                    kind=parsed.kind, question=parsed.question, reward=value, reason=parsed.reason
                )
            )
        return rewards

    def policy_updated(self) -> None:
        """Nothing is cached: the rule does not depend on the policy."""


@dataclass
class Responders:
    """The frozen side of the reward: the strict user, a verifier per domain (None: no
    ``models.verifier``, so verify queries cannot be answered) and the attention pricing of
    questions (None: ``reward.attention.lambda`` is 0)."""

    strict_user: StrictUserSimulator
    verifier_factory: Callable[[str], Verifier] | None
    question_cost: QuestionCost | None = None


RESPONDERS = {"clarify": "strict_user", "verify": "verifier"}
"""The responder role that answers each mode's queries."""


def reward_roles(recipe: Recipe, modes: Collection[str]) -> tuple[str, ...]:
    """The ``models.<role>`` the information-gain reward calls on states of ``modes``: each mode's
    responder, and ``judge`` when ``reward.attention`` prices questions with it."""
    attention = recipe.reward.attention
    judged = ("judge",) if attention.lam != 0 and attention.cost == "judge" else ()
    return (*(RESPONDERS[mode] for mode in RESPONDERS if mode in modes), *judged)


class RewardParts(Protocol):
    """What the reward asks of the builder of the recipe's components, which the entry that
    runs training (the CLI, verl's agent loop) makes and hands down."""

    recipe: Recipe

    def require(self, user: str, roles: Collection[str]) -> None: ...

    def llm(self, role: str) -> LLM: ...

    def strict_user(self) -> StrictUserSimulator: ...

    def verifier(self, domain: str, module: str | None = None) -> Verifier: ...

    def judge(self, attempts: int) -> Any: ...

    def judge_attempts(self) -> int: ...


def build_responders(builder: RewardParts) -> Responders:
    """Clarify queries go to ``models.strict_user``, verify queries to a read-only verifier on
    ``models.verifier`` (one per domain, built once); both decode as ``reward`` says."""
    builder.require("the information-gain reward (clarify answers)", ["strict_user"])
    verifier_factory = cache(builder.verifier) if "verifier" in builder.recipe.models else None
    return Responders(builder.strict_user(), verifier_factory, question_cost(builder))


def question_cost(builder: RewardParts) -> QuestionCost | None:
    """The attention pricing of ``reward.attention`` (the ``judge`` cost on ``models.judge``)."""
    from prour.rewards.attention import QuestionCost

    attention = builder.recipe.reward.attention
    if attention.lam == 0:
        return None
    if attention.cost == "proxy":
        return QuestionCost(attention)
    builder.require("reward.attention.cost 'judge' (or cost: proxy)", ["judge"])
    return QuestionCost(attention, builder.judge(builder.judge_attempts()))


def info_gain_reward(builder: RewardParts, responders: Responders | None = None) -> RewardFn:
    """The paper's reward: the builder's ``generator`` (the live policy, given to the builder by
    the trainer) scores beliefs, the frozen responders answer; settings from ``reward``."""
    from prour.rewards import InfoGainReward

    r = responders or build_responders(builder)
    return InfoGainReward(builder.llm("generator"), r.strict_user, r.verifier_factory,
                          builder.recipe.reward, r.question_cost)
