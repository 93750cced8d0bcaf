"""The paper's per-step GPU work at Qwen3-1.7B shape on one GPU: DAPO update and hf generation.

Two parts, each on a random-init model of Qwen3-1.7B's shape (nothing is downloaded):

``update``: DAPO update steps as the local trainer runs them on a GPU: fp32 master weights,
forward/backward under bf16 autocast, one state's 6 kept samples of 1,400 prompt + 1,760 response
tokens (``--mixed``: responses of mixed lengths), token-mean clipped surrogate with the entropy
bonus, grad-norm clip 1.0 and an AdamW step. Each of ``VARIANTS`` is timed on the same model and
batch: ``baseline`` is today's layout (gradient checkpointing, micro-batch 1, for-loop AdamW);
``no_checkpointing``, ``fused_adamw`` and ``packed`` (``train.update.packing`` with a
``micro_batch_tokens`` budget of ``--micro-tokens``, default three full samples) change one lever
each; ``all`` combines them. Then the memory levers: ``fused_logprob`` (``train.update.log_probs:
fused``, chunks of 512 tokens: no sample's 1,760 x 151,936 logits), ``packed_exact`` (packed with
``packing_mask: documents``, the block-diagonal mask passed explicitly; dense under sdpa, as
``packed``), ``fused_packed_exact`` (both) and ``packed_exact_flex`` (the same on FlexAttention,
whose BlockMask skips the cross-sample blocks; CUDA only: FlexAttention has no backward on CPU).
The forwards and the fused scores are prour's own (``prour.train.layout``,
``prour.core.fused_logprob``). Prints step time, tokens/s, achieved TFLOP/s, MFU and peak memory
per variant; a variant that fails (out of memory, a kernel missing) is recorded and the rest run.

``generate``: the hf backend (``prour.llm.hf.HFLLM``) writing 8 samples of 1,760 tokens for one
~1,400-token prompt (temperature 0.8, as in training) and scoring 8 posterior contexts, the work of
one state's rollout and reward. Prints tokens/s and peak memory.

The loss is prour's (``prour.core.policy_gradient.policy_loss``: pure torch, its settings the
recipe's ``train.ppo``, a pydantic model). Where prour's config cannot be imported (a lent GPU
machine may lack pydantic) the script uses ``torch_policy_loss`` below, the same objective with the
paper's settings written in; ``--check-loss`` (run in the project venv) shows both agree to 1e-6
before a GPU run is trusted. The loss is a negligible part of the step's time either way.

Model FLOPs count 6 x parameters per token (forward + backward) plus causal attention; MFU
divides achieved model FLOP/s by the GPU's dense bf16 peak (H100/H200 SXM: 989 TFLOP/s).

What a lent GPU machine needs (it has torch with CUDA and Triton, and transformers; no verl,
vLLM or Ray): nothing beyond the checkout. Every variant imports only torch, transformers and
prour's torch-only modules (``prour.train.layout``, ``prour.core.fused_logprob``, and
``prour.core.policy_gradient`` when pydantic is there), so no wheel has to be carried;
FlexAttention's kernels come with torch and compile through its Triton. Liger Kernel is not used
(prour's chunked scores are pure torch), so its wheel is not needed either.

Usage: python benchmarks/gpu_step.py [--part all|update|generate] [--json results.json]
       python benchmarks/gpu_step.py --part update --variants baseline,packed --mixed
       python benchmarks/gpu_step.py --shape tiny --device cpu --repeats 1   (checks the script)
       python benchmarks/gpu_step.py --check-loss                   (in the project venv)
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, no install

PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}
SHAPES = {
    "qwen3-1.7b": {
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "tie_word_embeddings": True,
    },
    "tiny": {
        "vocab_size": 3072,
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "tie_word_embeddings": True,
    },
}
LossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]


# ---- the objective ---------------------------------------------------------------------------


def torch_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    entropy: torch.Tensor,
    batch_num_tokens: int,
    clip_low: float = 0.2,
    clip_high: float = 0.3,
    clip_ratio_c: float = 3.0,
    entropy_coeff: float = 0.01,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Dual-clip PPO surrogate minus the entropy bonus, token sums over the mini-batch's tokens.

    The objective of ``prour.core.policy_gradient.policy_loss`` at the paper's ``train.ppo``, for
    machines where prour's config does not import; all tensors (bs, T).
    """
    mask = response_mask.float()
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, -20.0, 20.0))
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    loss = torch.where(advantages < 0, torch.minimum(loss, -advantages * clip_ratio_c), loss)
    pg = (loss * mask).sum() / batch_num_tokens
    ent = (entropy * mask).sum() / batch_num_tokens
    return pg - entropy_coeff * ent, {"pg_loss": float(pg.detach()), "entropy": float(ent.detach())}


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of each categorical in ``logits`` (..., V) -> (...)."""
    return torch.logsumexp(logits, -1) - (torch.softmax(logits, -1) * logits).sum(-1)


def prour_policy_loss() -> LossFn | None:
    """prour's loss as a ``torch_policy_loss``-shaped call; None where prour's config (pydantic)
    does not import."""
    try:
        from prour.config.train import PPOSettings
    except ImportError:
        return None
    from prour.core.policy_gradient import policy_loss

    def call(old, new, adv, mask, entropy, batch_num_tokens):
        return policy_loss(
            old, new, adv, mask, PPOSettings(), entropy=entropy, batch_num_tokens=batch_num_tokens
        )

    return call


def check_loss() -> None:
    """``torch_policy_loss`` equals prour's loss on random batches (value and grad)."""
    reference = prour_policy_loss()
    if reference is None:
        sys.exit("--check-loss needs prour's config (run it in the project venv)")
    for seed in range(5):
        gen = torch.Generator().manual_seed(seed)
        old = -torch.rand(4, 9, generator=gen) * 3
        new = (old + torch.randn(4, 9, generator=gen) * 0.6).requires_grad_()
        adv = torch.randn(4, 1, generator=gen).expand(-1, 9) * 2
        mask = (torch.rand(4, 9, generator=gen) > 0.2).float()
        entropy = torch.rand(4, 9, generator=gen) * 4
        n = int(mask.sum())
        ours, _ = torch_policy_loss(old, new, adv, mask, entropy, n)
        (g_ours,) = torch.autograd.grad(ours, new)
        theirs, _ = reference(old, new, adv, mask, entropy, n)
        (g_theirs,) = torch.autograd.grad(theirs, new)
        diff = max(abs(float(ours - theirs)), float((g_ours - g_theirs).abs().max()))
        print(f"seed {seed}: loss {float(ours):+.6f} vs {float(theirs):+.6f}, max diff {diff:.1e}")
        if diff > 1e-6:
            sys.exit("torch_policy_loss differs from prour's policy_loss")
    print("torch_policy_loss == prour.core.policy_gradient.policy_loss (5 random batches)")


