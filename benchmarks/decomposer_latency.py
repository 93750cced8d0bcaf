"""Decision latency of the batched decomposer against a naive one-call-at-a-time decomposer.

Both run the same decision (K=5 goal readings, L=4 actions each) on a real tau2 retail state
with a ~600-token history, on the tiny random Qwen3 on CPU, with the same seed:
- batched: 1 chat call with the K goal requests, 1 chat call with the K·L action requests, 1 score
  call for every (reading, candidate) pair. The hf backend prefills equal prompts once, keeps the
  prefix shared by the action prompts once in a token tree (each sample decodes on its own
  branch), and scores with two-level reuse (common prefix once, each reading's context once);
- naive (``Decomposer(batched=False)``): every request in its own call, K + K·L chat calls and
  K·|C| score calls, each encoding its whole prompt or context.
Every sample is a request with its own seed, so both runs draw the same samples; the script
asserts that they reach the same decision (readings, candidates, invalid counts, route, and
log-likelihoods to 1e-4). Runs alternate (batched, naive, batched, ...) so that load changes on a
shared machine hit both; wall and process CPU seconds are reported, with the load average.

The random tiny model writes noise, which never parses as an action. So that scoring has
candidates, each generated sample (really generated, at full cost) is mapped to a fixed goal
or action text chosen by a hash of its token ids: equal seeds give equal samples, hence equal
candidate sets in both runs. Scores are the tiny model's own.

Usage: python benchmarks/decomposer_latency.py [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from prour.env.domains import load_tasks
from prour.env.environment import execute_tool_call, make_env, tool_schemas
from prour.llm.base import ChatRequest, Completion, ScoreRequest, ScoreResult
from prour.router import Decomposer, RouterConfig
from prour.router.decomposer import Decision

OPENING = "Hi! I'd like to exchange a couple of things I received. I'm Mei Kovacs, zip code 28236."
DIALOGUE = [
    (
        "assistant",
        (
            "Thank you, Mei. I found your account. It has three orders: #W6390527, #W7800651 "
            "and #W8065207. Which order holds the items you would like to exchange?"
        ),
    ),
    (
        "user",
        (
            "It's the one with the water bottle and the desk lamp. I'd like a bigger water bottle, "
            "and a desk lamp that is not as bright as the one I have now."
        ),
    ),
    (
        "assistant",
        (
            "Items can be exchanged only once an order has been delivered, and only for other "
            "options of the same product. Do you remember when the order arrived?"
        ),
    ),
    (
        "user",
        (
            "I think it arrived last month, but I don't remember the order number, sorry. "
            "Also, if possible I'd prefer a lamp that runs on batteries rather than USB."
        ),
    ),
    (
        "assistant",
        (
            "No problem, I can look it up. Is there anything else you want to change in "
            "that order, for example the payment method for any price difference?"
        ),
    ),
    ("user", "Please use the same PayPal account I paid with. That's everything."),
]
GOALS = [
    "I want to exchange the water bottle and the desk lamp from my delivered order.",
    "I want a bigger water bottle instead of the one I received.",
    "I want to swap my desk lamp for a dimmer one.",
    "I want to return the items I received and get my money back.",
    "I want to know which of my orders contains the desk lamp.",
    "I want to check the status of my recent orders.",
]


def _actions(orders: list[str]) -> list[str]:
    """A pool of candidate texts for this state: valid calls, respond, and malformed samples."""
    valid = [{"tool": "get_order_details", "arguments": {"order_id": o}} for o in orders]
    valid += [
        {"tool": "respond", "arguments": {}},
        {"tool": "list_all_product_types", "arguments": {}},
        {"tool": "get_product_details", "arguments": {"product_id": "8310926033"}},
        {"tool": "get_product_details", "arguments": {"product_id": "1656367028"}},
        {"tool": "transfer_to_human_agents", "arguments": {"summary": "exchange two items"}},
        {"tool": "calculate", "arguments": {"expression": "54.04 - 48.02"}},
    ]
    broken = ['{"tool": "get_order_details", "arguments": {"order_id": ', "Sure, let me check."]
    return [json.dumps(a) for a in valid] + broken


class HashMappedChat:
    """Generates with the real backend, then maps each sample to a pool text by its tokens."""

    name = "hash-mapped"

    def __init__(self, llm, goals: list[str], actions: list[str]):
        self.llm, self.goals, self.actions = llm, goals, actions

    def _map(self, completion: Completion, pool: list[str]) -> Completion:
        digest = hashlib.sha256(json.dumps(completion.token_ids).encode()).digest()
        text = pool[int.from_bytes(digest[:4], "little") % len(pool)]
        return Completion(text=text, content=text, token_ids=completion.token_ids)

    def chat(self, requests: Sequence[ChatRequest]) -> list[list[Completion]]:
        out = self.llm.chat(requests)
        pools = [
            self.goals if "goal, in one sentence" in r.messages[-1]["content"] else self.actions
            for r in requests
        ]
        return [[self._map(c, pool) for c in group] for group, pool in zip(out, pools)]

    def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        return self.llm.score(requests)

    def close(self) -> None:
        self.llm.close()


def _call(env, messages: list[dict], name: str, arguments: dict) -> str:
    call_id = f"call_{len(messages)}"
    messages.append(
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
            ],
        }
    )
    observation, _ = execute_tool_call(env, name, arguments, call_id=call_id)
    messages.append({"role": "tool", "tool_call_id": call_id, "name": name, "content": observation})
    return observation


def retail_state() -> tuple[list[dict], list[str]]:
    """Retail test task 0: the user's opening and three real tau2 tool calls with observations."""
    env = make_env("retail", load_tasks("retail", "test")[0])
    messages: list[dict] = [{"role": "user", "content": OPENING}]
    user_id = _call(
        env,
        messages,
        "find_user_id_by_name_zip",
        {"first_name": "Mei", "last_name": "Kovacs", "zip": "28236"},
    )
    orders = json.loads(_call(env, messages, "get_user_details", {"user_id": user_id}))["orders"]
    for role, text in DIALOGUE:
        messages.append({"role": role, "content": text})
    return messages, orders


