"""Scoring on the tiny model: one request at a time vs batched vs batched with prefix reuse.

One ~600-token chat context and 50 candidate-action targets (the decomposer's scoring pattern).
Prints the wall time of each way, the speed-up ratios, and the largest score difference.
Usage: python benchmarks/score_prefix_reuse.py [--device cpu] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from prour.demo.tiny import build_tiny_model
from prour.llm import ScoreRequest
from prour.llm.hf import HFLLM

TOOLS = (
    "get_order_details",
    "cancel_pending_order",
    "return_delivered_order_items",
    "exchange_delivered_order_items",
    "find_user_id_by_email",
    "respond",
)


def make_context(llm: HFLLM, target_tokens: int = 600) -> list[dict[str, str]]:
    """A retail dialogue grown until its rendered prompt has ~``target_tokens`` tokens."""
    messages = [
        {"role": "system", "content": "You are a retail customer-service agent. Follow the policy."}
    ]
    turn = 0
    while len(llm.encode(llm.render_chat(messages, None, False))) < target_tokens:
        order = f"#W{1000000 + 7919 * turn}"
        messages.append(
            {"role": "user", "content": f"My order {order} arrived damaged; can I return the lamp?"}
        )
        messages.append(
            {
                "role": "assistant",
                "content": f"Let me check {order}. It shows delivered, total $1{turn}9.50.",
            }
        )
        turn += 1
    return messages


def make_targets(count: int = 50) -> list[str]:
    """Distinct canonical candidate actions of varying length."""
    targets = []
    for i in range(count):
        args = (
            {}
            if TOOLS[i % len(TOOLS)] == "respond"
            else {
                "order_id": f"#W{2000000 + 31 * i}",
                "item_ids": [str(10**9 + i * j) for j in range(1 + i % 3)],
            }
        )
        targets.append(
            json.dumps({"arguments": args, "tool": TOOLS[i % len(TOOLS)]}, separators=(",", ":"))
        )
    return targets


def timed(fn, repeats: int) -> tuple[float, list]:
    """Best wall time over ``repeats`` runs, and the last result."""
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU)")
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    model_dir = build_tiny_model(Path(tempfile.gettempdir()) / "prour-bench-tiny", seed=0)
    llm = HFLLM(str(model_dir), device=args.device, dtype="float32", max_batch_size=64)
    context = make_context(llm)
    requests = [ScoreRequest(context, t) for t in make_targets()]
    n_ctx = len(llm.encode(llm.render_chat(context, None, False)))
    llm.score(requests[:2])  # warm-up

    naive_s, naive = timed(lambda: [llm.score([r])[0] for r in requests], args.repeats)
    llm.prefix_reuse = False
    batched_s, batched = timed(lambda: llm.score(requests), args.repeats)
    llm.prefix_reuse = True
    reuse_s, reuse = timed(lambda: llm.score(requests), args.repeats)

    diff = max(
        abs(a - b)
        for other in (batched, reuse)
        for x, y in zip(naive, other)
        for a, b in zip(x.token_logprobs, y.token_logprobs)
    )
    print(
        f"context {n_ctx} tokens, {len(requests)} targets of "
        f"{min(r.n_tokens for r in reuse)}-{max(r.n_tokens for r in reuse)} tokens, "
        f"device {args.device}"
    )
    print(f"one at a time        {naive_s * 1000:9.1f} ms")
    print(
        f"batched              {batched_s * 1000:9.1f} ms   "
        f"{naive_s / batched_s:6.1f}x vs one at a time"
    )
    print(
        f"batched + prefix     {reuse_s * 1000:9.1f} ms   "
        f"{naive_s / reuse_s:6.1f}x vs one at a time, "
        f"{batched_s / reuse_s:5.1f}x vs batched"
    )
    print(f"max |score difference| across the three: {diff:.2e}")
    if diff > 1e-4:
        raise SystemExit(f"scores disagree by {diff:.2e}")


if __name__ == "__main__":
    main()