# ---- update ----------------------------------------------------------------------------------


# The update's layout options (``train.update`` and ``train.gradient_checkpointing``), each timed
# on the same batch: today's layout, then one lever at a time, then all of them together.
VARIANTS: dict[str, dict[str, Any]] = {
    "baseline": {},
    "no_checkpointing": {"checkpointing": False},
    "fused_adamw": {"fused": True},
    "packed": {"packing": True, "budget": True},
    "all": {"checkpointing": False, "fused": True, "packing": True, "budget": True},
    "fused_logprob": {"fused_logprob": True},
    "packed_exact": {"packing": True, "exact": True, "budget": True},
    "fused_packed_exact": {"fused_logprob": True, "packing": True, "exact": True, "budget": True},
    "packed_exact_flex": {"fused_logprob": True, "packing": True, "exact": True, "budget": True,
                          "attention": "flex_attention"},
}
CUDA_ONLY = {"packed_exact_flex": "FlexAttention has no backward on CPU"}
LOGPROB_CHUNK = 512  # train.update.log_prob_chunk_tokens' default


def build_model(shape: str, device: torch.device, max_len: int, train: bool) -> Any:
    """Random-init Qwen3 of ``shape``, fp32 weights, created on ``device``."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        **SHAPES[shape], max_position_embeddings=max_len, attn_implementation="sdpa"
    )
    torch.manual_seed(0)
    with device:
        model = Qwen3ForCausalLM(config).float()
    if train:
        model.config.use_cache = False
        return model.train()
    return model.eval()


def set_checkpointing(model: Any, on: bool) -> None:
    if on:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_disable()


def model_flops(model: Any, lengths: list[tuple[int, int]]) -> float:
    """Forward+backward model FLOPs of the update over (prompt, response) samples (no
    recomputation or padding counted)."""
    c = model.config
    params = sum(p.numel() for p in model.parameters())
    total = 0.0
    for prompt, response in lengths:
        seq = prompt + response
        attention = 3 * 2 * 2 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * seq**2 / 2
        total += 6.0 * params * seq + attention
    return total


def dapo_update(
    model: Any, optimizer: Any, batch: SimpleNamespace, loss_fn: LossFn, packing: bool,
    budget: int | None, *, exact: bool = False, fused_logprob: bool = False,
) -> float:
    """One mini-batch as the local trainer runs it: micro-batches (one sample each, or
    ``token_micro_batches`` under ``budget``), padded, packed or packed-exact forwards
    (``prour.train.layout``), log-probs and entropies from full logits or chunked
    (``fused_logprob``), token-mean over the mini-batch, clip, AdamW step."""
    from prour.core.fused_logprob import fused_token_scores
    from prour.train.layout import LAYOUTS, lm_head_weight, response_logits, token_micro_batches

    optimizer.zero_grad(set_to_none=True)
    n_tokens = sum(len(t) for t in batch.targets)
    lengths = [len(seq) for seq in batch.seqs]
    groups = (token_micro_batches(lengths, budget, packing) if budget
              else [[i] for i in range(len(lengths))])
    forward = LAYOUTS["packed_exact" if exact else "packed" if packing else "padded"]
    device = batch.targets[0].device
    for group in groups:
        scores = []
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16,
                            enabled=device.type == "cuda"):
            rows = forward(model, [batch.seqs[i] for i in group],
                           [batch.prompts[i] for i in group], 0, device)
            if fused_logprob:  # inside autocast: the chunks' matmuls in bf16, as the LM head's
                weight = lm_head_weight(model)
                scores = [fused_token_scores(h, weight, batch.targets[i], 0.8,
                                             chunk_tokens=LOGPROB_CHUNK)
                          for h, i in zip(rows, group)]
            else:
                rows = response_logits(model, rows)
        if not fused_logprob:
            for logits, i in zip(rows, group):
                step_logits = logits.float() / 0.8
                targets = batch.targets[i]
                log_prob = torch.log_softmax(step_logits, -1).gather(
                    -1, targets[..., None]).squeeze(-1)
                scores.append((log_prob, token_entropy(step_logits)))
        loss = 0.0
        for (log_prob, entropy), i in zip(scores, group):
            sample_loss, _ = loss_fn(batch.old[i][None], log_prob[None], batch.adv[i][None],
                                     torch.ones_like(log_prob[None]), entropy[None], n_tokens)
            loss = loss + sample_loss
        loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return float(grad_norm)


def sample_lengths(args: argparse.Namespace) -> list[tuple[int, int]]:
    """(prompt, response) per kept sample: all full length, or with ``--mixed`` responses spread
    evenly from a quarter of ``--response`` to all of it (as sampled groups are)."""
    if not args.mixed or args.samples == 1:
        return [(args.prompt, args.response)] * args.samples
    low = args.response // 4
    step = (args.response - low) / (args.samples - 1)
    return [(args.prompt, round(low + i * step)) for i in range(args.samples)]


def make_batch(vocab: int, args: argparse.Namespace, device: torch.device) -> SimpleNamespace:
    gen = torch.Generator(device="cpu").manual_seed(1)
    lengths = sample_lengths(args)
    seqs = [torch.randint(0, vocab, (p + r,), generator=gen).tolist() for p, r in lengths]
    return SimpleNamespace(
        lengths=lengths,
        seqs=seqs,
        prompts=[p for p, _ in lengths],
        targets=[torch.tensor(s[p:], device=device) for s, (p, _) in zip(seqs, lengths)],
        adv=[torch.full((r,), float(torch.randn(1, generator=gen)), device=device)
             for _, r in lengths],
        old=[(-torch.rand(r, generator=gen) * 12).to(device) for _, r in lengths],
    )


def run_update(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Every variant in ``--variants`` on one model and batch; an out-of-memory is recorded."""
    loss_fn = prour_policy_loss() or torch_policy_loss
    longest = args.prompt + args.response
    model = build_model(args.shape, device, longest, train=True)
    batch = make_batch(model.config.vocab_size, args, device)
    budget = args.micro_tokens or 3 * longest
    out = {}
    for name in args.variants:
        options = VARIANTS[name]
        if name in CUDA_ONLY and device.type != "cuda":
            out[name] = {"error": f"not run on {device.type}: {CUDA_ONLY[name]}"}
        else:
            try:
                out[name] = time_variant(model, batch, loss_fn, options, budget, args, device)
            except torch.OutOfMemoryError as error:
                out[name] = {"error": f"out of memory: {str(error).splitlines()[0]}"}
            except Exception as error:  # noqa: BLE001 - a lent GPU's minutes: record, go on
                first = (str(error).splitlines() or [""])[0]
                out[name] = {"error": f"{type(error).__name__}: {first}"}
        if device.type == "cuda":
            torch.cuda.empty_cache()
        out[name]["options"] = {**options, "budget": budget if options.get("budget") else None}
    del model, batch
    return out


