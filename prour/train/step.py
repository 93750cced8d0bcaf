"""One DAPO update of the local trainer: from a step's scored groups to ``optimizer.step()``.

Read top to bottom: :func:`select_groups` keeps ``rollout.keep`` samples per state (questions
first, failed never) and drops the groups without a usable signal; :func:`update` computes GRPO
advantages within each kept group and the log-probs of the policy that sampled, then runs
``ppo.epochs`` passes over mini-batches of whole states, each one micro-batch forwards and
backwards of the clipped surrogate, a grad-norm clip and one optimizer step. The maths is
:mod:`prour.core.policy_gradient`; the forward is the policy's ``token_scores`` (passed in).
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from prour.core.policy_gradient import (
    drop_zero_variance,
    group_advantages,
    policy_loss,
    select_kept,
)
from prour.train.layout import token_micro_batches

if TYPE_CHECKING:  # pragma: no cover
    from prour.config.train import PPOSettings, TrainConfig, UpdateSettings

logger = logging.getLogger(__name__)


class Sample(Protocol):
    """A sampled response as the update reads it (:class:`prour.train.policy.Rollout`)."""

    prompt_ids: list[int]
    response_ids: list[int]


class Scored(Protocol):
    """A sample's reward as selection reads it (:class:`prour.rewards.reward.SampleReward`)."""

    kind: str
    failed: bool
    reward: float | None


class TokenScores(Protocol):
    """Per-token log-probs, entropies and mask of a micro-batch of responses, all (B, R)."""

    log_probs: torch.Tensor
    entropy: torch.Tensor | None
    mask: torch.Tensor


class Scorer(Protocol):
    """The live policy (:class:`prour.train.policy.Policy`): its model, device and forward."""

    model: torch.nn.Module
    device: torch.device

    def token_scores(
        self, rollouts: Sequence[Any], with_entropy: bool = False, *, update: UpdateSettings
    ) -> TokenScores: ...


@dataclass
class Kept:
    """A sample that reaches the update: its rollout, reward and state (group) index."""

    rollout: Any
    reward: float
    group: int


def select_groups(
    rollouts: Sequence[Sequence[Sample]],
    rewards: Sequence[Sequence[Scored]],
    keep: int,
    drop_equal: bool,
) -> tuple[list[list[Kept]], dict[str, Any]]:
    """Keep ``keep`` per state (failed never), then drop groups without a usable signal: with
    ``drop_equal`` (DAPO dynamic sampling) those whose kept rewards are all equal, else only
    those of fewer than two samples. Returns the groups and the selection's metrics."""
    groups: list[list[Kept]] = []
    for g, (group, scored) in enumerate(zip(rollouts, rewards)):
        failed = [s.failed or s.reward is None for s in scored]
        kept = select_kept([s.kind for s in scored], keep, failed)
        groups.append([Kept(group[i], float(scored[i].reward), g) for i in kept])
    n_kept = sum(len(g) for g in groups)
    if drop_equal:
        usable = drop_zero_variance([[k.reward for k in g] for g in groups])
    else:
        usable = [i for i, g in enumerate(groups) if len(g) >= 2]
    stats = {
        "n_kept": n_kept,
        "groups_used": len(usable),
        "groups_dropped": len(groups) - len(usable),
        "reward_kept_mean": mean_or_none([k.reward for g in groups for k in g]),
    }
    return [groups[i] for i in usable], stats


def update(
    groups: list[list[Kept]],
    policy: Scorer,
    optimizer: torch.optim.Optimizer,
    cfg: TrainConfig,
    seed: int,
    step: int,
) -> dict[str, Any]:
    """``ppo.epochs`` passes of the clipped surrogate over mini-batches of whole states; returns
    the update's metrics. ``seed`` and ``step`` seed the per-epoch shuffle of states."""
    if not groups:
        logger.warning("step %d: no group with a usable signal; no update", step)
        return Tally().summary() | {"update_tokens_per_s": None}
    t0 = time.perf_counter()
    flat = [k for g in groups for k in g]
    mask = lengths_mask([len(k.rollout.response_ids) for k in flat], policy.device)
    rewards = torch.tensor([k.reward for k in flat], device=policy.device)
    advantages = group_advantages(rewards, [k.group for k in flat], mask, cfg.ppo.adv_epsilon)
    old = old_log_probs(policy, flat, cfg)
    tally = Tally()
    policy.model.train()
    for epoch in range(cfg.ppo.epochs):
        for members in mini_batches(groups, cfg.ppo, seed, step, epoch):
            optimizer_step(policy, optimizer, flat, members, old, advantages, cfg, tally)
    tokens = int(mask.sum()) * cfg.ppo.epochs
    return tally.summary() | {"update_tokens_per_s": tokens / max(time.perf_counter() - t0, 1e-9)}


@torch.no_grad()
def old_log_probs(policy: Scorer, flat: list[Kept], cfg: TrainConfig) -> list[torch.Tensor]:
    """Log-probs under the policy that sampled (before any update), a 1-D tensor per sample."""
    policy.model.eval()
    out = []
    for micro in micro_batches(flat, list(range(len(flat))), cfg):
        scores = policy.token_scores([flat[i].rollout for i in micro], update=cfg.update)
        for row, i in enumerate(micro):
            out.append(scores.log_probs[row, : len(flat[i].rollout.response_ids)].detach())
    return out


