"""Scoring cost of one group (8 queries of one state): batched reward vs the naive per-sample way.

naive:   every sample scores its own prior and its own posterior, one call each (16 passes);
batched: InfoGainReward scores the prior once (cached per state) and all posteriors in one call.
Runs the tiny Qwen3 on CPU with a scripted strict user, and prints tokens processed, wall time
and the ratios, measured in this run. Usage: python benchmarks/reward_scoring.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from pathlib import Path

from prour.demo.tiny import default_tiny_dir
from prour.llm.base import ScoreRequest
from prour.llm.hf import HFLLM
from prour.llm.scripted import ScriptedLLM
from prour.rewards import InfoGainReward, RewardConfig, RewardState, belief_prompt
from prour.rollout import StrictUserSimulator

GOAL = (
    "I am Yusuf Rossi from zip 19122. I want to exchange the mechanical keyboard in order "
    "#W2378156 for one with clicky switches and the thermostat for a Google Home model, "
    "paying any difference with my credit card."
)
QUESTIONS = [
    "Which switch type do you want for the new keyboard?",
    "Which smart-home system should the new thermostat work with?",
    "How do you want to pay the price difference?",
    "Which order are the items from?",
    "Do you want to keep the RGB backlight?",
    "Should I exchange both items in one go?",
    "Anything else?",
    "What is your zip code?",
]


class CountingLLM:
    """Counts score calls and the tokens each call processes (context + target)."""

    def __init__(self, inner: HFLLM):
        self.inner, self.name = inner, inner.name
        self.calls = self.tokens = 0

    def score(self, requests):
        self.calls += 1
        for r in requests:
            context = self.inner.render_chat(r.context, None, r.enable_thinking)
            self.tokens += len(self.inner.encode(context)) + len(self.inner.encode(r.target))
        return self.inner.score(requests)

    def chat(self, requests):
        return self.inner.chat(requests)

    def close(self):
        self.inner.close()


def history(turns: int = 6) -> list[dict]:
    """A plausible dialogue prefix, long enough that the shared history dominates the prompt."""
    lines = []
    for i in range(turns):
        lines.append(
            {
                "role": "user",
                "content": f"Turn {i}: I bought a keyboard and a thermostat and "
                "something about them is not what I expected, can you help me sort it out?",
            }
        )
        lines.append(
            {
                "role": "assistant",
                "content": "Of course. I can look up your order and the "
                "exchange options once I have verified who you are.",
            }
        )
    return lines


def naive(policy: CountingLLM, hist: list[dict], answers: dict[str, str]) -> list[float]:
    """The per-sample implementation: two single-request score calls per sample."""
    rewards = []
    for q in QUESTIONS:
        prior = policy.score([ScoreRequest(belief_prompt("clarify", hist), GOAL)])[0].sum
        post = policy.score([ScoreRequest(belief_prompt("clarify", hist, q, answers[q]), GOAL)])[
            0
        ].sum
        rewards.append(post - prior)
    return rewards


def measure(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--model", type=Path, default=None, help="tiny model folder (default: the cached one)"
    )
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)  # the tiny model's matmuls are slower with two threads on two cores
    folder = args.model or default_tiny_dir(seed=0)
    hf = HFLLM(str(folder), device="cpu", dtype="float32")
    answers = {
        q: f"About that: {q.lower().rstrip('?')} - yes, exactly as I said." for q in QUESTIONS
    }
    user_llm = ScriptedLLM(
        rules=[(f"user: {q.replace('?', '[?]')}", a) for q, a in answers.items()]
    )
    hist = history()
    outputs = [f"YES [QUESTION]{q}[/QUESTION]" for q in QUESTIONS]

    times: dict[str, list[float]] = {"naive": [], "batched": [], "no_reuse": []}
    drift = 0.0
    for i in range(args.repeats):
        naive_policy = CountingLLM(hf)
        t_naive, naive_rewards = measure(functools.partial(naive, naive_policy, hist, answers))
        policy = CountingLLM(hf)
        cfg = RewardConfig()
        reward = InfoGainReward(policy, StrictUserSimulator(user_llm, cfg), None, cfg)
        state = RewardState(
            mode="clarify", history=hist, target=GOAL, domain="retail", state_id=f"s{i}"
        )
        t_batched, samples = measure(functools.partial(reward.score_group, state, outputs))
        hf.prefix_reuse = False  # the same batched calls, every context encoded in full
        state_b = RewardState(
            mode="clarify", history=hist, target=GOAL, domain="retail", state_id=f"n{i}"
        )
        reward_b = InfoGainReward(hf, StrictUserSimulator(user_llm, cfg), None, cfg)
        t_plain, _ = measure(functools.partial(reward_b.score_group, state_b, outputs))
        hf.prefix_reuse = True
        times["no_reuse"].append(t_plain)
        times["naive"].append(t_naive)
        times["batched"].append(t_batched)
        drift = max([drift] + [abs(a - s.reward) for a, s in zip(naive_rewards, samples)])
    t_n, t_b = statistics.median(times["naive"]), statistics.median(times["batched"])
    print(
        f"group: 8 queries of one clarify state; tiny Qwen3 on CPU; median of {args.repeats} runs"
    )
    print(
        f"naive:   {naive_policy.calls:3d} score calls, {naive_policy.tokens:6d} tokens, {t_n:.3f} s"
    )
    print(
        f"batched: {policy.calls:3d} score calls, {policy.tokens:6d} tokens, {t_b:.3f} s "
        "(includes the scripted responder)"
    )
    print(
        f"ratio naive/batched: calls {naive_policy.calls / policy.calls:.1f}x, "
        f"tokens {naive_policy.tokens / policy.tokens:.2f}x, wall {t_n / t_b:.2f}x"
    )
    print(f"max |R_naive - R_batched| = {drift:.2e}")
    t_p = statistics.median(times["no_reuse"])
    print(
        f"batched without prefix reuse: {t_p:.3f} s; the shared history prefix of the posterior "
        f"contexts is encoded once with reuse: {t_p / t_b:.2f}x"
    )

if __name__ == "__main__":
    main()
