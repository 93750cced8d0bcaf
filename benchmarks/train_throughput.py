"""Local-trainer throughput on the tiny model: tokens/s of rollout, reward scoring and update.

One run of the local trainer's own code paths on CPU: sampling a group of queries per state
(``Policy.sample``), teacher-forced belief scoring through the same live model
(``policy.llm.score``, what the information-gain reward calls), and one DAPO update
(``LocalTrainer.train_step`` with the verifiable format reward). Prints tokens/s of each phase
and their ratios to rollout.

Usage: python benchmarks/train_throughput.py [--states 4] [--n 8] [--response 48] [--threads 1]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from prour.config import ModelConfig, Recipe
from prour.config.train import TrainConfig
from prour.demo.tiny import default_tiny_dir
from prour.llm.base import ScoreRequest
from prour.rewards.belief import belief_prompt
from prour.rollout.query import clarify_prompt
from prour.train.local import LocalTrainer
from prour.train.reward import VerifiableFormatReward

HISTORY = [
    {"role": "user", "content": "Hi, I want to return the hiking boots from my last order."},
    {"role": "assistant", "content": "Sure. Could you give me the email on your account?"},
    {"role": "user", "content": "It is mia.li@example.com."},
]
TARGET = (
    "I want to return the hiking boots from order #W2378156 and get the refund on my gift card."
)


def _rows(n: int) -> list[dict]:
    prompt = clarify_prompt(HISTORY)
    return [
        {
            "prompt": prompt,
            "reward_model": {"ground_truth": TARGET},
            "extra_info": {"mode": "clarify", "domain": "retail", "history": HISTORY},
        }
        for _ in range(n)
    ]


def _trainer(args: argparse.Namespace, out: Path) -> LocalTrainer:
    recipe = Recipe(
        name="bench", models={"generator": ModelConfig(backend="hf", path=str(default_tiny_dir()))}
    )
    cfg = TrainConfig.model_validate(
        {
            "states_per_step": args.states,
            "total_steps": 1,
            "output_dir": str(out),
            "device": "cpu",
            "dtype": "float32",
            "gradient_checkpointing": False,
            "rollout": {
                "n": args.n,
                "keep": max(2, args.n * 3 // 4),
                "max_response_tokens": args.response,
            },
            "optim": {"warmup_steps": 0},
            "ppo": {"epochs": 1},
        }
    )
    trainer = LocalTrainer(
        recipe,
        cfg,
        reward_fn=VerifiableFormatReward(),
        make_state=lambda row: row,
        rows=_rows(args.states),
    )
    trainer.setup()
    return trainer


def scoring_rate(trainer: LocalTrainer, n_requests: int) -> float:
    """Scored tokens (context + target) per second for belief requests of one state."""
    requests = [
        ScoreRequest(
            context=belief_prompt("clarify", HISTORY, f"Which item? ({i})", "The boots."),
            target=TARGET,
        )
        for i in range(n_requests)
    ]
    start = time.perf_counter()
    results = trainer.policy.llm.score(requests)
    seconds = time.perf_counter() - start
    context = sum(
        len(trainer.policy.llm.encode(trainer.policy.llm.render_chat(r.context, None, False)))
        for r in requests
    )
    return (context + sum(r.n_tokens for r in results)) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", type=int, default=4)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--response", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = _trainer(args, Path(tmp) / "run")
        trainer.train_step()  # warm-up: first calls pay for allocation and lazy imports
        metrics = trainer.train_step()
        score = scoring_rate(trainer, args.n)
    rollout, update = metrics["rollout_tokens_per_s"], metrics["update_tokens_per_s"]
    print(
        f"tiny Qwen3, {args.states} states x {args.n} samples, response <= {args.response} tokens, "
        f"{args.threads} thread(s)"
    )
    print(f"rollout  {rollout:10.1f} generated tokens/s")
    print(f"scoring  {score:10.1f} scored tokens/s (context + target, one forward)")
    print(
        f"update   {update:10.1f} response tokens/s per epoch (forward + backward + step)"
        if update
        else "update   no group had a usable signal in this step"
    )
    print(
        f"ratios: scoring/rollout {score / rollout:.1f}x"
        + (f", update/rollout {update / rollout:.2f}x" if update else "")
    )


if __name__ == "__main__":
    main()
