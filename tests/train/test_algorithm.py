"""Selection, advantages, loss (CPU): our calls against hand-written maths and verl's reference."""

from __future__ import annotations

import math

import pytest
import torch
from train_helpers import random_batch

from prour.config.train import PPOSettings
from prour.train.algorithm import (
    drop_zero_variance,
    group_advantages,
    policy_loss,
    select_kept,
    token_entropy,
)


@pytest.mark.parametrize(
    ("kinds", "failed", "n_keep", "expected"),
    [
        # 8 samples, 3 questions: the 3 questions, then the first 3 of the rest in sampling order.
        (
            ["none", "ask", "invalid", "ask", "none", "none", "ask", "invalid"],
            None,
            6,
            [0, 1, 2, 3, 4, 6],
        ),
        # All questions: the first 6 in sampling order.
        (["ask"] * 8, None, 6, [0, 1, 2, 3, 4, 5]),
        # No question at all: the first 6.
        (["invalid"] * 4 + ["none"] * 4, None, 6, [0, 1, 2, 3, 4, 5]),
        # Questions at the end still win over earlier non-questions.
        (["none"] * 6 + ["ask", "ask"], None, 6, [0, 1, 2, 3, 6, 7]),
        # 7 questions: the last one is dropped, the non-question too.
        (["ask"] * 3 + ["none"] + ["ask"] * 4, None, 6, [0, 1, 2, 4, 5, 6]),
        # Failed samples are never kept, even when that leaves fewer than n_keep.
        (["ask", "ask", "none", "none"], [True, False, False, True], 3, [1, 2]),
        (["ask"] * 8, [False, True] * 4, 6, [0, 2, 4, 6]),
    ],
)
def test_select_kept_table(kinds, failed, n_keep, expected):
    assert select_kept(kinds, n_keep=n_keep, failed=failed) == expected


def test_select_kept_rejects_bad_arguments():
    with pytest.raises(ValueError, match="n_keep"):
        select_kept(["ask"], n_keep=0)
    with pytest.raises(ValueError, match="2 entries for 3 samples"):
        select_kept(["ask", "none", "none"], n_keep=2, failed=[False, True])


def test_drop_zero_variance():
    groups = [[0.0, 0.0, 0.0], [0.0, 1.0, 0.0], [-1.0], [0.5, 0.5 + 1e-9], []]
    assert drop_zero_variance(groups) == [1, 3]
    assert drop_zero_variance(groups, atol=1e-6) == [1]


def test_group_advantages_match_hand_computation():
    rewards = torch.tensor([1.0, 0.0, 0.5, 2.0, -1.0, 3.0, 0.0])
    groups = ["a", "a", "a", "b", "b", "b", "b"]
    mask = torch.tensor(
        [[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]],
        dtype=torch.float32,
    )
    got = group_advantages(rewards, groups, mask, epsilon=1e-6)
    expected = torch.zeros_like(mask)
    for label in ("a", "b"):
        rows = [i for i, g in enumerate(groups) if g == label]
        values = [float(rewards[i]) for i in rows]
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
        for i in rows:
            expected[i] = (values[rows.index(i)] - mean) / (std + 1e-6) * mask[i]
    torch.testing.assert_close(got, expected)
    # Group a by hand: mean 0.5, std 0.5 -> advantages 1, -1, 0.
    torch.testing.assert_close(got[:3, 0], torch.tensor([1.0, -1.0, 0.0]), atol=1e-5, rtol=0)


def _hand_loss(old, new, adv, mask, low, high, c, entropy, coeff, n_tokens):
    """Independent reading of the dual-clip PPO objective with token-mean aggregation."""
    total_pg, total_ent = 0.0, 0.0
    clipped, counted = 0, 0
    for i in range(old.shape[0]):
        for t in range(old.shape[1]):
            if not mask[i, t]:
                continue
            log_ratio = max(-20.0, min(20.0, float(new[i, t] - old[i, t])))
            ratio = math.exp(log_ratio)
            a = float(adv[i, t])
            unclipped = -a * ratio
            clipped_term = -a * min(max(ratio, 1 - low), 1 + high)
            loss = max(unclipped, clipped_term)
            clipped += clipped_term > unclipped
            counted += 1
            if a < 0:
                loss = min(loss, -a * c)
            total_pg += loss
            total_ent += float(entropy[i, t])
    return total_pg / n_tokens - coeff * total_ent / n_tokens, clipped / counted


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_policy_loss_matches_hand_implementation(seed):
    old, new, adv, mask, entropy = random_batch(seed)
    settings = PPOSettings(clip_low=0.2, clip_high=0.3, clip_ratio_c=3.0, entropy_coeff=0.01)
    loss, metrics = policy_loss(old, new, adv, mask, settings, entropy=entropy)
    expected, clipfrac = _hand_loss(old, new, adv, mask, 0.2, 0.3, 3.0, entropy, 0.01, mask.sum())
    assert float(loss) == pytest.approx(float(expected), rel=1e-5, abs=1e-6)
    assert metrics["pg_clipfrac"] == pytest.approx(clipfrac, abs=1e-6)
    assert 0 < metrics["pg_clipfrac"] < 1  # the batch really exercises the clip


@pytest.mark.filterwarnings("ignore:.*compute_policy_loss.*deprecated:FutureWarning")
def test_policy_loss_matches_verl_reference():
    from verl.trainer.ppo.core_algos import compute_policy_loss

    old, new, adv, mask, _ = random_batch(7)
    ours, metrics = policy_loss(old, new, adv, mask, PPOSettings(clip_ratio_c=3.0))
    ref_loss, ref_clipfrac, ref_kl, ref_lower = compute_policy_loss(
        old, new, adv, mask, cliprange=0.2, cliprange_low=0.2, cliprange_high=0.3, clip_ratio_c=3.0
    )
    torch.testing.assert_close(ours, ref_loss)
    assert metrics["pg_clipfrac"] == pytest.approx(float(ref_clipfrac))
    assert metrics["pg_clipfrac_lower"] == pytest.approx(float(ref_lower))
    assert metrics["ppo_kl"] == pytest.approx(float(ref_kl))


def test_micro_batches_accumulate_to_the_mini_batch_token_mean():
    old, new, adv, mask, entropy = random_batch(3)
    whole, _ = policy_loss(old, new, adv, mask, entropy=entropy)
    n_tokens = int(mask.sum())
    parts = [
        policy_loss(
            old[i : i + 1],
            new[i : i + 1],
            adv[i : i + 1],
            mask[i : i + 1],
            entropy=entropy[i : i + 1],
            batch_num_tokens=n_tokens,
        )[0]
        for i in range(old.shape[0])
    ]
    torch.testing.assert_close(sum(parts), whole)


def test_entropy_bonus_gradient_and_no_kl():
    """The loss depends on the entropy with coefficient 0.01 and on nothing but the four inputs."""
    old, new, adv, mask, entropy = random_batch(5)
    entropy = entropy.clone().requires_grad_(True)
    loss, _ = policy_loss(old, new, adv, mask, PPOSettings(entropy_coeff=0.01), entropy=entropy)
    loss.backward()
    expected = -0.01 * mask / mask.sum()
    torch.testing.assert_close(entropy.grad, expected)


def test_token_entropy_uniform_and_peaked():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]])
    ent = token_entropy(logits)
    assert float(ent[0]) == pytest.approx(math.log(4), rel=1e-6)
    assert float(ent[1]) == pytest.approx(0.0, abs=1e-6)
