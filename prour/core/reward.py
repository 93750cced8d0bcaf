"""The information-gain reward's arithmetic (paper 3.3, A.3), and its attention-priced utility.

For a state with target Y, a query Q and its answer A: ℓ_prior = log p_θ(Y | belief(h)),
ℓ_post = log p_θ(Y | belief(h, Q, A)), each aggregated over Y's tokens (their sum, or their mean
with ``reward.aggregation: mean``), and R = ℓ_post − ℓ_prior in nats. With
``reward.attention.lambda`` λ > 0 an answered clarify question earns U = R − λ·cost(Q).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

AGGREGATIONS = ("sum", "mean")


def target_logprob(token_logprobs: Sequence[float], aggregation: str) -> float:
    """log p_θ(Y | context) from Y's token log-probs (nats): their sum, or their mean per token
    (an empty target scores 0)."""
    total = float(sum(token_logprobs))
    if aggregation == "sum":
        return total
    if aggregation == "mean":
        return total / max(1, len(token_logprobs))
    raise ValueError(f"unknown aggregation {aggregation!r}; valid: {', '.join(AGGREGATIONS)}")


def info_gain(prior_logprob: float, post_logprob: float) -> float:
    """R = ℓ_post − ℓ_prior in nats: how much the answer raised the policy's log-belief in Y."""
    return float(post_logprob) - float(prior_logprob)


def utility(reward: float, cost: float, lam: float) -> float:
    """U = R − λ·A: reward minus the priced attention cost."""
    if not (math.isfinite(lam) and lam >= 0):
        raise ValueError(f"lam must be a finite number >= 0, got {lam}")
    if cost < 0:
        raise ValueError(f"cost must be >= 0, got {cost}")
    return float(reward - lam * cost)
