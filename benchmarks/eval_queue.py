"""Evaluation through one queue against one method after another, on two real vLLM CPU servers.

The paper's layout, scaled down: the agent backbone (agent, user, verifier, LLM router) is one
vLLM CPU server with ``--max-num-seqs BACKBONE`` and prour's query generator another with
``--max-num-seqs GENERATOR`` (fewer slots), both on the tiny random Qwen3 under their own served
ids. Of the methods, only ``llm-router`` calls the generator (``router.llm_router_fallback:
clarify``: the tiny model's invalid router replies route to clarify, so every one of its agent
steps asks the generator); the baselines run on the backbone alone. Long generations
(``--max-tokens`` per agent/user/router message, ``--generator-max-tokens`` per query) make each
request cost the server real decode steps, so the served models, not the client, are the
bottleneck.

The same episodes (``--methods`` x the first ``--tasks`` retail test tasks x ``--seeds``) run
twice through ``prour.eval.harness``, each into fresh run folders:

- before the queue (commit 4cdbe3c's parent): each method alone (as ``prour eval --method M``),
  one after another, its ``eval.concurrency`` lowered to the smallest ``max_num_seqs`` of the
  servers its models are on (:func:`prour.cluster.recipe.eval_concurrency`, what ``prour eval``
  did then): the baselines at BACKBONE, ``llm-router`` at GENERATOR;
- one queue: one Evaluation of every method at ``eval.concurrency`` ``--queue-concurrency``
  (default twice BACKBONE: an episode spends part of its time off the backbone, on its tools,
  the client's code and the generator), each model's requests held at its own server's limit by
  :mod:`prour.eval.queue`'s gates.

Each server's requests are counted two ways. Exactly, from vLLM's own per-request time sums read
from ``/metrics`` before and after each run: by Little's law a sum of request seconds over the
run's wall time is the time-averaged number of requests in that phase, so
``vllm:e2e_request_latency_seconds_sum`` gives the requests inside the server (arrival at its API
to the last token), ``vllm:request_queue_time_seconds_sum`` those waiting in the engine's queue
and ``vllm:request_inference_time_seconds_sum`` those running in the engine's batch. And by
sampling: a thread reads ``vllm:num_requests_running`` every ``--sample-s`` seconds for its
histogram (the share of samples at the limit); on a busy client it samples late and thin. Printed:
each run's wall time, their ratio, per server the counts above, and what the queue recorded
(``queue.jsonl``): the episodes in flight, and per lane its requests in flight, the share of the
time at its limit and the calls that waited for a slot.

``--hidden-size`` and ``--layers`` size the random model both servers serve (default: the tiny
model of the tests). A larger one makes each decode step cost the engine more, the case of a GPU
node, where a reply takes seconds of engine time and the client's and the API front end's CPU
work is small beside it.

Usage:
  python benchmarks/eval_queue.py [--backbone-limit 8] [--generator-limit 2] [--tasks 8]
      [--queue-concurrency 16] [--seeds 0,1] [--max-steps 6] [--max-tokens 256] [--generator-max-tokens 256]
      [--hidden-size 128] [--layers 2]
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
BACKBONE, GENERATOR = "tiny-backbone", "tiny-generator"
TINY_CONTEXT = 16384
METHODS = "base,saber,verifiagent,llm-router"
BACKBONE_ROLES = ("agent", "user", "verifier", "router", "decomposer", "judge")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backbone-limit", type=int, default=8, help="backbone max_num_seqs")
    parser.add_argument("--generator-limit", type=int, default=2, help="generator max_num_seqs")
    parser.add_argument("--queue-concurrency", type=int, default=None,
                        help="eval.concurrency of the queued run (default: 2 x backbone limit)")
    parser.add_argument("--methods", default=METHODS, help="comma list of eval methods")
    parser.add_argument("--tasks", type=int, default=8, help="first N retail test tasks")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--max-steps", type=int, default=6, help="env.max_steps")
    parser.add_argument("--max-tokens", type=int, default=256,
                        help="per agent, user and router message")
    parser.add_argument("--generator-max-tokens", type=int, default=256, help="per query")
    parser.add_argument("--sample-s", type=float, default=0.25, help="metrics sampling period")
    parser.add_argument("--start-timeout", type=float, default=600.0, help="vLLM start-up, s")
    parser.add_argument("--hidden-size", type=int, default=128, help="the served model's width")
    parser.add_argument("--layers", type=int, default=2, help="the served model's layers")
    return parser.parse_args()


# Per-request time sums (seconds) of vLLM's metrics, by the phase each covers.
PHASES = {"in the server": "vllm:e2e_request_latency_seconds_sum",
          "waiting": "vllm:request_queue_time_seconds_sum",
          "running": "vllm:request_inference_time_seconds_sum"}


def _metrics(base_url: str) -> str | None:
    root = base_url.rsplit("/v1", 1)[0]
    try:
        with urllib.request.urlopen(f"{root}/metrics", timeout=5) as response:
            return response.read().decode()
    except OSError:
        return None


def _metric(text: str, name: str) -> float | None:
    """``name`` summed over its label sets in a ``/metrics`` page (None: absent)."""
    values = [float(m.group(1)) for m in
              re.finditer(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.eE+-]+)$", text,
                          re.MULTILINE)]
    return sum(values) if values else None


def running_requests(base_url: str) -> float | None:
    """``vllm:num_requests_running`` now (None: unreadable)."""
    text = _metrics(base_url)
    return None if text is None else _metric(text, "vllm:num_requests_running")


def time_sums(base_url: str) -> dict[str, float]:
    """The server's request seconds so far, per phase of :data:`PHASES`."""
    text = _metrics(base_url)
    if text is None:
        raise RuntimeError(f"cannot read {base_url}'s /metrics")
    sums = {phase: _metric(text, name) for phase, name in PHASES.items()}
    missing = [PHASES[phase] for phase, value in sums.items() if value is None]
    if missing:
        raise RuntimeError(f"{base_url}'s /metrics has no {', '.join(missing)}")
    return sums  # type: ignore[return-value]


