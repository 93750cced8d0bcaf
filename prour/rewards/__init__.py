"""Information-gain reward: belief prompts, prior/posterior scoring by the policy, R = ℓ_post − ℓ_prior.

Names load on first use, so that :mod:`prour.config` can import the ``reward`` section
(:mod:`prour.rewards.config`) without the reward's runtime.
"""

from importlib import import_module

_EXPORTS = {
    "prour.rewards.belief": ("belief_prompt",),
    "prour.rewards.config": ("RewardConfig",),
    "prour.rewards.reward": ("InfoGainReward", "SampleReward", "info_gain"),
    "prour.data.schema": ("RewardState", "state_from_row"),
}
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str) -> object:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_HOME[name]), name)
