"""Step time of verl's trainer without and with ``train.overlap: one_step``, in one run, on CPU.

verl 0.9.1's own trainer code through prour's rehearsal harness (``prour.train.verl_ext.
rehearsal``): verl's ``step`` and hooks as its ``fit`` calls them, our state-ordered trainers
(``StateOrderedTrainer`` for off, ``OneStepStateOrderedTrainer`` for one_step), our sampler on
verl's replay buffers, verl's agent-loop worker running our ``QueryAgentLoop`` and TransferQueue
on Ray. Stand-ins for the GPU side only: the rollout server takes ``--generate`` seconds per
sampled reply (vLLM decoding) and scores beliefs with a tiny random Qwen3, the strict user takes
``--latency`` seconds a call (a remote Qwen3-8B's round trip), and the engine's update is held
to ``--update`` seconds a step (verl's own dispatch and mini-batch loop run inside them).

The defaults are the paper run's step at 1 s = 38 s: the update measured at 76 s a step
(RESULTS.md) is 2.0 s; generation, not measured with vLLM, is put at ~25 s (16 x 8 samples of up
to 1,760 tokens decoded side by side), 0.65 s; the strict user at ~12 s a step (128 calls, 16 at a
time, ~1.5 s each), 0.32 s, i.e. 0.16 s a call over this run's two rounds of 16. Four states (not
16) keep the harness's own CPU work (TransferQueue, Ray, tensordicts: ~6-9 s a step for 16 states
on the shared 2-core machine) from swamping the stated times. Each mode runs ``--steps`` steps; the first is left out (warm-up; with overlap nothing rolled out ahead yet) and
each time is the median of the others. Prints the phases, both step times, their ratio and the
goal: the overlapped step within 1.15x the longer of rollout (the sessions' wall time, their
phase clocks shared where they run side by side) and update.

Usage: python benchmarks/verl_overlap_step.py [--update 2.0] [--generate 0.65] [--latency 0.16]
       [--steps 6] [--states 4] [--n 8] [--keep 6]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from overlap_step import SlowUser  # the local benchmark's strict user (benchmarks/ is on sys.path)

ASK = "<think>which one</think>YES [QUESTION]Which order do you want to return?[/QUESTION]"
RESPONDER_THREADS = 32  # the default executor of a worker on a many-core GPU node (min(32, cpus+4))


def rows(n: int) -> list[dict[str, Any]]:
    """``n`` clarify states of the data stage's schema with short prompts."""
    from prour.data.schema import Instance, tool_traffic_hash

    return [
        Instance(
            mode="clarify", domain="retail", task_id=str(i), trajectory_id=f"retail/{i}/s0/t",
            step=0, history=[{"role": "user", "content": "I want to return something."}],
            prompt=[{"role": "user", "content": "Ask the customer one question."}],
            target=f"Return the boots of order #W{1000 + i}.", au=0.4, eu=0.1, total=0.5,
            truncated=False, dropped_messages=0, prompt_tokens=16, target_tokens=8,
            decomposer_calls=3, prompts_version="bench", env_history=[],
            db_hash=tool_traffic_hash("retail", str(i), []),
        ).to_row(i)
        for i in range(n)
    ]


def slow_responders(latency: float) -> None:
    """The agent loops' responders: the slow strict user, no verifier (clarify states only)."""
    from prour.recipes import load_recipe
    from prour.rollout import StrictUserSimulator
    from prour.train.reward import Responders
    from prour.train.verl_ext import agent_loop

    def context(path: str) -> tuple[Any, Any]:
        recipe = load_recipe(path, endpoints=True)
        return recipe, Responders(StrictUserSimulator(SlowUser(latency), recipe.reward), None)

    agent_loop._run_context = context


def run(args: argparse.Namespace, model: Path, out: Path, overlap: str) -> list[dict[str, float]]:
    """``args.steps`` verl steps in ``overlap`` mode; verl's ``timing_s`` of each step."""
    from omegaconf import open_dict

    from prour.data.dataset import write_rows
    from prour.train.verl_ext.rehearsal import Harness, compose

    write_rows(rows(4 * args.states), out / "data/dataset/train.parquet")
    write_rows(rows(2), out / "data/dataset/validation.parquet")
    sets = [f"train.states_per_step={args.states}", f"train.rollout.n={args.n}",
            f"train.rollout.keep={args.keep}", f"train.overlap={overlap}"]
    config, _ = compose(model, out, sets)
    with open_dict(config):
        config.trainer.v1.sampler.sampler_kwargs.poll_interval = 0.1  # verl: 2 s (100 s steps)
    harness = Harness(config, model, lambda _text: ASK, update_s=args.update)
    harness.loop.set_default_executor(ThreadPoolExecutor(RESPONDER_THREADS))
    harness.server.generate_s = args.generate
    timings = []
    try:
        for _ in range(args.steps):
            _batch, metrics = harness.step()
            phases = {k.removeprefix("training/prour/time_").removesuffix("_s"): v
                      for k, v in metrics.items() if k.startswith("training/prour/time_")}
            timings.append({**harness.timing_raw, **{f"phase_{k}": v for k, v in phases.items()}})
    finally:
        harness.close()
    staleness = [
        sorted({g - 1 - v for v in handed})
        for g, handed in enumerate(harness.trainer.actor_rollout_wg.versions, start=1)
    ]
    print(f"  {overlap}: step seconds {[round(t['step'], 2) for t in timings]}, "
          f"staleness per update {staleness}", flush=True)
    return timings[1:]


