"""One DAPO update of a Qwen3-1.7B-shaped policy on one GPU: time, achieved TFLOP/s and MFU.

The model is random-init (nothing is downloaded) with Qwen3-1.7B's shape; weights are fp32 master
copies and the forward/backward runs under bf16 autocast, as the local trainer does on a GPU.
"One update" is one mini-batch of the paper's recipe: one state's 6 kept samples, each a
1,400-token prompt plus a 1,760-token response, micro-batch 1, gradient checkpointing, the
clipped surrogate with entropy bonus from ``prour.train.algorithm``, grad clip and an AdamW step.

Model FLOPs count 6 x parameters per token (forward + backward) plus causal attention; MFU
divides achieved model FLOP/s by the GPU's dense bf16 peak (H100/H200 SXM: 989 TFLOP/s).

Usage: python benchmarks/gpu_step.py [--samples 6] [--prompt 1400] [--response 1760] [--repeats 3]
       python benchmarks/gpu_step.py --shape tiny --device cpu   (checks the script on CPU only)
"""

from __future__ import annotations

import argparse
import sys
import time
from types import SimpleNamespace

import torch

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
        "vocab_size": 3000,
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "tie_word_embeddings": True,
    },
}


def build_model(shape: str, device: torch.device, max_len: int) -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        **SHAPES[shape],
        max_position_embeddings=max_len,
        dtype="float32",
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(device)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    return model.train()


def model_flops(model: torch.nn.Module, prompt: int, response: int, samples: int) -> float:
    """Forward+backward model FLOPs of the update (no recomputation counted)."""
    c = model.config
    params = sum(p.numel() for p in model.parameters())
    seq = prompt + response
    dense = 6.0 * params * seq
    attention = 3 * 2 * 2 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * seq * seq / 2
    return samples * (dense + attention)


def dapo_update(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: SimpleNamespace, autocast: bool
) -> float:
    """One mini-batch: micro-batches of one sample, token-mean over the mini-batch, clip, step."""
    from prour.train.algorithm import LossSettings, policy_loss, token_entropy

    optimizer.zero_grad(set_to_none=True)
    n_tokens = int(batch.mask.sum())
    start = batch.ids.shape[1] - batch.mask.shape[1]
    for i in range(batch.ids.shape[0]):
        with torch.autocast(
            device_type=batch.ids.device.type, dtype=torch.bfloat16, enabled=autocast
        ):
            logits = model(
                input_ids=batch.ids[i : i + 1], logits_to_keep=batch.mask.shape[1] + 1
            ).logits
        step_logits = logits[:, :-1].float() / 0.8
        targets = batch.ids[i : i + 1, start:]
        log_prob = torch.log_softmax(step_logits, -1).gather(-1, targets[..., None]).squeeze(-1)
        loss, _ = policy_loss(
            batch.old[i : i + 1],
            log_prob,
            batch.adv[i : i + 1],
            batch.mask[i : i + 1],
            LossSettings(),
            entropy=token_entropy(step_logits),
            batch_num_tokens=n_tokens,
        )
        loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return float(grad_norm)


def make_batch(
    model: torch.nn.Module, args: argparse.Namespace, device: torch.device
) -> SimpleNamespace:
    gen = torch.Generator(device="cpu").manual_seed(1)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (args.samples, args.prompt + args.response), generator=gen).to(
        device
    )
    mask = torch.ones(args.samples, args.response, device=device)
    adv = torch.randn(args.samples, 1, generator=gen).to(device).expand(-1, args.response)
    old = (-torch.rand(args.samples, args.response, generator=gen) * 12).to(
        device
    )  # fixed "old" log-probs
    return SimpleNamespace(ids=ids, mask=mask, adv=adv, old=old)


def peak_tflops(device: torch.device) -> tuple[str, float | None]:
    if device.type != "cuda":
        return "cpu", None
    name = torch.cuda.get_device_name(device)
    return name, next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-1.7b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--samples", type=int, default=6)
    parser.add_argument("--prompt", type=int, default=1400)
    parser.add_argument("--response", type=int, default=1760)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit(
            "gpu_step.py needs a CUDA GPU (none is visible here); run it on a lent GPU node, "
            "or pass --shape tiny --device cpu to check the script itself"
        )
    device = torch.device(args.device)
    model = build_model(args.shape, device, args.prompt + args.response)
    optimizer = torch.optim.AdamW(model.parameters(), lr=7e-7, weight_decay=0.01)
    batch = make_batch(model, args, device)
    autocast = device.type == "cuda"
    dapo_update(model, optimizer, batch, autocast)  # warm-up (allocator, kernels, optimizer state)
    times = []
    for _ in range(args.repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        dapo_update(model, optimizer, batch, autocast)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    seconds = min(times)
    flops = model_flops(model, args.prompt, args.response, args.samples)
    name, peak = peak_tflops(device)
    params = sum(p.numel() for p in model.parameters()) / 1e9
    print(
        f"{args.shape} ({params:.2f}B params) on {name}: {args.samples} samples x "
        f"({args.prompt} + {args.response}) tokens, micro-batch 1, gradient checkpointing"
    )
    print(
        f"update time        {seconds:8.3f} s (best of {args.repeats}: "
        f"{', '.join(f'{t:.3f}' for t in times)})"
    )
    print(f"tokens/s           {args.samples * (args.prompt + args.response) / seconds:8.0f}")
    print(
        f"achieved TFLOP/s   {flops / seconds / 1e12:8.1f} (model FLOPs, recomputation not counted)"
    )
    if peak:
        print(
            f"MFU                {flops / seconds / 1e12 / peak:8.1%} "
            f"of {peak:.0f} TFLOP/s dense bf16 peak"
        )
    if device.type == "cuda":
        print(f"peak memory        {torch.cuda.max_memory_allocated(device) / 2**30:8.1f} GiB")


if __name__ == "__main__":
    main()
