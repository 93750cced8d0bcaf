"""What a flaky model server costs an evaluation in wall time: the same eval against a clean
server and against one that fails 5% of requests, in one run.

The task agent is served over HTTP by tests/flaky_openai.py with scripted logic behind it (it
calls a tool ``--tool-calls`` times, then closes the task; the scripted user stops when told
so), every answer taking ``--latency-s`` seconds as a model's generation would. The server runs
in a process of its own, as a model server does (in the evaluation's process the episodes'
threads would hold the interpreter lock it needs to answer). The same episodes
(the first ``--tasks`` retail test tasks x ``--seeds``, ``eval.concurrency`` ``--concurrency``)
run three times through ``prour.eval.harness``, each into a fresh folder: once untimed to warm
up (tau2's imports and caches), then against the server answering cleanly and against the same
server failing ``--rate`` of its requests (seeded, split equally between HTTP 500, a hang past
the client's ``--timeout-s``, a connection dropped mid-reply, and a latency spike of
``--spike-s``), retried by the client (``models.agent.max_retries`` ``--max-retries``, backoff
0.5 s doubling, with jitter). Printed: each run's wall time, their ratio, the faults the server
drew, what the client counted (attempts, failures by kind, their share, retries) and whether
both runs recorded the same outcome for every episode, each once.

Usage:
  python benchmarks/flaky_server.py [--tasks 30] [--seeds 0,1] [--concurrency 8] [--rate 0.05]
      [--latency-s 1] [--timeout-s 20] [--spike-s 5] [--max-retries 3] [--tool-calls 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout, no install
sys.path.insert(0, str(ROOT / "tests"))  # the flaky server

from flaky_openai import KINDS, FlakyServer, scripted_answer

USER = {"rules": [{"pattern": r"complete\.\s*\Z", "reply": "###STOP###"}],
        "default": "Hi, I need help with an item from my order."}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=30, help="first N retail test tasks")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--concurrency", type=int, default=8, help="eval.concurrency")
    parser.add_argument("--rate", type=float, default=0.05, help="share of requests that fail")
    parser.add_argument("--latency-s", type=float, default=1.0, help="every answer's time")
    parser.add_argument("--timeout-s", type=float, default=20.0, help="the client's time limit")
    parser.add_argument("--spike-s", type=float, default=5.0, help="a latency spike's extra time")
    parser.add_argument("--max-retries", type=int, default=3)
    parser.add_argument("--tool-calls", type=int, default=3, help="agent tool calls per episode")
    parser.add_argument("--seed", type=int, default=0, help="the server's fault seed")
    return parser.parse_args()


def agent(calls: int) -> Any:
    """A scripted agent that calls a tool until ``calls`` calls are in the conversation, then
    closes the task."""
    from prour.llm.scripted import ScriptedLLM

    def reply(messages: list[dict[str, Any]]) -> str:
        made = sum(len(m.get("tool_calls") or []) for m in messages if m["role"] == "assistant")
        if made < calls:
            return '<tool_call>{"name": "list_all_product_types", "arguments": {}}</tool_call>'
        return "Thank you. Your request is complete."

    return ScriptedLLM(rules=[(r"\A", reply)])


def recipe(run_dir: Path, url: str, args: argparse.Namespace, tasks: int) -> Any:
    import yaml

    from prour.recipes import load_recipe

    run_dir.mkdir(parents=True)
    user = run_dir / "user.yaml"
    user.write_text(yaml.safe_dump(USER))
    data = {
        "name": "flaky-server-bench", "run_dir": str(run_dir),
        "models": {"agent": {"backend": "openai", "base_url": url, "model": "m",
                             "max_concurrency": args.concurrency, "timeout_s": args.timeout_s,
                             "max_retries": args.max_retries},
                   "user": {"backend": "scripted", "script": str(user)}},
        "env": {"max_steps": 4 * args.tool_calls + 8},
        "eval": {"methods": ["base"], "domains": ["retail"], "split": "test", "max_tasks": tasks,
                 "seeds": [int(s) for s in args.seeds.split(",")],
                 "concurrency": args.concurrency, "judge": False, "max_error_fraction": 1.0},
    }
    path = run_dir.parent / f"{run_dir.name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_recipe(path)


def serve(args: argparse.Namespace, rates: dict[str, float], conn: Any) -> None:
    """The flaky server's process: sends its URL, serves until told to stop, then sends what
    it did (POSTs, faults by kind)."""
    answer = scripted_answer(agent(args.tool_calls))
    answer({"model": "m", "messages": [{"role": "user", "content": "hi"}]})  # its imports

    def slow(body: dict[str, Any]) -> dict[str, Any]:
        time.sleep(args.latency_s)
        return answer(body)

    with FlakyServer(slow, rates, seed=args.seed, hang_s=args.timeout_s + 2.0,
                     spike_s=args.spike_s) as server:
        conn.send(server.url)
        conn.recv()
        conn.send({"posts": server.posts, "faults": dict(server.faults)})


def timed(name: str, root: Path, args: argparse.Namespace, rates: dict[str, float],
          tasks: int) -> dict[str, Any]:
    """One evaluation against a server failing ``rates``: wall seconds, its result lines, its
    episodes' outcomes by key, the server's draws and the client's counts."""
    from prour.eval.harness import Evaluation
    from prour.llm import retry

    context = multiprocessing.get_context("spawn")
    conn, child = context.Pipe()
    process = context.Process(target=serve, args=(args, rates, child), daemon=True)
    process.start()
    try:
        url = conn.recv()
        run_dir = root / name
        evaluation = Evaluation(recipe(run_dir, url, args, tasks), run_dir, progress=False)
        before = retry.snapshot()
        t0 = time.perf_counter()
        try:
            lines = evaluation.run()
        finally:
            evaluation.close()
        wall = time.perf_counter() - t0
        counts = retry.since(before).get("agent", retry.RequestCounts())
        conn.send("stop")
        server = conn.recv()
    finally:
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
    stored = Counter()
    outcomes = {}
    for line in (run_dir / "episodes.jsonl").read_text().splitlines():
        episode = json.loads(line)
        key = (episode["domain"], episode["task_id"], episode["seed"])
        stored[key] += 1
        outcomes[key] = (episode["reward"], episode["termination"], len(episode["messages"]))
    return {"wall_s": wall, "lines": lines, "stored": stored, "outcomes": outcomes,
            "faults": server["faults"], "posts": server["posts"], "counts": counts}


