"""Belief prompts and the information-gain formula."""

from __future__ import annotations

import pytest

from prour.rewards import belief_prompt, info_gain

HISTORY = [
    {"role": "system", "content": "POLICY"},
    {"role": "user", "content": "I want to exchange my keyboard."},
]


def test_info_gain_is_posterior_minus_prior():
    assert info_gain(-7.25, -3.0) == pytest.approx(4.25)
    assert info_gain(-3.0, -7.25) == pytest.approx(-4.25)
    assert info_gain(-2.0, -2.0) == 0.0


@pytest.mark.parametrize(
    "mode,header", [("clarify", "profile and intent"), ("verify", "Next tool call")]
)
def test_prior_and_posterior_differ_only_by_the_turn(mode, header):
    prior = belief_prompt(mode, HISTORY)[0]["content"]
    post = belief_prompt(mode, HISTORY, "Which switches?", "Clicky ones.")[0]["content"]
    assert header in prior and "I want to exchange my keyboard." in prior and "POLICY" not in prior
    assert "Which switches?" in post and "Clicky ones." in post
    head, tail = prior.split("\n\n###")
    assert post.startswith(head) and post.endswith("###" + tail)  # same text around the turn slot
    assert len(post) > len(prior)


def test_belief_prompt_checks_its_arguments():
    with pytest.raises(ValueError, match="clarify, verify"):
        belief_prompt("act", HISTORY)
    with pytest.raises(ValueError, match="both query and answer"):
        belief_prompt("clarify", HISTORY, query="Which one?")
