"""Step time of the local trainer without and with ``train.overlap: one_step``, in one run.

The trainer's own code on CPU (``LocalTrainer.train_step``): a tiny Qwen3, fine-tuned here for a
few steps so that it asks questions, samples each state's group; the information-gain reward
(``InfoGainReward``) sends the questions to a strict user whose model takes ``--latency`` seconds
a call (a remote Qwen3-8B's round trip) and scores beliefs with the sampling policy; the update
is the real DAPO update, held to ``--update`` seconds (the paper-scale update's duration, scaled
down). Each mode runs ``--steps`` steps; the first is left out of the means (warm-up, and with
overlap nothing was sampled ahead yet). Prints the phases, both step times, their ratio, and the
goal: the overlapped step within 1.15x the longer of rollout (sampling + reward) and update.

Usage: python benchmarks/overlap_step.py [--latency 1.0] [--update 1.0] [--steps 4] [--states 4]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from prour.config import ModelConfig, Recipe
from prour.config.train import TrainConfig
from prour.demo.corpus import SFTExample
from prour.demo.tiny import default_tiny_dir
from prour.llm.scripted import ScriptedLLM
from prour.rewards import InfoGainReward, RewardState
from prour.rollout import StrictUserSimulator
from prour.train.local import LocalTrainer

PROMPT = "Ask the customer one question about the return."
ASK = "<think>order</think>YES [QUESTION]Which order do you want to return?[/QUESTION]"
HISTORY = [{"role": "user", "content": "I want to return something."}]


class SlowUser(ScriptedLLM):
    """The strict user's model: a fixed reply after ``latency`` seconds per call."""

    def __init__(self, latency: float):
        super().__init__(default="Order #W1000, the boots.")
        self.latency = latency

    def chat(self, requests):
        time.sleep(self.latency)
        return super().chat(requests)


class Trainer(LocalTrainer):
    """The local trainer with the slow strict user and an update held to a stated duration."""

    latency = 1.0
    update_s = 1.0

    def _reward_for(self, policy_llm: Any) -> InfoGainReward:
        reward = self.recipe.reward
        user = StrictUserSimulator(SlowUser(self.latency), reward)
        return InfoGainReward(policy_llm, user, None, reward)

    def _update(self, groups):
        start = time.perf_counter()
        out = super()._update(groups)
        time.sleep(max(0.0, self.update_s - (time.perf_counter() - start)))
        return out


def asking_model(out: Path) -> Path:
    """The tiny model fine-tuned on the benchmark's prompt answered by a question."""
    from transformers import AutoTokenizer

    from prour.demo.training import encode_example
    from prour.demo.warmstart import fine_tune

    base = default_tiny_dir()
    tokenizer = AutoTokenizer.from_pretrained(base)
    example = SFTExample("format", [{"role": "user", "content": PROMPT}],
                         {"role": "assistant", "content": ASK}, enable_thinking=True)
    rows = [[encode_example(tokenizer, example, 256)]]
    out.mkdir(parents=True)
    fine_tune(base, out, [rows] * 20, 5e-3, 0)
    return out


def run(args: argparse.Namespace, model: Path, out: Path, overlap: str) -> list[dict[str, Any]]:
    recipe = Recipe(name="bench", models={"generator": ModelConfig(backend="hf", path=str(model))})
    cfg = TrainConfig.model_validate({
        "states_per_step": args.states, "total_steps": args.steps, "save_every": 10_000,
        "output_dir": str(out), "device": "cpu", "dtype": "float32",
        "gradient_checkpointing": False, "overlap": overlap,
        "rollout": {"n": 4, "keep": 2, "max_response_tokens": 24},
        "optim": {"warmup_steps": 0}, "ppo": {"epochs": 1},
    })
    rows = [{"prompt": [{"role": "user", "content": PROMPT}], "id": str(i),
             "extra_info": {"mode": "clarify"}} for i in range(args.states)]
    Trainer.latency, Trainer.update_s = args.latency, args.update
    trainer = Trainer(recipe, cfg, rows=rows, make_state=lambda row: RewardState(
        mode="clarify", history=HISTORY, target="Return the boots of order #W1000.",
        domain="retail", state_id=row["id"]))
    trainer.run(progress=False)
    return trainer.metrics.read()[1:]


def mean(rows: list[dict[str, Any]], *keys: str) -> float:
    return statistics.fmean(sum(r[k] for k in keys) for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=1.0, help="seconds per responder call")
    parser.add_argument("--update", type=float, default=1.0, help="seconds per update")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--states", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model = asking_model(Path(tmp) / "asking")
        off = run(args, model, Path(tmp) / "off", "off")
        on = run(args, model, Path(tmp) / "on", "one_step")
    rollout = mean(off, "time_rollout_s", "time_reward_s")
    update = mean(off, "time_update_s")
    step_off, step_on = mean(off, "time_step_s"), mean(on, "time_step_s")
    asks = statistics.fmean(r["n_valid"] for r in off + on)
    goal = 1.15 * max(rollout, update)
    print(f"local trainer, tiny Qwen3 on CPU, {args.states} states x 4 samples "
          f"({asks:.1f} questions a step), responder {args.latency:.2f} s a call, update held to "
          f"{args.update:.2f} s, {args.steps - 1} measured steps per mode")
    print(f"rollout (sampling + reward) {rollout:.2f} s, update {update:.2f} s")
    print(f"step off      {step_off:.2f} s")
    print(f"step one_step {step_on:.2f} s (staleness {[r['sample_staleness'] for r in on]})")
    print(f"ratio off / one_step {step_off / step_on:.2f}x; one_step = "
          f"{step_on / max(rollout, update):.2f}x the longer phase (goal <= 1.15x: "
          f"{'met' if step_on <= goal else 'not met'})")


if __name__ == "__main__":
    main()