def time_variant(
    model: Any, batch: SimpleNamespace, loss_fn: LossFn, options: dict[str, Any], budget: int,
    args: argparse.Namespace, device: torch.device,
) -> dict[str, Any]:
    set_checkpointing(model, options.get("checkpointing", True))
    fused = {"fused": True} if options.get("fused") else {}
    optimizer = torch.optim.AdamW(model.parameters(), lr=7e-7, weight_decay=0.01, **fused)
    packing, micro = options.get("packing", False), budget if options.get("budget") else None
    levers = {"exact": options.get("exact", False),
              "fused_logprob": options.get("fused_logprob", False)}
    attention = model.config._attn_implementation
    if options.get("attention"):
        model.set_attn_implementation(options["attention"])
    reset_peak(device)
    try:
        # warm-up (allocator, kernels; FlexAttention compiles here)
        dapo_update(model, optimizer, batch, loss_fn, packing, micro, **levers)
        times = []
        for _ in range(args.repeats):
            sync(device)
            start = time.perf_counter()
            dapo_update(model, optimizer, batch, loss_fn, packing, micro, **levers)
            sync(device)
            times.append(time.perf_counter() - start)
    finally:
        del optimizer
        model.zero_grad(set_to_none=True)
        model.set_attn_implementation(attention)
    seconds = sorted(times)[len(times) // 2]
    flops = model_flops(model, batch.lengths)
    _name, peak = peak_tflops(device)
    return {
        "params_b": sum(p.numel() for p in model.parameters()) / 1e9,
        "loss": "prour.core.policy_gradient" if loss_fn is not torch_policy_loss else "torch twin",
        "samples": len(batch.lengths),
        "prompt_tokens": args.prompt,
        "response_tokens": [r for _, r in batch.lengths],
        "step_s_median": seconds,
        "step_s_all": times,
        "tokens_per_s": sum(p + r for p, r in batch.lengths) / seconds,
        "achieved_tflops": flops / seconds / 1e12,
        "mfu": flops / seconds / 1e12 / peak if peak else None,
        "peak_mem_gib": peak_memory(device),
    }


# ---- generation ------------------------------------------------------------------------------


def tiny_tokenizer() -> Any:
    """The project's tiny BPE tokenizer (Qwen-style chat template), built locally in seconds."""
    import tempfile

    from transformers import AutoTokenizer

    try:
        from prour.demo.tiny import build_tiny_model
    except ImportError:
        from prour.demo.tiny import build_tiny_model
    folder = build_tiny_model(Path(tempfile.mkdtemp()) / "tiny", seed=0)
    return AutoTokenizer.from_pretrained(folder)


def prompt_of(tokenizer: Any, n_tokens: int) -> list[dict[str, str]]:
    """A one-message chat whose rendered prompt is about ``n_tokens`` long."""
    words = ("order", "item", "return", "address", "exchange", "payment", "refund", "size")
    text = " ".join(words[i % len(words)] + str(i % 97) for i in range(n_tokens))
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][: n_tokens - 20]
    return [{"role": "user", "content": tokenizer.decode(ids)}]


