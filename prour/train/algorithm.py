"""DAPO pieces of the query-generator update: which samples are kept, advantages, loss.

The maths of advantages and of the clipped surrogate is verl's (``verl.trainer.ppo.core_algos``),
called with our hyperparameters so that the local trainer and the verl backend optimise the
same objective. verl is imported inside the functions that need it (it takes seconds to load).

Shapes: ``bs`` samples (rows), ``T`` response tokens (right-padded), ``V`` vocabulary size.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch

from prour.config.train import PPOSettings

ASK = "ask"


def select_kept(
    kinds: Sequence[str], n_keep: int, failed: Sequence[bool] | None = None
) -> list[int]:
    """Indices (ascending) of the samples kept from one group of ``len(kinds)`` samples.

    Samples whose kind is ``"ask"`` (a well-formed question) are taken first, then the rest,
    each in sampling order, until ``n_keep`` are taken. Failed samples (responder error) are
    never kept: they carry no reward and must not reach the update.
    """
    if n_keep < 1:
        raise ValueError(f"n_keep must be >= 1, got {n_keep}")
    if failed is not None and len(failed) != len(kinds):
        raise ValueError(f"failed has {len(failed)} entries for {len(kinds)} samples")
    usable = [i for i in range(len(kinds)) if not (failed and failed[i])]
    asks = [i for i in usable if kinds[i] == ASK]
    rest = [i for i in usable if kinds[i] != ASK]
    return sorted((asks + rest)[:n_keep])


def drop_zero_variance(groups: Sequence[Sequence[float]], atol: float = 0.0) -> list[int]:
    """Indices of the groups whose rewards are not all equal (DAPO dynamic sampling).

    A group whose kept rewards are equal (within ``atol``) has zero advantage everywhere and
    so contributes no gradient; a group of fewer than two rewards is dropped for the same reason.
    """
    kept = []
    for index, rewards in enumerate(groups):
        if len(rewards) >= 2 and max(rewards) - min(rewards) > atol:
            kept.append(index)
    return kept


def group_advantages(
    rewards: torch.Tensor,
    group_ids: Sequence[Hashable],
    response_mask: torch.Tensor,
    epsilon: float,
) -> torch.Tensor:
    """GRPO advantages ``(r - mean_g) / (std_g + epsilon)`` broadcast over response tokens.

    ``rewards``: (bs,) one scalar per sample; ``group_ids``: bs labels (samples of one state
    share a label); ``response_mask``: (bs, T). Returns (bs, T), zero on masked tokens. The group
    statistics are verl's (``compute_grpo_outcome_advantage``: unbiased std). verl gives a lone
    sample its raw reward as advantage; callers must not pass groups of one (see
    :func:`drop_zero_variance`).
    """
    import numpy as np
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    if rewards.dim() != 1 or rewards.shape[0] != response_mask.shape[0]:
        raise ValueError(
            f"rewards must be (bs,) matching response_mask {tuple(response_mask.shape)}, "
            f"got {tuple(rewards.shape)}"
        )
    token_rewards = torch.zeros_like(response_mask, dtype=torch.float32)
    token_rewards[:, 0] = rewards.float()
    index = np.array([str(g) for g in group_ids], dtype=object)
    advantages, _returns = compute_grpo_outcome_advantage(
        token_level_rewards=token_rewards,
        response_mask=response_mask.float(),
        index=index,
        epsilon=epsilon,
        norm_adv_by_std_in_grpo=True,
    )
    return advantages


def _actor_config(settings: PPOSettings, batch_num_tokens: int | None) -> Any:
    """verl's actor config carrying our clip settings (the registered loss reads them from it)."""
    from verl.workers.config import FSDPActorConfig

    config = FSDPActorConfig(
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=settings.clip_low,
        clip_ratio_low=settings.clip_low,
        clip_ratio_high=settings.clip_high,
        clip_ratio_c=settings.clip_ratio_c,
        entropy_coeff=settings.entropy_coeff,
        loss_agg_mode=settings.loss_agg_mode,
        use_kl_loss=False,
    )
    if batch_num_tokens is not None:
        config.global_batch_info.update(dp_size=1, batch_num_tokens=batch_num_tokens)
    return config


def policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    settings: PPOSettings | None = None,
    entropy: torch.Tensor | None = None,
    batch_num_tokens: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate minus the entropy bonus, as verl's actor computes it; no KL term.

    ``settings`` is the recipe's ``train.ppo``: clip range, dual-clip constant, entropy bonus
    and aggregation (None: its defaults, the paper's).

    All tensors are (bs, T); ``entropy`` is the per-token entropy of the current policy.
    ``batch_num_tokens`` is the number of response tokens in the whole mini-batch: with it the
    loss of each micro-batch is its token sum divided by that count, so that gradients
    accumulated over micro-batches equal the token mean over the mini-batch (verl's semantics).
    Returns the scalar loss and metrics (``pg_loss``, ``pg_clipfrac``, ``pg_clipfrac_lower``,
    ``ppo_kl``, ``entropy``).
    """
    from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn

    settings = settings or PPOSettings()
    config = _actor_config(settings, batch_num_tokens)
    mask = response_mask.bool()
    loss_fn = get_policy_loss_fn("vanilla")
    pg_loss, pg_metrics = loss_fn(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=mask,
        loss_agg_mode=settings.loss_agg_mode,
        config=config,
    )
    metrics = {key.removeprefix("actor/"): float(value) for key, value in pg_metrics.items()}
    metrics["pg_loss"] = float(pg_loss.detach())
    loss = pg_loss
    if entropy is not None:
        entropy_term = agg_loss(
            loss_mat=entropy,
            loss_mask=mask,
            loss_agg_mode=settings.loss_agg_mode,
            **config.global_batch_info,
        )
        loss = pg_loss - settings.entropy_coeff * entropy_term
        metrics["entropy"] = float(entropy_term.detach())
    return loss, metrics


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Per-token entropy (nats) of the categorical distributions in ``logits`` (..., V) -> (...)."""
    from verl.utils.torch_functional import entropy_from_logits

    return entropy_from_logits(logits)
