"""Evaluation through one queue against one method after another, on the real vLLM CPU server.

A vLLM CPU server is started here on the tiny random Qwen3 with ``--max-num-seqs LIMIT``; every
model role of a recipe points at it. The same episodes (``--methods`` x the first ``--tasks``
retail test tasks x ``--seeds``) run twice through ``prour.eval.harness``, each into a fresh run
folder:

- one method after another: one :class:`~prour.eval.harness.Evaluation` per method, in turn (as
  running ``prour eval --method M`` for each method);
- one queue: one Evaluation of every method, whose episodes interleave in one scheduler.

Both hold the server at LIMIT episodes (``eval.concurrency``, the client's ``max_concurrency``
and the server's ``max_num_seqs`` all equal LIMIT). A sampler reads the server's
``vllm:num_requests_running`` from ``/metrics`` every ``--sample-s`` seconds during each run.
Printed: the wall time of each, their ratio, the in-flight samples (mean, share at the limit, a
histogram) and the achieved concurrency the queue recorded (``queue.jsonl``).

Usage:
  python benchmarks/eval_queue.py [--limit 4] [--tasks 8] [--seeds 0,1] [--max-steps 6]
(needs the vLLM venv: ``make vllm-env`` or PROUR_VLLM_PYTHON)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any, Self

ROOT = Path(__file__).resolve().parents[1]
SERVED_NAME = "tiny"
TINY_CONTEXT = 16384
METHODS = "base,ask-before-plan,saber,verifiagent"
ROLES = ("agent", "user", "verifier", "router", "generator", "decomposer", "judge")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=4, help="episodes in flight (max_num_seqs)")
    parser.add_argument("--methods", default=METHODS, help="comma list of eval methods")
    parser.add_argument("--tasks", type=int, default=8, help="first N retail test tasks")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--max-steps", type=int, default=6, help="env.max_steps")
    parser.add_argument("--max-tokens", type=int, default=24, help="per generated message")
    parser.add_argument("--sample-s", type=float, default=0.25, help="metrics sampling period")
    parser.add_argument("--start-timeout", type=float, default=600.0, help="vLLM start-up, s")
    return parser.parse_args()


def running_requests(base_url: str) -> float | None:
    """``vllm:num_requests_running`` summed over the server's metric lines (None: unreadable)."""
    root = base_url.rsplit("/v1", 1)[0]
    try:
        with urllib.request.urlopen(f"{root}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    values = [float(m.group(1)) for m in
              re.finditer(r"^vllm:num_requests_running(?:\{[^}]*\})? ([0-9.eE+-]+)$", text, re.MULTILINE)]
    return sum(values) if values else None


class Sampler:
    """Reads the server's running requests every ``period`` seconds in a thread."""

    def __init__(self, base_url: str, period: float):
        self.base_url, self.period = base_url, period
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            value = running_requests(self.base_url)
            if value is not None:
                self.samples.append(value)
            self._stop.wait(self.period)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def recipe(run_dir: Path, base_url: str, methods: list[str], args: argparse.Namespace) -> Any:
    from prour.recipes import load_recipe

    model = {"backend": "openai", "base_url": base_url, "model": SERVED_NAME,
             "max_concurrency": args.limit, "max_model_len": TINY_CONTEXT, "timeout_s": 600}
    data = {
        "name": "eval-queue-bench", "run_dir": str(run_dir),
        "models": {role: model for role in ROLES},
        "env": {"max_steps": args.max_steps, "agent_max_tokens": args.max_tokens,
                "user_max_tokens": args.max_tokens},
        "router": {"llm_router_max_tokens": args.max_tokens},
        "serve": {"models": {SERVED_NAME: {"max_num_seqs": args.limit}}},
        "eval": {"methods": methods, "domains": ["retail"], "split": "test",
                 "max_tasks": args.tasks, "seeds": [int(s) for s in args.seeds.split(",")],
                 "concurrency": args.limit, "judge": False, "max_error_fraction": 1.0},
    }
    path = run_dir.parent / f"{run_dir.name}.yaml"
    import yaml

    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_recipe(path)