def _timed(decomposer: Decomposer, messages: list[dict]) -> tuple[float, float, Decision]:
    """One decision: (wall seconds, process CPU seconds, the decision)."""
    wall, cpu = time.perf_counter(), time.process_time()
    decision = decomposer.decide(messages, seed=1234)
    return time.perf_counter() - wall, time.process_time() - cpu, decision


def _same_decision(a: Decision, b: Decision) -> float:
    """Assert that two decisions agree; return the largest log-likelihood difference."""
    assert (a.interpretations, a.candidates, a.invalid) == (
        b.interpretations,
        b.candidates,
        b.invalid,
    )
    assert a.route == b.route, (a.route, b.route)
    diff = float(np.max(np.abs(np.asarray(a.loglik) - np.asarray(b.loglik))))
    assert diff < 1e-4, f"log-likelihoods differ by {diff}"
    return diff


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 is steadiest)")
    parser.add_argument("--model-dir", default=None, help="tiny model folder (built if missing)")
    args = parser.parse_args()

    import torch

    from prour.demo.tiny import build_tiny_model
    from prour.llm.hf import HFLLM
    from prour.llm.history import render_history

    torch.set_num_threads(args.threads)
    model_dir = build_tiny_model(
        args.model_dir or Path(tempfile.gettempdir()) / "prour-bench-tiny", seed=0
    )
    hf = HFLLM(str(model_dir), device="cpu", dtype="float32", seed=0)
    messages, orders = retail_state()
    history_tokens = len(hf.encode(render_history(messages)))
    llm = HashMappedChat(hf, GOALS, _actions(orders))
    config = RouterConfig(
        tool_detail="brief", goal_max_tokens=24, action_max_tokens=40, tau_au=0.25, tau_eu=0.2
    )
    batched = Decomposer(llm, tool_schemas("retail"), config)
    naive = Decomposer(llm, tool_schemas("retail"), config, batched=False)

    batched.decide(messages, seed=0)  # warm-up
    load_before = os.getloadavg()
    runs: dict[str, list[tuple[float, float, Decision]]] = {"batched": [], "naive": []}
    for _ in range(args.repeats):
        runs["batched"].append(_timed(batched, messages))
        runs["naive"].append(_timed(naive, messages))
    load_after = os.getloadavg()

    fast, slow = runs["batched"][-1][2], runs["naive"][-1][2]
    diff = max(_same_decision(f[2], s[2]) for f, s in zip(runs["batched"], runs["naive"]))
    print(
        f"history: {history_tokens} tokens; K=5, L=4; |C|={len(fast.candidates)}; "
        f"invalid={fast.invalid}; torch threads={args.threads}; repeats={args.repeats}"
    )
    print(
        f"load average (1/5/15 min): before {', '.join(f'{x:.2f}' for x in load_before)}; "
        f"after {', '.join(f'{x:.2f}' for x in load_after)} on {os.cpu_count()} CPUs"
    )
    print(f"identical decisions: route {fast.route}; max |Δ loglik| = {diff:.2e}")
    medians = {}
    for name, decision in (("batched", fast), ("naive", slow)):
        wall = statistics.median(r[0] for r in runs[name])
        cpu = statistics.median(r[1] for r in runs[name])
        medians[name] = (wall, cpu)
        phases = ", ".join(f"{k} {v:.2f}" for k, v in decision.phase_s.items())
        print(
            f"{name:8s} {wall:6.2f} s wall, {cpu:6.2f} s CPU per decision "
            f"(last run's phases, wall: {phases}); calls {decision.model_calls}"
        )
    ratios = {k: slow.phase_s[k] / fast.phase_s[k] for k in fast.phase_s}
    print("phase speed-ups (wall): " + ", ".join(f"{k} {v:.1f}x" for k, v in ratios.items()))
    print(
        f"speed-up (naive / batched): {medians['naive'][0] / medians['batched'][0]:.1f}x wall, "
        f"{medians['naive'][1] / medians['batched'][1]:.1f}x CPU"
    )


if __name__ == "__main__":
    main()