def run_generate(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    from prour.llm.base import ChatRequest, SamplingParams, ScoreRequest
    from prour.llm.hf import HFLLM

    tokenizer = tiny_tokenizer()
    model = build_model(args.shape, device, args.prompt + args.response + 64, train=False)
    if device.type == "cuda":
        model = model.to(torch.bfloat16)  # the backend serves frozen weights in the recipe's dtype
    llm = HFLLM.from_model(model, tokenizer, seed=0, max_model_len=args.prompt + args.response + 64)
    messages = prompt_of(tokenizer, args.prompt)
    request = ChatRequest(
        messages=messages,
        sampling=SamplingParams(n=args.gen_samples, temperature=0.8, max_tokens=args.response, seed=7),
        enable_thinking=True,
    )
    llm.chat([ChatRequest(messages=messages, sampling=SamplingParams(max_tokens=8))])  # warm-up
    reset_peak(device)
    sync(device)
    start = time.perf_counter()
    completions = llm.chat([request])[0]
    sync(device)
    gen_s = time.perf_counter() - start
    generated = sum(c.completion_tokens for c in completions)
    target = " ".join(["the user wants to return the black backpack"] * 4)
    scores = [
        ScoreRequest(context=messages + [{"role": "assistant", "content": c.text[:2000]}], target=target)
        for c in completions
    ]
    sync(device)
    start = time.perf_counter()
    llm.score(scores)
    sync(device)
    score_s = time.perf_counter() - start
    baseline = hf_generate_baseline(model, tokenizer, messages, args, device)
    return {
        "baseline": baseline,
        "prompt_tokens": completions[0].prompt_tokens,
        "samples": len(completions),
        "generated_tokens": generated,
        "finish_reasons": sorted({c.finish_reason for c in completions}),
        "generate_s": gen_s,
        "generated_tokens_per_s": generated / gen_s,
        "score_requests": len(scores),
        "score_s": score_s,
        "peak_mem_gib": peak_memory(device),
    }


def hf_generate_baseline(
    model: Any, tokenizer: Any, messages: list[dict[str, str]], args: argparse.Namespace,
    device: torch.device,
) -> dict[str, float]:
    """transformers' own ``generate`` on the same prompt and sample count: the reference rate."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]], device=device)
    kwargs = {
        "do_sample": True, "temperature": 0.8, "top_p": 1.0, "top_k": 0,
        "max_new_tokens": args.response, "min_new_tokens": args.response,
        "num_return_sequences": args.gen_samples, "pad_token_id": 0,
    }
    with torch.inference_mode():
        model.generate(ids, **{**kwargs, "max_new_tokens": 8, "min_new_tokens": 8})
        sync(device)
        start = time.perf_counter()
        out = model.generate(ids, **kwargs)
        sync(device)
    seconds = time.perf_counter() - start
    tokens = (out.shape[1] - ids.shape[1]) * out.shape[0]
    return {"generated_tokens": tokens, "generate_s": seconds, "tokens_per_s": tokens / seconds}


# ---- device helpers --------------------------------------------------------------------------


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def peak_tflops(device: torch.device) -> tuple[str, float | None]:
    if device.type != "cuda":
        return platform.processor() or "cpu", None
    name = torch.cuda.get_device_name(device)
    return name, next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def report(result: dict[str, Any]) -> None:
    print(f"\n{result['shape']} on {result['device']} — torch {result['torch']}, "
          f"transformers {result['transformers']}, {result['date']}")
    for name, u in result.get("update_variants", {}).items():
        if "error" in u:
            print(f"update   {name:<17} {u['error']}")
            continue
        mfu = f"{u['mfu']:.1%}" if u["mfu"] is not None else "n/a"
        mem = f"{u['peak_mem_gib']:.1f} GiB" if u["peak_mem_gib"] is not None else "n/a"
        print(f"update   {name:<17} {u['samples']} x ({u['prompt_tokens']} + "
              f"{'/'.join(map(str, sorted(set(u['response_tokens']))))}) tokens, "
              f"{u['params_b']:.2f}B params, loss: {u['loss']}")
        print(f"         step {u['step_s_median']:.3f} s (median of "
              f"{', '.join(f'{t:.3f}' for t in u['step_s_all'])}), {u['tokens_per_s']:.0f} tok/s, "
              f"{u['achieved_tflops']:.1f} TFLOP/s, MFU {mfu}, peak {mem}")
    if "generate" in result:
        g = result["generate"]
        mem = f"{g['peak_mem_gib']:.1f} GiB" if g["peak_mem_gib"] is not None else "n/a"
        print(f"generate {g['samples']} x up to {result['args']['response']} tokens after a "
              f"{g['prompt_tokens']}-token prompt: {g['generated_tokens']} tokens in "
              f"{g['generate_s']:.1f} s = {g['generated_tokens_per_s']:.0f} tok/s "
              f"({'/'.join(g['finish_reasons'])}); score {g['score_requests']} contexts "
              f"{g['score_s']:.2f} s; peak {mem}")
        b = g["baseline"]
        print(f"         transformers generate() on the same prompt: {b['generated_tokens']} tokens in "
              f"{b['generate_s']:.1f} s = {b['tokens_per_s']:.0f} tok/s "
              f"(hf backend / generate(): {g['generated_tokens_per_s'] / b['tokens_per_s']:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("all", "update", "generate"), default="all")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-1.7b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--samples", type=int, default=6, help="kept samples per update")
    parser.add_argument("--gen-samples", type=int, default=8, help="sampled queries per state")
    parser.add_argument("--prompt", type=int, default=1400)
    parser.add_argument("--response", type=int, default=1760)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", type=lambda v: v.split(","), default=list(VARIANTS),
                        help=f"comma-separated update layouts of {', '.join(VARIANTS)}")
    parser.add_argument("--micro-tokens", type=int, default=None,
                        help="token budget of a packed micro-batch (default 3 full samples)")
    parser.add_argument("--mixed", action="store_true",
                        help="responses of mixed lengths (a quarter of --response up to all of it)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--check-loss", action="store_true", help="compare the two losses; exit")
    args = parser.parse_args()
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    if args.check_loss:
        return check_loss()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit(
            "gpu_step.py needs a CUDA GPU (none is visible here); run it on a GPU node, "
            "or pass --shape tiny --device cpu to check the script itself"
        )
    import transformers

    device = torch.device(args.device)
    result: dict[str, Any] = {
        "shape": args.shape,
        "device": peak_tflops(device)[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }
    if args.part in ("all", "update"):
        result["update_variants"] = run_update(args, device)
        if "baseline" in result["update_variants"]:  # the key earlier results and rates.json read
            result["update"] = result["update_variants"]["baseline"]
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.part in ("all", "generate"):
        result["generate"] = run_generate(args, device)
    report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
