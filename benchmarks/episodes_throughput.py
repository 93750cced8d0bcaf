"""Episode-runner throughput: episodes per minute at concurrency 1 and 8 over the openai backend.

The task agent (``LLMAgent``) and the user simulator (``LLMUser``) both talk to one
OpenAI-compatible server: either one you name with ``--base-url/--model``, or, with
``--start-server``, a vLLM CPU server started here on the tiny random Qwen3 (built with room for
the ~9k-token retail prompt). The same episodes (first N test tasks of the domain, one seed) run
twice, one at a time and then eight at a time, each including tau2's offline scoring; the script
prints both rates and their ratio, measured in this one run.

Usage:
  python benchmarks/episodes_throughput.py --start-server [--episodes 8] [--max-steps 6]
  python benchmarks/episodes_throughput.py --base-url http://127.0.0.1:8000/v1 --model NAME
(``--start-server`` needs the vLLM venv: ``make vllm-env`` or PROUR_VLLM_PYTHON)
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prour.config import EnvConfig, ModelConfig
from prour.env.agents import LLMAgent
from prour.env.domains import load_tasks
from prour.env.runner import EpisodeJob, run_episodes
from prour.env.users import LLMUser
from prour.llm.openai import OpenAILLM
from prour.llm.registry import build_llm

ROOT = Path(__file__).resolve().parents[1]
CONCURRENCIES = (1, 8)
SERVED_NAME = "tiny"
TINY_CONTEXT = 16384


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", help="OpenAI-compatible server, e.g. http://host:8000/v1")
    parser.add_argument("--model", help="served model name at --base-url")
    parser.add_argument(
        "--start-server",
        action="store_true",
        help="start a vLLM CPU server on the tiny model instead",
    )
    parser.add_argument("--domain", default="retail", choices=("retail", "airline", "telecom"))
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--max-steps", type=int, default=6, help="tau2 steps per episode (messages, tool-result batches)")
    parser.add_argument("--max-tokens", type=int, default=32, help="per generated message")
    parser.add_argument("--start-timeout", type=float, default=600.0, help="vLLM start-up, s")
    args = parser.parse_args()
    if not args.start_server and not (args.base_url and args.model):
        parser.error("give --base-url and --model, or --start-server")
    return args


@contextmanager
def endpoint(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    """``(base_url, model)`` of the server to measure; started (and stopped) here if asked."""
    if not args.start_server:
        yield args.base_url, args.model
        return
    from prour.cluster.vllm_server import VLLMServer
    from prour.demo.tiny import build_tiny_model

    python = os.environ.get("PROUR_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")
    with tempfile.TemporaryDirectory(prefix="prour-episodes-bench-") as tmp:
        model_dir = build_tiny_model(Path(tmp) / "tiny", seed=0, max_position=TINY_CONTEXT)
        server = VLLMServer(
            model_dir,
            python=python,
            served_name=SERVED_NAME,
            max_model_len=TINY_CONTEXT,
            # tool schemas in a chat request need a tool-call parser on the server (Qwen: hermes)
            extra_args=("--enable-auto-tool-choice", "--tool-call-parser", "hermes"),
        )
        server.start(timeout_s=args.start_timeout)
        try:
            yield server.base_url, SERVED_NAME
        finally:
            server.stop()


def episodes_per_minute(llm: OpenAILLM, concurrency: int, args: argparse.Namespace) -> float:
    """Run the benchmark episodes at ``concurrency``; return episodes per minute."""
    tasks = load_tasks(args.domain, "test")[: args.episodes]
    env = EnvConfig(agent_temperature=0.0, agent_max_tokens=args.max_tokens,
                    user_max_tokens=args.max_tokens)
    jobs = [
        EpisodeJob(
            args.domain,
            task,
            "llm",
            make_agent=lambda: LLMAgent(llm, env),
            make_user=lambda: LLMUser(llm, env),
        )
        for task in tasks
    ]
    start = time.perf_counter()
    trajs = run_episodes(jobs, concurrency=concurrency, progress=False,
                         limits=EnvConfig(max_steps=args.max_steps), retry_errors=False)
    minutes = (time.perf_counter() - start) / 60
    failed = [t for t in trajs if t.termination == "error"]
    if failed:
        raise RuntimeError(
            f"{len(failed)} of {len(trajs)} episodes failed at concurrency "
            f"{concurrency}; first: {failed[0].errors}"
        )
    return len(trajs) / minutes


def main() -> None:
    args = parse_args()
    with endpoint(args) as (base_url, model):
        llm = build_llm(ModelConfig(backend="openai", base_url=base_url, model=model,
                                    max_concurrency=max(CONCURRENCIES) * 2))
        try:
            rates = {c: episodes_per_minute(llm, c, args) for c in CONCURRENCIES}
        finally:
            llm.close()
    print(
        f"{args.episodes} {args.domain} test episodes, max_steps {args.max_steps}, "
        f"max_tokens {args.max_tokens}, model {model!r} at {base_url}"
    )
    for concurrency, rate in rates.items():
        print(f"concurrency {concurrency}: {rate:.2f} episodes/min")
    print(
        f"ratio ({CONCURRENCIES[1]} / {CONCURRENCIES[0]}): "
        f"{rates[CONCURRENCIES[1]] / rates[CONCURRENCIES[0]]:.2f}x"
    )


if __name__ == "__main__":
    main()