def median(timings: list[dict[str, float]], *keys: str) -> float:
    """The median over the measured steps of the summed ``keys`` (a shared machine's load
    spikes single steps)."""
    return statistics.median(sum(t.get(k, 0.0) for k in keys) for t in timings)


def ray_and_transfer_queue(model: Path, out: Path) -> None:
    """Ray on two CPUs and TransferQueue with one storage unit (as the harness tests), and the
    one-rank gloo group verl's mini-batch loop all-gathers over."""
    import ray
    import torch.distributed as dist
    import transfer_queue as tq
    from omegaconf import OmegaConf
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    from prour.data.dataset import write_rows
    from prour.train.verl_ext.rehearsal import compose

    setup = out / "setup"  # a run folder for the composed config only
    write_rows(rows(2), setup / "data/dataset/train.parquet")
    write_rows(rows(2), setup / "data/dataset/validation.parquet")
    config, _ = compose(model, setup, [])
    env = OmegaConf.merge(get_ppo_ray_runtime_env(config), config.ray_kwargs.ray_init.runtime_env)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env=OmegaConf.to_container(env))
    tq.init(OmegaConf.merge(
        config.transfer_queue, {"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}
    ))
    dist.init_process_group("gloo", init_method=f"file://{out / 'pg'}", rank=0, world_size=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", type=float, default=2.0, help="engine seconds per update")
    parser.add_argument("--generate", type=float, default=0.65, help="seconds per sampled reply")
    parser.add_argument("--latency", type=float, default=0.16, help="seconds per responder call")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--states", type=int, default=4)
    parser.add_argument("--n", type=int, default=8, help="sessions sampled per state")
    parser.add_argument("--keep", type=int, default=6, help="kept per state (the update's)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    import ray
    import torch.distributed as dist
    import transfer_queue as tq

    from prour.demo.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "tiny", seed=0)
        ray_and_transfer_queue(model, Path(tmp))
        slow_responders(args.latency)
        try:
            off = run(args, model, Path(tmp) / "off", "off")
            on = run(args, model, Path(tmp) / "on", "one_step")
        finally:
            dist.destroy_process_group()
            tq.close()
            ray.shutdown()
    update = median(off, "update_actor")
    sessions = [f"phase_{k}" for k in ("generation", "strict_user", "verifier", "prior", "posterior")]
    rollout = median(off, *sessions)  # the sessions' wall time (their phases shared, not summed)
    submit_to_batch = median(off, "step") - median(off, "update_actor", "update_weights")
    step_off, step_on = median(off, "step"), median(on, "step")
    goal = 1.15 * max(rollout, update)
    print(f"verl {args.states} states x {args.n} sessions (keep {args.keep}), reply "
          f"{args.generate:.2f} s, responder {args.latency:.2f} s a call, engine update "
          f"{args.update:.2f} s, {args.steps - 1} measured steps per mode")
    print(f"rollout (the sessions: generation, responder, scoring; overlap off) {rollout:.2f} s "
          f"({submit_to_batch:.2f} s from submission to the sampled batch, with verl's sampling and "
          f"the harness's bookkeeping), update (verl's update_actor) {update:.2f} s")
    phases = sorted(k for k in off[0] if k.startswith("phase_") and k != "phase_step")
    print("phases, overlap off (the sessions' own clocks): " + ", ".join(
        f"{k.removeprefix('phase_')} {median(off, k):.2f} s" for k in phases))
    print(f"step off      {step_off:.2f} s")
    print(f"step one_step {step_on:.2f} s = sampling {median(on, 'gen'):.2f} s + update "
          f"{median(on, 'update_actor'):.2f} s + waiting for the next batch "
          f"{median(on, 'overlap_drain'):.2f} s + weight sync {median(on, 'update_weights'):.2f} s + "
          f"the rest {step_on - median(on, 'gen', 'update_actor', 'overlap_drain', 'update_weights'):.2f} s")
    print(f"ratio off / one_step {step_off / step_on:.2f}x; one_step = "
          f"{step_on / max(rollout, update):.2f}x the longer phase (goal <= 1.15x: "
          f"{'met' if step_on <= goal else 'not met'})")


if __name__ == "__main__":
    main()
