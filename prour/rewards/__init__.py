"""Information-gain reward: belief prompts, prior/posterior scoring by the policy, R = ℓ_post − ℓ_prior."""

from prour.rewards.belief import belief_prompt
from prour.rewards.config import RewardConfig
from prour.rewards.info_gain import (
    InfoGainReward,
    RewardState,
    SampleReward,
    info_gain,
    state_from_row,
)

__all__ = [
    "InfoGainReward",
    "RewardConfig",
    "RewardState",
    "SampleReward",
    "belief_prompt",
    "info_gain",
    "state_from_row",
]
