"""Information-gain reward: belief prompts, prior/posterior scoring by the policy, R = ℓ_post − ℓ_prior.

Names load on first use, so that :mod:`prour.config` can import the ``reward`` section
(:mod:`prour.config.rewards`) without the reward's runtime.
"""

from prour.registry import lazy_exports

_EXPORTS = {
    "prour.rewards.belief": ("belief_prompt",),
    "prour.config.rewards": ("RewardConfig",),
    "prour.rewards.reward": ("InfoGainReward", "SampleReward", "info_gain"),
    "prour.data.schema": ("RewardState", "state_from_row"),
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
