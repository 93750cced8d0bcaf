"""The update's log-probs and entropies on CPU, full logits against prour's chunked (fused) ones.

One sample's response at Qwen3-1.7B's head shape: N response tokens (default 1,760, the paper's
``max_response_tokens``), hidden size 2,048, vocabulary 151,936, float32 as the local trainer runs
on CPU. Each variant runs the forward and backward of ``sum(a * log_prob + b * entropy)`` (the two
terms the loss has), w.r.t. the hidden states and the LM-head weight:

- ``full``: today's path (``prour.train.policy.response_scores``): logits (N, V), log-softmax and
  ``token_entropy`` over them;
- ``fused``: ``prour.core.fused_logprob.fused_token_scores`` with chunks of ``--chunk`` tokens.

Each variant runs in its own child process, so that one's memory does not count in the other's.
Peak memory is the child's resident set: its high-water mark (VmHWM in /proc/self/status, reset
through /proc/self/clear_refs once the inputs exist) minus the resident set at that moment, so it
counts what the computation itself allocated (the weight's gradient included), not the inputs.
Time is one forward + backward (wall clock, after one small warm-up call). The parent prints both,
their ratios, and the largest differences between the two variants' values and gradients.

Usage: python benchmarks/fused_logprob.py [--tokens 1760] [--chunk 512] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, no install


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (platform.processor() is often empty)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "cpu"


def status_kib(field: str) -> int:
    """A memory field of /proc/self/status (VmRSS, VmHWM), in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def run_variant(args: argparse.Namespace) -> None:
    """Child: one variant; writes its numbers and small results to ``args.out``."""
    import torch

    from prour.core.fused_logprob import fused_token_scores
    from prour.core.policy_gradient import token_entropy

    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(args.tokens, args.hidden, generator=gen).requires_grad_()
    weight = (torch.randn(args.vocab, args.hidden, generator=gen) * 0.02).requires_grad_()
    targets = torch.randint(0, args.vocab, (args.tokens,), generator=gen)
    a = torch.randn(args.tokens, generator=gen)
    b = torch.randn(args.tokens, generator=gen)

    def scores(h, w, t):
        if args.variant == "fused":
            return fused_token_scores(h, w, t, args.temperature, chunk_tokens=args.chunk)
        logits = torch.nn.functional.linear(h, w).float() / args.temperature
        log_probs = torch.log_softmax(logits, -1).gather(-1, t[:, None]).squeeze(-1)
        return log_probs, token_entropy(logits)

    # warm-up on 8 tokens (kernel selection, thread pool); its gradients are dropped
    lp, ent = scores(hidden[:8], weight, targets[:8])
    (lp.sum() + ent.sum()).backward()
    hidden.grad = weight.grad = None

    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident set
    base = status_kib("VmRSS")
    start = time.perf_counter()
    log_probs, entropy = scores(hidden, weight, targets)
    ((log_probs * a).sum() + (entropy * b).sum()).backward()
    seconds = time.perf_counter() - start
    peak = status_kib("VmHWM") - base
    torch.save({
        "log_probs": log_probs.detach(), "entropy": entropy.detach(), "d_hidden": hidden.grad,
        "d_weight_norm": float(weight.grad.norm()), "d_weight_row0": weight.grad[0].clone(),
        "seconds": seconds, "peak_gib": peak / 2**20,
    }, args.out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1760)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--variant", choices=("full", "fused"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        return run_variant(args)

    import torch

    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for variant in ("full", "fused"):
            out = Path(folder) / f"{variant}.pt"
            command = [sys.executable, __file__, "--variant", variant, "--out", str(out)]
            for key in ("tokens", "hidden", "vocab", "chunk", "temperature", "threads"):
                command += [f"--{key}", str(getattr(args, key))]
            subprocess.run(command, check=True)
            results[variant] = torch.load(out)
    full, fused = results["full"], results["fused"]
    logits_gib = args.tokens * args.vocab * 4 / 2**30
    print(f"{args.tokens} tokens x hidden {args.hidden} x vocabulary {args.vocab}, float32, "
          f"{args.threads} torch threads, {cpu_name()}, torch "
          f"{torch.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"one float32 (tokens x vocabulary) tensor: {logits_gib:.2f} GiB; the weight's "
          f"gradient: {args.vocab * args.hidden * 4 / 2**30:.2f} GiB")
    for name, r in results.items():
        label = name if name == "full" else f"fused (chunks of {args.chunk} tokens)"
        print(f"{label:<28} forward+backward {r['seconds']:7.2f} s, peak memory above the "
              f"inputs {r['peak_gib']:6.2f} GiB (resident-set high-water mark)")
    print(f"fused / full: time {fused['seconds'] / full['seconds']:.2f}x, peak memory "
          f"{fused['peak_gib'] / full['peak_gib']:.2f}x")
    diffs = {key: float((fused[key] - full[key]).abs().max())
             for key in ("log_probs", "entropy", "d_hidden", "d_weight_row0")}
    diffs["d_weight_norm_rel"] = abs(fused["d_weight_norm"] / full["d_weight_norm"] - 1)
    print("largest differences, fused - full: "
          + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items()))
    if args.json:
        summary = {name: {"seconds": r["seconds"], "peak_gib": r["peak_gib"]}
                   for name, r in results.items()}
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)},
                                         "results": summary, "differences": diffs}, indent=2))


if __name__ == "__main__":
    main()