def mini_batches(
    groups: list[list[Kept]], ppo: PPOSettings, seed: int, step: int, epoch: int
) -> Iterator[list[int]]:
    """Sample indices per mini-batch: ``mini_batch_states`` whole groups, shuffled per epoch."""
    starts, offset = [], 0
    for g in groups:
        starts.append(list(range(offset, offset + len(g))))
        offset += len(g)
    order = list(range(len(groups)))
    if ppo.shuffle:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step * 131 + epoch)
        order = torch.randperm(len(groups), generator=gen).tolist()
    for chunk in chunks(order, ppo.mini_batch_states):
        yield [i for g in chunk for i in starts[g]]


def micro_batches(flat: list[Kept], members: list[int], cfg: TrainConfig) -> list[list[int]]:
    """``members`` split into micro-batches: ``ppo.micro_batch_size`` samples each, or as
    many as fit ``update.micro_batch_tokens`` (see :func:`token_micro_batches`)."""
    budget = cfg.update.micro_batch_tokens
    if budget is None:
        return list(chunks(members, cfg.ppo.micro_batch_size))
    lengths = [len(flat[i].rollout.prompt_ids) + len(flat[i].rollout.response_ids)
               for i in members]
    groups = token_micro_batches(lengths, budget, cfg.update.packing)
    return [[members[j] for j in group] for group in groups]


def optimizer_step(
    policy: Scorer,
    optimizer: torch.optim.Optimizer,
    flat: list[Kept],
    members: list[int],
    old: list[torch.Tensor],
    advantages: torch.Tensor,
    cfg: TrainConfig,
    tally: Tally,
) -> None:
    """Accumulate micro-batch gradients of one mini-batch (token-mean over it), clip, step."""
    n_tokens = sum(len(flat[i].rollout.response_ids) for i in members)
    optimizer.zero_grad(set_to_none=True)
    for micro in micro_batches(flat, members, cfg):
        scores = policy.token_scores(
            [flat[i].rollout for i in micro], with_entropy=True, update=cfg.update
        )
        width = scores.log_probs.shape[1]
        loss, metrics = policy_loss(
            pad_rows([old[i] for i in micro], width),
            scores.log_probs,
            advantages[micro, :width],
            scores.mask,
            cfg.ppo,
            entropy=scores.entropy,
            batch_num_tokens=n_tokens,
        )
        loss.backward()
        tally.add_micro(metrics, int(scores.mask.sum()), n_tokens)
    params = [q for q in policy.model.parameters() if q.requires_grad]
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.optim.grad_clip))
    if math.isfinite(grad_norm):
        optimizer.step()
    tally.add_step(grad_norm)


class Tally:
    """Token-weighted means of loss metrics and grad-norm statistics over a step's update."""

    KEYS = ("pg_loss", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "entropy")
    # Aggregated over the whole mini-batch's tokens (policy_loss's batch_num_tokens): a
    # micro-batch's value is its token sum over the mini-batch's count, not its own mean.
    BATCH_SHARES = ("pg_loss", "entropy")

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.tokens = 0
        self.grad_norms: list[float] = []

    def add_micro(self, metrics: dict[str, float], tokens: int, batch_tokens: int) -> None:
        """One micro-batch's metrics: ``tokens`` its response tokens, ``batch_tokens`` those of
        its mini-batch. Each value goes in as a token sum, so the means do not depend on how a
        mini-batch is split into micro-batches."""
        for key, value in metrics.items():
            weight = batch_tokens if key in self.BATCH_SHARES else tokens
            self.sums[key] = self.sums.get(key, 0.0) + value * weight
        self.tokens += tokens

    def add_step(self, grad_norm: float) -> None:
        self.grad_norms.append(grad_norm)

    def summary(self) -> dict[str, Any]:
        finite = [g for g in self.grad_norms if math.isfinite(g)]
        out: dict[str, Any] = {
            key: self.sums[key] / self.tokens if self.tokens else None for key in self.KEYS
        }
        out.update(
            optimizer_steps=len(finite),
            skipped_steps=len(self.grad_norms) - len(finite),
            grad_norm=mean_or_none(finite),
            grad_norm_max=max(finite) if finite else None,
        )
        return out


def constant_schedule_with_warmup(
    optimizer: torch.optim.Optimizer, warmup_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Learning rate rising linearly from 0 over ``warmup_steps`` scheduler steps, then constant
    (verl's ``get_constant_schedule_with_warmup``; the trainer steps it once per training step)."""

    def factor(current: int) -> float:
        if current < warmup_steps:
            return float(current) / float(max(1.0, warmup_steps))
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def mean_or_none(values: Sequence[float]) -> float | None:
    return float(statistics.fmean(values)) if values else None


def chunks(items: list[int], size: int) -> Iterator[list[int]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def lengths_mask(lengths: list[int], device: torch.device) -> torch.Tensor:
    """(bs, T) float mask of right-padded rows of the given lengths."""
    width = max(lengths)
    return (
        torch.arange(width, device=device)[None, :] < torch.tensor(lengths, device=device)[:, None]
    ).float()


def pad_rows(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    """1-D tensors right-padded with zeros to ``width`` and stacked: (len(rows), width)."""
    return torch.stack([torch.nn.functional.pad(r, (0, width - r.shape[0])) for r in rows])
