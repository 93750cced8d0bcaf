"""prour.core.fused_logprob (CPU): the chunked log-probs and entropies equal the unfused ones
(log-softmax and entropy over full logits) in value and in gradient w.r.t. the hidden states and
the LM-head weight, in float32 and under bf16 autocast; no op ever makes a (tokens x vocabulary)
tensor; verl's own fused function (the verl backend's ``use_fused_kernels``) agrees too."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from prour.core.fused_logprob import fused_token_scores
from prour.core.policy_gradient import token_entropy

N, H, V = 37, 16, 101  # 37 tokens: chunks of 8 leave a remainder of 5
TEMPERATURE = 0.8


def _inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=gen)
    weight = torch.randn(V, H, generator=gen) * 0.5
    targets = torch.randint(0, V, (N,), generator=gen)
    return hidden, weight, targets


def _unfused(hidden, weight, targets, temperature=TEMPERATURE):
    """Today's path: the LM head's full logits, upcast, scaled, log-softmax and entropy."""
    logits = torch.nn.functional.linear(hidden, weight).float() / temperature
    log_probs = torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)
    return log_probs, token_entropy(logits)


def _values_and_grads(scores_fn, hidden, weight, targets, lp_weight, ent_weight):
    """Scores and the gradients of ``sum(a * log_prob + b * entropy)`` w.r.t. both inputs."""
    hidden = hidden.clone().requires_grad_()
    weight = weight.clone().requires_grad_()
    log_probs, entropy = scores_fn(hidden, weight, targets)
    objective = 0.0
    if lp_weight is not None:
        objective = objective + (log_probs * lp_weight).sum()
    if ent_weight is not None:
        objective = objective + (entropy * ent_weight).sum()
    objective.backward()
    return log_probs.detach(), entropy.detach(), hidden.grad, weight.grad


def test_hand_computed_two_token_vocabulary() -> None:
    """Logits (0, 2 ln 3) at temperature 2 are (0, ln 3): p = (1/4, 3/4)."""
    hidden = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    weight = torch.tensor([[0.0, 5.0], [2 * math.log(3), 7.0]])
    log_probs, entropy = fused_token_scores(hidden, weight, torch.tensor([1, 0]), 2.0,
                                            chunk_tokens=1)
    want_entropy = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert log_probs.tolist() == pytest.approx([math.log(0.75), math.log(0.25)], abs=1e-6)
    assert entropy.tolist() == pytest.approx([want_entropy] * 2, abs=1e-6)
    # d log p_1 / d logit = onehot - p = (-1/4, 1/4), divided by the temperature 2,
    # times the weight rows: d hidden = -1/8 * (0, 5) + 1/8 * (2 ln 3, 7)
    hidden.requires_grad_()
    lp, _ = fused_token_scores(hidden[:1], weight, torch.tensor([1]), 2.0)
    (grad,) = torch.autograd.grad(lp.sum(), hidden)
    assert grad[0].tolist() == pytest.approx([2 * math.log(3) / 8, 2 / 8], abs=1e-6)


@pytest.mark.parametrize("chunk", [1, 8, N, 1000])
@pytest.mark.parametrize("terms", ["both", "log_probs", "entropy"])
def test_fused_equals_unfused_in_float32(chunk: int, terms: str) -> None:
    hidden, weight, targets = _inputs()
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(N, generator=gen) if terms != "entropy" else None
    b = torch.randn(N, generator=gen) if terms != "log_probs" else None
    want = _values_and_grads(_unfused, hidden, weight, targets, a, b)
    got = _values_and_grads(
        lambda h, w, t: fused_token_scores(h, w, t, TEMPERATURE, chunk_tokens=chunk),
        hidden, weight, targets, a, b,
    )
    for name, g, w in zip(("log_probs", "entropy", "d_hidden", "d_weight"), got, want):
        assert g.dtype == torch.float32, name
        torch.testing.assert_close(g, w, rtol=1e-5, atol=2e-5, msg=name)
    assert float(got[2].abs().max()) > 1e-2  # the gradients are not trivially zero


def test_fused_equals_unfused_under_bf16_autocast() -> None:
    """As the local trainer runs on a GPU: float32 master weights, the LM head in bf16 under
    autocast, log-softmax and entropy in float32. Values agree to float32 rounding of the same
    bf16 logits; gradients (bf16 matmuls, the weight's summed over chunks) within bf16's."""
    hidden, weight, targets = _inputs(1)
    gen = torch.Generator().manual_seed(6)
    a, b = torch.randn(N, generator=gen), torch.randn(N, generator=gen)

    def under_autocast(fn):
        def run(h, w, t):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return fn(h, w, t)
        return run

    want = _values_and_grads(under_autocast(_unfused), hidden, weight, targets, a, b)
    got = _values_and_grads(
        under_autocast(lambda h, w, t: fused_token_scores(h, w, t, TEMPERATURE, chunk_tokens=8)),
        hidden, weight, targets, a, b,
    )
    float32_result = _values_and_grads(_unfused, hidden, weight, targets, a, b)
    assert not torch.allclose(want[0], float32_result[0], atol=1e-4)  # bf16 really was used
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5, msg="log_probs")
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5, msg="entropy")
    for name, g, w in zip(("d_hidden", "d_weight"), got[2:], want[2:]):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, w, rtol=1.6e-2, atol=1e-2 * float(w.abs().max()), msg=name)


def test_without_entropy() -> None:
    hidden, weight, targets = _inputs(2)
    log_probs, entropy = fused_token_scores(hidden, weight, targets, TEMPERATURE,
                                            with_entropy=False)
    assert entropy is None
    torch.testing.assert_close(log_probs, _unfused(hidden, weight, targets)[0])


class _LargestOutput(TorchDispatchMode):
    """Records the element count of the largest tensor any op returns."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor):
                self.largest = max(self.largest, tensor.numel())
        return out


@pytest.mark.parametrize("fused", [False, True])
def test_no_op_makes_the_full_logits(fused: bool) -> None:
    """Forward and backward of the fused scores never create a (tokens x vocabulary) tensor:
    the largest is a chunk's logits or the weight's gradient. The unfused path does (the
    check can fail)."""
    hidden, weight, targets = _inputs(3)
    hidden.requires_grad_()
    weight.requires_grad_()
    chunk = 8
    with _LargestOutput() as seen:
        if fused:
            log_probs, entropy = fused_token_scores(hidden, weight, targets, chunk_tokens=chunk)
        else:
            log_probs, entropy = _unfused(hidden, weight, targets)
        (log_probs.sum() + entropy.sum()).backward()
    if fused:
        assert seen.largest == max(chunk * V, V * H, N * H)
    else:
        assert seen.largest >= N * V


def test_bad_inputs_are_refused() -> None:
    hidden, weight, targets = _inputs()
    with pytest.raises(ValueError, match="weight"):
        fused_token_scores(hidden, weight[:, :3], targets)
    with pytest.raises(ValueError, match="targets"):
        fused_token_scores(hidden, weight, targets[:3])
    with pytest.raises(ValueError, match="temperature"):
        fused_token_scores(hidden, weight, targets, 0.0)
    with pytest.raises(ValueError, match="chunk_tokens"):
        fused_token_scores(hidden, weight, targets, chunk_tokens=0)


def test_verl_fused_function_agrees() -> None:
    """verl's torch backend of ``use_fused_kernels`` (``FusedLinearForPPO``) computes the same
    log-probs, entropies and gradients: the verl backend's switch changes memory, not the loss."""
    from verl.utils.experimental.torch_functional import FusedLinearForPPO

    hidden, weight, targets = _inputs(4)
    gen = torch.Generator().manual_seed(7)
    a, b = torch.randn(N, generator=gen), torch.randn(N, generator=gen)
    verl = FusedLinearForPPO(chunk_size=8)
    want = _values_and_grads(
        lambda h, w, t: fused_token_scores(h, w, t, TEMPERATURE), hidden, weight, targets, a, b
    )
    got = _values_and_grads(
        lambda h, w, t: verl(h, w, t, temperature=TEMPERATURE), hidden, weight, targets, a, b
    )
    for name, g, w in zip(("log_probs", "entropy", "d_hidden", "d_weight"), got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=2e-5, msg=name)
