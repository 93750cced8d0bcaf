"""What the trainer needs from a reward: score one state's group of sampled outputs.

:class:`prour.rewards.InfoGainReward` is the paper's reward. :class:`VerifiableFormatReward` is
a rule-checked stand-in that needs no responder: it pays for a well-formed question, which lets
tests show that the trainer learns (its reward rises) without any model besides the policy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Protocol, runtime_checkable

from prour.llm.base import Completion
from prour.rewards.reward import SampleReward
from prour.rollout.query import parse_query


@runtime_checkable
class RewardFn(Protocol):
    """Scores the sampled outputs of one state, in order; ``failed`` samples carry no reward."""

    def score_group(self, state: Any, completions: Sequence[Completion]) -> list[SampleReward]: ...

    def policy_updated(self) -> None:
        """Called after every optimizer step (cached scores of the old policy become stale)."""
        ...


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
    """The frozen side of the reward: strict user, verifier per domain, and reward settings."""

    strict_user: Any
    verifier_factory: Callable[[str], Any] | None
    config: Any


def build_responders(recipe: Any) -> Responders:
    """Responders from the recipe: clarify queries go to ``models.strict_user``, verify queries
    to a read-only verifier on ``models.verifier`` (one per domain, built once)."""
    from prour.config import ConfigError
    from prour.llm import SamplingParams, build_llm
    from prour.rewards import RewardConfig
    from prour.rollout import StrictUserSimulator, Verifier

    config = getattr(recipe, "reward", None) or RewardConfig()
    if "strict_user" not in recipe.models:
        raise ConfigError(
            "models.strict_user", "the information-gain reward needs the strict user simulator"
        )
    sampling = SamplingParams(
        temperature=config.responder_temperature, max_tokens=config.responder_max_tokens
    )
    strict_user = StrictUserSimulator(build_llm(recipe.models["strict_user"]), sampling)
    verifier_factory = None
    if "verifier" in recipe.models:
        verifier_llm = build_llm(recipe.models["verifier"])

        @cache
        def verifier_factory(domain: str) -> Verifier:
            return Verifier(
                verifier_llm, domain, max_steps=config.verifier_max_steps, sampling=sampling
            )

    return Responders(strict_user, verifier_factory, config)


def info_gain_reward(
    recipe: Any, policy_llm: Any, responders: Responders | None = None
) -> RewardFn:
    """The paper's reward: ``policy_llm`` (the live policy) scores beliefs, the frozen responders
    answer; settings from the recipe's ``reward`` section (defaults when it has none)."""
    from prour.rewards import InfoGainReward

    r = responders or build_responders(recipe)
    return InfoGainReward(policy_llm, r.strict_user, r.verifier_factory, r.config)