class Sampler:
    """Reads each server's running requests every ``period`` seconds in a thread."""

    def __init__(self, urls: dict[str, str], period: float):
        self.urls, self.period = urls, period
        self.samples: dict[str, list[float]] = {name: [] for name in urls}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            for name, url in self.urls.items():
                value = running_requests(url)
                if value is not None:
                    self.samples[name].append(value)
            self._stop.wait(self.period)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def recipe(run_dir: Path, urls: dict[str, str], methods: list[str], concurrency: int,
           args: argparse.Namespace) -> Any:
    import yaml

    from prour.recipes import load_recipe

    def model(name: str, limit: int) -> dict[str, Any]:
        return {"backend": "openai", "base_url": urls[name], "model": name,
                "max_concurrency": limit, "max_model_len": TINY_CONTEXT, "timeout_s": 600}

    models = {role: model(BACKBONE, args.backbone_limit) for role in BACKBONE_ROLES}
    models["generator"] = model(GENERATOR, args.generator_limit)
    data = {
        "name": "eval-queue-bench", "run_dir": str(run_dir),
        "models": models,
        "env": {"max_steps": args.max_steps, "agent_max_tokens": args.max_tokens,
                "user_max_tokens": args.max_tokens},
        "router": {"llm_router_max_tokens": args.max_tokens, "llm_router_fallback": "clarify"},
        "train": {"rollout": {"max_response_tokens": args.generator_max_tokens}},
        "serve": {"models": {BACKBONE: {"max_num_seqs": args.backbone_limit},
                             GENERATOR: {"max_num_seqs": args.generator_limit}}},
        "eval": {"methods": methods, "domains": ["retail"], "split": "test",
                 "max_tasks": args.tasks, "seeds": [int(s) for s in args.seeds.split(",")],
                 "concurrency": concurrency, "judge": False, "max_error_fraction": 1.0},
    }
    path = run_dir.parent / f"{run_dir.name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    loaded = load_recipe(path)
    return loaded


