"""The reward's arithmetic (CPU, hand-computed numbers): aggregation, information gain, utility."""

from __future__ import annotations

import math

import pytest

from prour.core.reward import info_gain, target_logprob, utility
from prour.llm.base import ScoreResult


def test_target_logprob_sums_or_averages_the_target_tokens():
    tokens = [-0.5, -1.0, -2.5]
    assert target_logprob(tokens, "sum") == pytest.approx(-4.0)
    assert target_logprob(tokens, "mean") == pytest.approx(-4.0 / 3)
    assert target_logprob([], "mean") == 0.0
    result = ScoreResult(tokens)  # the backends' own properties agree
    assert (target_logprob(tokens, "sum"), target_logprob(tokens, "mean")) == (result.sum,
                                                                                result.mean)
    with pytest.raises(ValueError, match="unknown aggregation 'max'; valid: sum, mean"):
        target_logprob(tokens, "max")


def test_information_gain_is_posterior_minus_prior():
    prior, post = target_logprob([-2.0, -3.0], "sum"), target_logprob([-1.0, -0.5], "sum")
    assert info_gain(prior, post) == pytest.approx(3.5)
    assert info_gain(post, prior) == pytest.approx(-3.5)


def test_utility_charges_lambda_times_cost():
    assert utility(1.5, 2.0, 0.25) == pytest.approx(1.0)
    assert utility(1.5, 2.0, 0.0) == 1.5
    with pytest.raises(ValueError, match="lam must be"):
        utility(1.0, 1.0, math.inf)
    with pytest.raises(ValueError, match="cost must be >= 0"):
        utility(1.0, -1.0, 0.5)