def timed(name: str, base_url: str, args: argparse.Namespace, runs: list[list[str]],
          root: Path) -> dict[str, Any]:
    """Run each method list of ``runs`` as one Evaluation, in turn, into one folder each;
    returns wall seconds, episodes, errors, in-flight samples and the recorded queue sessions."""
    from prour.eval.harness import Evaluation
    from prour.eval.queue import read_sessions

    episodes = errors = 0
    sessions: list[dict[str, Any]] = []
    started = time.perf_counter()
    with Sampler(base_url, args.sample_s) as sampler:
        for i, methods in enumerate(runs):
            run_dir = root / f"{name}-{i}"
            evaluation = Evaluation(recipe(run_dir, base_url, methods, args), run_dir,
                                    progress=False)
            try:
                lines = evaluation.run()
            finally:
                evaluation.close()
            episodes += len(lines)
            errors += sum(line["error"] for line in lines)
            sessions += read_sessions(run_dir)
    return {"wall_s": time.perf_counter() - started, "episodes": episodes, "errors": errors,
            "samples": sampler.samples, "sessions": sessions}


def describe(name: str, result: dict[str, Any], limit: int) -> list[str]:
    samples = result["samples"]
    mean = sum(samples) / len(samples) if samples else float("nan")
    at_limit = sum(s >= limit for s in samples) / len(samples) if samples else float("nan")
    histogram = Counter(int(s) for s in samples)
    wall = sum(s["wall_s"] for s in result["sessions"])
    achieved = sum(s["mean_in_flight"] * s["wall_s"] for s in result["sessions"]) / wall
    return [
        (f"{name}: {result['wall_s']:.1f} s wall, {result['episodes']} episodes "
         f"({result['errors']} errored), {result['episodes'] / result['wall_s'] * 60:.2f} "
         "episodes/min"),
        (f"  server running requests ({len(samples)} samples): mean {mean:.2f}, at the limit "
         f"{limit} in {at_limit:.0%} of samples; histogram "
         + ", ".join(f"{k}: {histogram[k]}" for k in sorted(histogram))),
        f"  queue.jsonl: achieved concurrency (mean episodes in flight) {achieved:.2f}",
    ]


def main() -> None:
    args = parse_args()
    from prour.cluster.vllm_server import VLLMServer
    from prour.demo.tiny import build_tiny_model

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    python = os.environ.get("PROUR_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")
    with tempfile.TemporaryDirectory(prefix="prour-eval-queue-bench-") as tmp:
        root = Path(tmp)
        model_dir = build_tiny_model(root / "tiny", seed=0, max_position=TINY_CONTEXT)
        server = VLLMServer(
            model_dir, python=python, served_name=SERVED_NAME, max_model_len=TINY_CONTEXT,
            extra_args=("--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                        "--max-num-seqs", str(args.limit)))
        server.start(timeout_s=args.start_timeout)
        try:
            # warm-up: one episode, so that neither run pays the first requests' compilation
            timed("warmup", server.base_url, argparse.Namespace(
                **{**vars(args), "tasks": 1, "seeds": "0"}), [methods[:1]], root)
            after = timed("after", server.base_url, args, [[m] for m in methods], root)
            queued = timed("queue", server.base_url, args, [methods], root)
        finally:
            server.stop()
    seeds = len(args.seeds.split(","))
    print(f"{len(methods)} methods ({', '.join(methods)}) x {args.tasks} retail test tasks x "
          f"{seeds} seeds = {len(methods) * args.tasks * seeds} episodes per run; env.max_steps "
          f"{args.max_steps}, max_tokens {args.max_tokens}; vLLM CPU server, tiny Qwen3, "
          f"--max-num-seqs {args.limit}, eval.concurrency {args.limit}")
    for line in [*describe("one method after another", after, args.limit),
                 *describe("one queue", queued, args.limit)]:
        print(line)
    print(f"ratio (one after another / one queue, wall): "
          f"{after['wall_s'] / queued['wall_s']:.2f}x")
    print(json.dumps({"after_s": round(after["wall_s"], 1), "queue_s": round(queued["wall_s"], 1),
                      "limit": args.limit}))


if __name__ == "__main__":
    main()