def timed(name: str, urls: dict[str, str], args: argparse.Namespace, runs: list[list[str]],
          root: Path, lowered: bool, concurrency: int | None = None) -> dict[str, Any]:
    """Run each method list of ``runs`` as one Evaluation, in turn, into one folder each
    at eval.concurrency ``concurrency`` (default the backbone's limit; ``lowered``: lowered as
    before the queue); returns wall seconds,
    episodes, errors, per-server in-flight samples, the concurrency each ran at and the
    recorded queue sessions."""
    from prour.cluster.recipe import eval_concurrency
    from prour.eval.harness import Evaluation
    from prour.eval.queue import read_sessions

    episodes = errors = 0
    sessions: list[dict[str, Any]] = []
    ran_at: dict[str, int] = {}
    walls: dict[str, float] = {}
    before = {name: time_sums(url) for name, url in urls.items()}
    started = time.perf_counter()
    with Sampler(urls, args.sample_s) as sampler:
        for i, methods in enumerate(runs):
            run_dir = root / f"{name}-{i}"
            loaded = recipe(run_dir, urls, methods, concurrency or args.backbone_limit, args)
            at = eval_concurrency(loaded) if lowered else loaded.eval.concurrency
            if at != loaded.eval.concurrency:
                loaded = recipe(run_dir, urls, methods, at, args)
            ran_at[",".join(methods)] = at
            evaluation = Evaluation(loaded, run_dir, progress=False)
            t0 = time.perf_counter()
            try:
                lines = evaluation.run()
            finally:
                evaluation.close()
            walls[",".join(methods)] = time.perf_counter() - t0
            episodes += len(lines)
            errors += sum(line["error"] for line in lines)
            sessions += read_sessions(run_dir)
    wall = time.perf_counter() - started
    after = {name: time_sums(url) for name, url in urls.items()}
    means = {name: {phase: (after[name][phase] - before[name][phase]) / wall for phase in PHASES}
             for name in urls}  # Little's law: request seconds per second of wall time
    return {"wall_s": wall, "episodes": episodes, "errors": errors, "means": means,
            "samples": sampler.samples, "sessions": sessions, "ran_at": ran_at, "walls": walls}


def describe(name: str, result: dict[str, Any], limits: dict[str, int]) -> list[str]:
    lines = [
        (f"{name}: {result['wall_s']:.1f} s wall, {result['episodes']} episodes "
         f"({result['errors']} errored), {result['episodes'] / result['wall_s'] * 60:.2f} "
         "episodes/min"),
        "  " + "; ".join(f"{methods} at eval.concurrency {c}: {result['walls'][methods]:.1f} s"
                         for methods, c in result["ran_at"].items()),
    ]
    for server, means in result["means"].items():
        lines.append(f"  {server} (--max-num-seqs {limits[server]}) requests, time-averaged from "
                     "vLLM's request-second sums: "
                     + ", ".join(f"{phase} {value:.2f}" for phase, value in means.items()))
    for server, samples in result["samples"].items():
        limit = limits[server]
        mean = sum(samples) / len(samples) if samples else float("nan")
        at_limit = sum(s >= limit for s in samples) / len(samples) if samples else float("nan")
        idle = sum(s == 0 for s in samples) / len(samples) if samples else float("nan")
        histogram = Counter(int(s) for s in samples)
        lines.append(
            f"  {server} (--max-num-seqs {limit}) running requests, {len(samples)} samples: "
            f"mean {mean:.2f}, at the limit {at_limit:.0%}, idle {idle:.0%}; histogram "
            + ", ".join(f"{k}: {histogram[k]}" for k in sorted(histogram)))
    wall = sum(s["wall_s"] for s in result["sessions"])
    lanes: dict[str, dict[str, float]] = {}
    limits_of: dict[str, set[int]] = {}  # a method run alone at a lowered eval.concurrency
    for session in result["sessions"]:  # time-weighted over the sessions (one per method run)
        for lane, info in session["lanes"].items():
            entry = lanes.setdefault(lane.split(" at ")[0], Counter())
            limits_of.setdefault(lane.split(" at ")[0], set()).add(info["limit"])
            for key in ("mean_in_flight", "mean_requests", "at_limit"):
                entry[key] += info.get(key, 0.0) * session["wall_s"] / wall
            entry["calls"] += info.get("calls", 0)
            entry["waited"] += info.get("waited", 0)
    achieved = sum(s["mean_in_flight"] * s["wall_s"] for s in result["sessions"]) / wall
    lines.append(f"  queue.jsonl: episodes in flight {achieved:.2f}; per lane (limit): episodes, "
                 "requests in flight, time at the limit, calls that waited")
    lines += [f"    {lane} ({' or '.join(map(str, sorted(limits_of[lane])))}): "
              f"{e['mean_in_flight']:.2f} episodes, "
              f"{e['mean_requests']:.2f} requests, at the limit {e['at_limit']:.0%}, "
              f"{e['waited']:.0f} of {e['calls']:.0f} calls waited"
              for lane, e in sorted(lanes.items())]
    return lines


