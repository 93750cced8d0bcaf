"""DB hashes of one trajectory's decisions: a fresh replay per row vs one replay per trajectory.

The trajectory comes from the scripted world of ``tests/data/recompute_world.py`` (real tau2
train tasks, the oracle agent; collected here, nothing downloaded); the one with the most tool
traffic is kept and its first ``--max-decisions`` decisions are hashed both ways in one run:
``old``, :func:`prour.data.schema.tool_traffic_hash` of each decision's traffic (a fresh tau2
environment per row, what extraction did before) and ``new``,
:func:`prour.data.decision_states.decision_hashes` (the traffic replayed once, hashed at each decision).
Prints the best wall time of each over ``--repeats``, their ratio, and whether the hashes agree.

Usage: python benchmarks/extract_hash.py [--repeats 3] [--max-decisions 16]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout, no install
sys.path.insert(0, str(ROOT / "tests" / "data"))  # the scripted world

import recompute_world as world

from prour.config.data import DataConfig
from prour.data.collect import load_trajectories
from prour.data.decision_states import decision_hashes, decision_states
from prour.data.schema import tool_traffic_hash


def timed(ways: dict[str, Callable[[], list[str]]], repeats: int) -> dict[str, tuple[float, list]]:
    """Best wall time of each way over ``repeats`` rounds (the ways alternate within a round, so
    a change in the machine's load hits both), and each way's last result."""
    best: dict[str, tuple[float, list]] = {name: (float("inf"), []) for name in ways}
    for _ in range(repeats):
        for name, fn in ways.items():
            start = time.perf_counter()
            result = fn()
            best[name] = (min(best[name][0], time.perf_counter() - start), result)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-decisions", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        world.collect(Path(folder))
        trajectories = load_trajectories(Path(folder) / "traj.jsonl", "error")
    cfg = DataConfig(max_decisions=args.max_decisions)
    states = max((decision_states(t, cfg) for t in trajectories),
                 key=lambda s: len(s[-1].env_history))
    times = timed({"old": lambda: [tool_traffic_hash(s.domain, s.task_id, s.env_history)
                                   for s in states],
                   "new": lambda: decision_hashes(states)}, args.repeats)
    (old_s, old), (new_s, new) = times["old"], times["new"]
    first = states[0]
    print(f"trajectory {first.trajectory_id}: {len(states)} decisions, "
          f"{len(states[-1].env_history)} tool messages before the last")
    print(f"old (fresh replay per row):        {old_s:.3f} s ({old_s / len(states):.3f} s/row)")
    print(f"new (one replay per trajectory):   {new_s:.3f} s ({new_s / len(states):.3f} s/row)")
    print(f"ratio old/new: {old_s / new_s:.1f}x; hashes equal: {old == new}")


if __name__ == "__main__":
    main()
