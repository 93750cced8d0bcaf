"""Information-gain reward: belief prompts, prior/posterior scoring by the policy, R = ℓ_post − ℓ_prior."""

from prour._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "prour.rewards.belief": (
            "belief_prompt",
        ),
        "prour.rewards.config": (
            "RewardConfig",
        ),
        "prour.rewards.reward": (
            "InfoGainReward",
            "SampleReward",
            "info_gain",
        ),
        "prour.data.schema": (
            "RewardState",
            "state_from_row",
        ),
    },
)
