"""prour.core.policy_gradient against verl's core_algos (CPU): the same numbers and gradients.

The local trainer runs the core's own torch code; verl is imported here only, as the reference
the verl backend optimises with.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from train_helpers import random_batch

from prour.config.train import PPOSettings
from prour.core.policy_gradient import group_advantages, policy_loss, token_entropy

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")


def _verl_loss(old, new, adv, mask, settings, entropy, batch_num_tokens):
    """The verl actor's loss: the registered vanilla loss minus the entropy bonus (agg_loss)."""
    from verl.workers.config import FSDPActorConfig

    config = FSDPActorConfig(
        rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=settings.clip_low,
        clip_ratio_low=settings.clip_low, clip_ratio_high=settings.clip_high,
        clip_ratio_c=settings.clip_ratio_c, entropy_coeff=settings.entropy_coeff,
        loss_agg_mode=settings.loss_agg_mode, use_kl_loss=False,
    )
    if batch_num_tokens is not None:
        config.global_batch_info.update(dp_size=1, batch_num_tokens=batch_num_tokens)
    mask = mask.bool()
    pg_loss, metrics = core_algos.get_policy_loss_fn("vanilla")(
        old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask,
        loss_agg_mode=settings.loss_agg_mode, config=config,
    )
    entropy_term = core_algos.agg_loss(loss_mat=entropy, loss_mask=mask,
                                       loss_agg_mode=settings.loss_agg_mode,
                                       **config.global_batch_info)
    metrics = {key.removeprefix("actor/"): value for key, value in metrics.items()}
    return pg_loss - settings.entropy_coeff * entropy_term, metrics


SETTINGS = [PPOSettings(), PPOSettings(clip_low=0.1, clip_high=0.5, clip_ratio_c=2.0,
                                        entropy_coeff=0.05)]


@pytest.mark.parametrize("settings", SETTINGS, ids=["paper", "other"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("whole_batch", [True, False], ids=["own_tokens", "batch_tokens"])
def test_policy_loss_equals_verl_in_value_and_gradient(settings, seed, whole_batch):
    old, new, adv, mask, entropy = random_batch(seed)
    n_tokens = None if whole_batch else int(mask.sum()) + 11  # a micro-batch of a larger batch
    ours_new, ref_new = new.clone().requires_grad_(), new.clone().requires_grad_()
    ours_ent, ref_ent = entropy.clone().requires_grad_(), entropy.clone().requires_grad_()
    ours, metrics = policy_loss(old, ours_new, adv, mask, settings, entropy=ours_ent,
                                batch_num_tokens=n_tokens)
    ref, ref_metrics = _verl_loss(old, ref_new, adv, mask, settings, ref_ent, n_tokens)
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)
    ours.backward()
    ref.backward()
    torch.testing.assert_close(ours_new.grad, ref_new.grad, rtol=0, atol=0)
    torch.testing.assert_close(ours_ent.grad, ref_ent.grad, rtol=0, atol=0)
    assert float(ours_new.grad.abs().sum()) > 0  # the surrogate really depends on the log-probs
    for key in ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"):
        assert metrics[key] == ref_metrics[key], key
    assert 0 < metrics["pg_clipfrac"] < 1  # the batch exercises the clip


def test_group_advantages_equal_verl():
    gen = torch.Generator().manual_seed(4)
    rewards = torch.randn(9, generator=gen)
    groups = [0, 0, 0, 1, 1, 2, 2, 2, 2]
    mask = (torch.rand(9, 6, generator=gen) > 0.3).float()
    ours = group_advantages(rewards, groups, mask, epsilon=1e-6)
    token_rewards = torch.zeros_like(mask)
    token_rewards[:, 0] = rewards
    ref, _ = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=token_rewards, response_mask=mask,
        index=np.array([str(g) for g in groups], dtype=object), epsilon=1e-6,
        norm_adv_by_std_in_grpo=True,
    )
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)


def test_token_entropy_equals_verl():
    from verl.utils.torch_functional import entropy_from_logits

    logits = torch.randn(3, 5, 11, generator=torch.Generator().manual_seed(2)) * 3
    torch.testing.assert_close(token_entropy(logits), entropy_from_logits(logits), rtol=0, atol=0)


def test_warmup_schedule_equals_verl():
    from verl.utils.torch_functional import get_constant_schedule_with_warmup

    from prour.train.step import constant_schedule_with_warmup

    def rates(make) -> list[float]:
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
        scheduler = make(optimizer)
        out = []
        for _ in range(8):
            out.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        return out

    for warmup in (0, 1, 5):
        ours = rates(lambda o, w=warmup: constant_schedule_with_warmup(o, w))
        assert ours == rates(lambda o, w=warmup: get_constant_schedule_with_warmup(o, w))
        assert ours[warmup:] == [0.5] * (8 - warmup)
