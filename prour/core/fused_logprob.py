"""Per-token log-probs and entropies from final hidden states and the LM head, a chunk at a time.

The unfused update multiplies every response token's hidden state by the LM head, keeps the
logits (R, V) of a whole micro-batch, and takes log-softmax and entropy over them; autograd then
holds those logits and their softmax for the backward. :func:`fused_token_scores` computes the
same two numbers per token with at most ``chunk_tokens`` rows of logits alive at a time: the
forward keeps only the (N,) results, and the backward recomputes each chunk's logits from the
saved hidden states and weight and turns them straight into the gradients of both inputs.

Numbers follow the unfused path exactly: the logits are the matmul in the compute dtype (the
autocast dtype when autocast is on for the tensors' device, else the inputs' dtype), upcast to
float32 and divided by the sampling temperature; the log-prob of the target is the logit minus
the log-sum-exp, the entropy is ``logsumexp(z) - sum(softmax(z) * z)``
(:func:`prour.core.policy_gradient.token_entropy`).

Gradients, with ``z`` the scaled logits, ``p = softmax(z)`` and ``H`` the entropy:
``d log p_y / dz = onehot(y) - p`` and ``dH / dz = -p * (log p + H)``; both are divided by the
temperature and pushed through the matmul (``dh = g W``, ``dW = g^T h``, the weight's
gradient summed over chunks in float32).

Pure torch, no recipe imports, so ``benchmarks/gpu_step.py`` can use it on a machine without
prour's dependencies.
"""

from __future__ import annotations

from typing import Any

import torch


def fused_token_scores(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    *,
    with_entropy: bool = True,
    chunk_tokens: int = 512,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of ``targets`` and entropy at each of N tokens, both float32 (N,).

    ``hidden``: (N, H) final hidden states (what the LM head reads); ``weight``: (V, H) the LM
    head's weight (no bias); ``targets``: (N,) token ids; ``temperature`` > 0 divides the
    logits. Differentiable in ``hidden`` and ``weight``. Entropy is None without
    ``with_entropy`` (and is then not computed).
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden must be (N, H) and weight (V, H), got {tuple(hidden.shape)} and "
            f"{tuple(weight.shape)}"
        )
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets must be ({hidden.shape[0]},), got {tuple(targets.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        compute = torch.get_autocast_dtype(device_type)
    else:
        compute = torch.promote_types(hidden.dtype, weight.dtype)
    log_probs, entropy = _ChunkedScores.apply(
        hidden, weight, targets.to(device=hidden.device, dtype=torch.long), float(temperature),
        int(chunk_tokens), bool(with_entropy), compute,
    )
    return log_probs, (entropy if with_entropy else None)


def _scaled_logits(
    hidden: torch.Tensor, weight: torch.Tensor, compute: torch.dtype, temperature: float
) -> torch.Tensor:
    """float32 logits / temperature of a chunk (``weight`` already in ``compute``)."""
    return (hidden.to(compute) @ weight.t()).float() / temperature


class _ChunkedScores(torch.autograd.Function):
    """Forward and backward of :func:`fused_token_scores`, chunk by chunk, autocast off inside
    (the compute dtype is fixed once, so both passes compute the same logits)."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        temperature: float,
        chunk: int,
        with_entropy: bool,
        compute: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.set_materialize_grads(False)
        n = hidden.shape[0]
        log_probs = torch.empty(n, dtype=torch.float32, device=hidden.device)
        entropy = torch.empty(n if with_entropy else 0, dtype=torch.float32, device=hidden.device)
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(compute)
            for start in range(0, n, chunk):
                stop = min(start + chunk, n)
                logits = _scaled_logits(hidden[start:stop], w, compute, temperature)
                lse = torch.logsumexp(logits, dim=-1)
                picked = logits.gather(-1, targets[start:stop, None]).squeeze(-1)
                log_probs[start:stop] = picked - lse
                if with_entropy:
                    probs = torch.softmax(logits, dim=-1)
                    entropy[start:stop] = lse - (probs * logits).sum(-1)
        ctx.save_for_backward(hidden, weight, targets)
        ctx.options = (temperature, chunk, with_entropy, compute)
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        return log_probs, entropy

    @staticmethod
    def backward(
        ctx: Any, d_log_probs: torch.Tensor | None, d_entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, targets = ctx.saved_tensors
        temperature, chunk, with_entropy, compute = ctx.options
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if not with_entropy:
            d_entropy = None
        d_hidden = torch.zeros_like(hidden) if need_hidden else None
        d_weight = (torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
                    if need_weight else None)
        if (d_log_probs is None and d_entropy is None) or not (need_hidden or need_weight):
            return d_hidden, _cast(d_weight, weight.dtype), None, None, None, None, None
        n = hidden.shape[0]
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(compute)
            for start in range(0, n, chunk):
                stop = min(start + chunk, n)
                logits = _scaled_logits(hidden[start:stop], w, compute, temperature)
                grad = _logit_grad(
                    logits, targets[start:stop],
                    None if d_log_probs is None else d_log_probs[start:stop].float(),
                    None if d_entropy is None else d_entropy[start:stop].float(),
                )
                grad = grad.div_(temperature).to(compute)
                if d_hidden is not None:
                    d_hidden[start:stop] = (grad @ w).to(hidden.dtype)
                if d_weight is not None:
                    d_weight += (grad.t() @ hidden[start:stop].to(compute)).float()
        return d_hidden, _cast(d_weight, weight.dtype), None, None, None, None, None


def _logit_grad(
    logits: torch.Tensor,
    targets: torch.Tensor,
    d_log_probs: torch.Tensor | None,
    d_entropy: torch.Tensor | None,
) -> torch.Tensor:
    """Gradient w.r.t. the (scaled) logits of ``sum(d_lp * log p_y) + sum(d_H * H)``; reuses
    ``logits``' memory, so at most two chunk-sized float32 tensors are alive."""
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)
    probs = torch.softmax(logits, dim=-1)
    grad: torch.Tensor | None = None
    if d_entropy is not None:
        entropy = lse - (probs * logits).sum(-1, keepdim=True)
        # -p * (log p + H) * d_H, with log p = z - lse, built in the logits' memory
        grad = logits.sub_(lse).add_(entropy).mul_(probs).mul_(-d_entropy[:, None])
    if d_log_probs is not None:
        onehot_part = probs.mul_(-d_log_probs[:, None])
        onehot_part.scatter_add_(-1, targets[:, None], d_log_probs[:, None])
        grad = onehot_part if grad is None else grad.add_(onehot_part)
    assert grad is not None
    return grad


def _cast(tensor: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return None if tensor is None else tensor.to(dtype)