def main() -> None:
    args = parse_args()
    share = args.rate / len(KINDS)
    rates = dict.fromkeys(KINDS, share)
    with tempfile.TemporaryDirectory(prefix="prour-flaky-bench-") as tmp:
        root = Path(tmp)
        timed("warm-up", root, args, {}, tasks=1)
        clean = timed("clean", root, args, {}, args.tasks)
        flaky = timed("flaky", root, args, rates, args.tasks)
    episodes = len(clean["lines"])
    print(f"retail, {args.tasks} tasks x seeds {args.seeds} = {episodes} episodes, "
          f"eval.concurrency {args.concurrency}, {args.tool_calls + 1} agent requests per "
          f"episode, each answer {args.latency_s:g} s; client timeout_s {args.timeout_s:g}, "
          f"max_retries {args.max_retries}")
    print(f"flaky server: {args.rate:.0%} of requests fail, {share:.2%} each of "
          + ", ".join(KINDS) + f" (spike {args.spike_s:g} s), seed {args.seed}")
    for name, result in (("clean", clean), ("flaky", flaky)):
        errored = sum(line["error"] for line in result["lines"])
        print(f"{name}: {result['wall_s']:.1f} s wall, {episodes} episodes ({errored} errored), "
              f"{episodes / result['wall_s'] * 60:.1f} episodes/min; server drew "
              f"{sum(result['faults'].values())} fault(s) in {result['posts']} POSTs "
              f"{result['faults'] or ''}")
        print(f"  client counted: {result['counts'].text()}")
    drawn = {"http": "http-500", "timeout": "timeout", "connection": "closed-mid-reply"}
    matched = all(getattr(r["counts"], kind) == r["faults"].get(fault, 0)
                  for r in (clean, flaky) for kind, fault in drawn.items())
    print(f"the client's failed attempts by kind are the faults the server drew, in both runs "
          f"(none from load): {'yes' if matched else 'NO'}")
    same = flaky["outcomes"] == clean["outcomes"]
    once = set(flaky["stored"].values()) == {1} and flaky["stored"] == clean["stored"]
    print(f"every episode stored once in both runs: {'yes' if once else 'NO'}; the same "
          f"outcome (reward, termination, messages) for every episode: {'yes' if same else 'NO'}")
    print(f"wall time flaky / clean: {flaky['wall_s'] / clean['wall_s']:.2f}x "
          f"(+{flaky['wall_s'] - clean['wall_s']:.1f} s)")


if __name__ == "__main__":
    main()