def main() -> None:
    args = parse_args()
    from prour.cluster.vllm_server import VLLMServer
    from prour.demo.tiny import build_tiny_model

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    limits = {BACKBONE: args.backbone_limit, GENERATOR: args.generator_limit}
    python = os.environ.get("PROUR_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")
    with tempfile.TemporaryDirectory(prefix="prour-eval-queue-bench-") as tmp:
        root = Path(tmp)
        model_dir = build_tiny_model(root / "tiny", seed=0, max_position=TINY_CONTEXT,
                                     hidden_size=args.hidden_size, num_layers=args.layers)
        servers = {name: VLLMServer(
            model_dir, python=python, served_name=name, max_model_len=TINY_CONTEXT,
            extra_args=("--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                        "--max-num-seqs", str(limit))) for name, limit in limits.items()}
        failures: list[BaseException] = []

        def start(server: VLLMServer) -> None:
            try:
                server.start(timeout_s=args.start_timeout)
            except BaseException as exc:  # noqa: BLE001 - raised below, after both tried
                failures.append(exc)

        threads = [threading.Thread(target=start, args=(s,)) for s in servers.values()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        try:
            if failures:
                raise failures[0]
            urls = {name: server.base_url for name, server in servers.items()}
            # warm-up: one episode of every method, so neither run pays first-request compilation
            warm = argparse.Namespace(**{**vars(args), "tasks": 1, "seeds": "0"})
            timed("warmup", urls, warm, [methods], root, lowered=False)
            after = timed("after", urls, args, [[m] for m in methods], root, lowered=True)
            queued = timed("queue", urls, args, [methods], root, lowered=False,
                           concurrency=args.queue_concurrency or 2 * args.backbone_limit)
        finally:
            for server in servers.values():
                server.stop()
    seeds = len(args.seeds.split(","))
    print(f"{len(methods)} methods ({', '.join(methods)}) x {args.tasks} retail test tasks x "
          f"{seeds} seeds = {len(methods) * args.tasks * seeds} episodes per run; env.max_steps "
          f"{args.max_steps}, max_tokens {args.max_tokens} (agent, user, router), generator "
          f"{args.generator_max_tokens}; two vLLM CPU servers on a random Qwen3 (hidden "
          f"{args.hidden_size}, {args.layers} layers): {BACKBONE} "
          f"--max-num-seqs {args.backbone_limit} (agent, user, verifier, router), {GENERATOR} "
          f"--max-num-seqs {args.generator_limit} (generator: llm-router only)")
    for line in [*describe("before the queue (each method alone, one after another)", after,
                           limits),
                 *describe("one queue", queued, limits)]:
        print(line)
    print(f"ratio (before / one queue, wall): {after['wall_s'] / queued['wall_s']:.2f}x")
    print(json.dumps({"before_s": round(after["wall_s"], 1),
                      "queue_s": round(queued["wall_s"], 1), "limits": limits}))


if __name__ == "__main__":
    main()
