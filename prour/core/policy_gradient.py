"""DAPO's update maths: which samples are kept, group advantages, the clipped policy loss.

Pure torch. The formulas are verl's (``verl.trainer.ppo.core_algos``:
``compute_grpo_outcome_advantage``, ``compute_policy_loss_vanilla`` and ``agg_loss`` in
``token-mean``), written out here so that the local trainer runs without verl and the verl
backend optimises the same objective; tests/train/test_algorithm.py holds each equal to verl's,
in value and gradient.

Shapes: ``bs`` samples (rows), ``T`` response tokens (right-padded), ``V`` vocabulary size.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # pragma: no cover
    from prour.config.train import PPOSettings

ASK = "ask"
LOG_RATIO_BOUND = 20.0  # log-ratios are clamped to ±20 before exp, as verl does


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
    share a label; labels are compared as strings, as verl does); ``response_mask``: (bs, T).
    Returns (bs, T), zero on masked tokens. The std is the unbiased one. A lone sample gets its
    raw reward as advantage (mean 0, std 1, verl's rule); callers must not pass groups of one
    (see :func:`drop_zero_variance`).
    """
    if rewards.dim() != 1 or rewards.shape[0] != response_mask.shape[0]:
        raise ValueError(
            f"rewards must be (bs,) matching response_mask {tuple(response_mask.shape)}, "
            f"got {tuple(rewards.shape)}"
        )
    labels = [str(g) for g in group_ids]
    with torch.no_grad():
        scores = rewards.detach().to(device=response_mask.device, dtype=torch.float32).clone()
        members: dict[str, list[int]] = {}
        for i, label in enumerate(labels):
            members.setdefault(label, []).append(i)
        stats = {}
        for label, rows in members.items():
            if len(rows) == 1:
                stats[label] = (torch.tensor(0.0), torch.tensor(1.0))
            else:
                values = torch.stack([scores[i] for i in rows])
                stats[label] = (torch.mean(values), torch.std(values))
        for i, label in enumerate(labels):
            mean, std = stats[label]
            scores[i] = (scores[i] - mean) / (std + epsilon)
        return scores.unsqueeze(-1) * response_mask.float()


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is set (NaNs outside the mask do not leak in)."""
    return (torch.where(mask.bool(), values, 0.0) * mask).sum()


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is set (0 for an empty mask)."""
    return masked_sum(values, mask) / (mask.sum() + 1e-8)


def token_mean(
    loss_mat: torch.Tensor, mask: torch.Tensor, batch_num_tokens: int | None = None
) -> torch.Tensor:
    """Token-mean aggregation of a (bs, T) loss: its masked sum over ``batch_num_tokens`` (the
    mini-batch's response tokens, so that micro-batch losses add up to the mini-batch's token
    mean), or over this batch's own tokens when None."""
    if batch_num_tokens is None:
        return masked_sum(loss_mat, mask) / mask.sum()
    return masked_sum(loss_mat, mask) / batch_num_tokens


def policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    settings: PPOSettings | None = None,
    entropy: torch.Tensor | None = None,
    batch_num_tokens: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Dual-clip PPO surrogate minus the entropy bonus, aggregated by token mean; no KL term.

    ``settings`` is the recipe's ``train.ppo``: clip range, dual-clip constant, entropy bonus
    and aggregation (None: its defaults, the paper's).

    All tensors are (bs, T); ``entropy`` is the per-token entropy of the current policy.
    ``batch_num_tokens`` is the number of response tokens in the whole mini-batch: with it the
    loss of each micro-batch is its token sum divided by that count, so that gradients
    accumulated over micro-batches equal the token mean over the mini-batch (verl's semantics).
    Returns the scalar loss and metrics (``pg_clipfrac``, ``ppo_kl``, ``pg_clipfrac_lower``,
    ``pg_loss``, ``entropy``).
    """
    if settings is None:
        from prour.config.train import PPOSettings

        settings = PPOSettings()
    if settings.loss_agg_mode != "token-mean":
        raise ValueError(f"train.ppo.loss_agg_mode {settings.loss_agg_mode!r}: only 'token-mean'")
    mask = response_mask.bool()
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-LOG_RATIO_BOUND, max=LOG_RATIO_BOUND)
    ratio = torch.exp(log_ratio)
    ppo_kl = masked_mean(-log_ratio, mask)

    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - settings.clip_low, 1 + settings.clip_high)
    clip_losses = torch.maximum(unclipped, clipped)
    clipfrac = masked_mean(torch.gt(clipped, unclipped).float(), mask)

    dual_bound = -advantages * settings.clip_ratio_c  # caps the loss of negative advantages
    dual_losses = torch.min(dual_bound, clip_losses)
    clipfrac_lower = masked_mean(
        torch.gt(clip_losses, dual_bound) * (advantages < 0).float(), mask
    )
    losses = torch.where(advantages < 0, dual_losses, clip_losses)
    pg_loss = token_mean(losses, mask, batch_num_tokens)

    metrics = {
        "pg_clipfrac": clipfrac.detach().item(),
        "ppo_kl": ppo_kl.detach().item(),
        "pg_clipfrac_lower": clipfrac_lower.detach().item(),
        "pg_loss": float(pg_loss.detach()),
    }
    loss = pg_loss
    if entropy is not None:
        entropy_term = token_mean(entropy, mask, batch_num_tokens)
        loss = pg_loss - settings.entropy_coeff * entropy_term
        metrics["entropy"] = float(entropy_term.detach())
    return loss, metrics


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Per-token entropy (nats) of the categorical distributions in ``logits`` (..., V) -> (...)."""
    probs = torch.nn.functional.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(probs * logits, dim=-1)
