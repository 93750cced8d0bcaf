"""One role served by two real vLLM CPU replicas (needs .venv-vllm): both take requests, and an
evaluation goes on when one of them is killed mid-run.

The tiny model is served with ``replicas: 2`` (``prour.cluster.serve``: two processes, two
ports, one endpoints entry listing both); the evaluation's agent and user find both URLs in the
endpoints file and their client spreads requests over them. Once each replica has answered
requests and episodes are still to run, one replica is killed with SIGKILL: its requests in
flight and every later one go to the other, so every episode is recorded once and none errs.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from cluster_helpers import alive, write_recipe

from prour.cluster.endpoints import endpoints_path, write_endpoints
from prour.cluster.serve import ServerGroup, plan_servers
from prour.llm.run_key import ensure_run_key
from prour.recipes import load_recipe

# `full`: two vLLM servers and a timed kill (1.5-4.5 min); in the CI suite its short eval has
# ended before the kill on a loaded machine. CI keeps the replicas' serving, listing and client
# spreading (tests/cluster/test_replicas.py, tests/llm/test_openai_replicas.py).
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.full, pytest.mark.timeout(2400)]

START_TIMEOUT_S = float(os.environ.get("PROUR_VLLM_START_TIMEOUT", "600"))  # per replica, on a busy CPU
CONTEXT = 16384  # the agent's tau2 policy and tools in the tiny model's tokens fit this
TASKS, SEEDS = 8, [0, 1]  # 16 episodes, two at a time: the kill falls well inside the run


def served_requests(base_url: str) -> float:
    """Requests the server has finished (``vllm:request_success_total``, all label sets)."""
    root = base_url.rsplit("/v1", 1)[0]
    with urllib.request.urlopen(f"{root}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(float(m.group(1)) for m in re.finditer(
        r"^vllm:request_success_total(?:\{[^}]*\})? ([0-9.eE+-]+)$", text, re.MULTILINE))


def recipes(tmp_path: Path, python: Path, model: Path) -> tuple[Path, Path]:
    """The serving recipe (the tiny model as two replicas) and the one the evaluation reads
    (the same without its serve section: its roles take their URLs from the endpoints file)."""
    base = {
        "name": "two-replicas",
        "run_dir": str(tmp_path / "run"),
        "models": {role: {"backend": "openai", "model": "tiny", "max_model_len": CONTEXT,
                          "timeout_s": 300, "max_retries": 2} for role in ("agent", "user")},
        "env": {"max_steps": 10, "agent_max_tokens": 32, "user_max_tokens": 32},
        "eval": {"methods": ["base"], "domains": ["retail"], "split": "test",
                 "max_tasks": TASKS, "seeds": SEEDS, "concurrency": 2, "judge": False},
    }
    serving = {**base, "serve": {"python": str(python), "startup_timeout_s": START_TIMEOUT_S,
                                 "models": {"tiny": {
                                     "path": str(model), "dtype": "float32",
                                     "enforce_eager": True, "max_model_len": CONTEXT,
                                     "replicas": 2, "max_num_seqs": 4}}}}
    return (write_recipe(tmp_path / "serving.yaml", serving),
            write_recipe(tmp_path / "eval.yaml", base))


def test_an_eval_survives_one_of_two_replicas_dying(vllm_python: Path, tmp_path: Path) -> None:
    from prour.demo.tiny import build_tiny_model
    from prour.env.trajectory import read_jsonl, read_trajectories
    from prour.eval.harness import EPISODES_FILE, Evaluation

    model = build_tiny_model(tmp_path / "tiny", seed=0, max_position=CONTEXT)
    serving, stage = recipes(tmp_path, vllm_python, model)
    loaded = load_recipe(serving, cluster=True)
    (plan,) = plan_servers(loaded)
    assert len(plan.specs) == 2
    group = ServerGroup([plan], loaded.serve.python, loaded.serve.startup_timeout_s,
                        loaded.models_dir, ensure_run_key(loaded.resolved_run_dir()))
    try:
        group.start(threading.Event())
        record = group.record("ready")
        write_endpoints(endpoints_path(loaded), record)
        copies = record["servers"]["tiny"]["replicas"]
        urls, pids = [c["base_url"] for c in copies], [c["pid"] for c in copies]
        resolved = load_recipe(stage, endpoints=True)
        agent = resolved.models["agent"]
        assert (agent.base_url, agent.replica_urls, agent.server_slots) == (urls[0], [urls[1]], 8)

        out = tmp_path / "run" / "eval"
        outcome: dict = {}

        def evaluate() -> None:
            evaluation = Evaluation(resolved, out, progress=False)
            try:
                outcome["lines"] = evaluation.run()
            except BaseException as exc:  # noqa: BLE001 - looked at below
                outcome["error"] = exc
            finally:
                evaluation.close()

        thread = threading.Thread(target=evaluate, daemon=True)
        thread.start()
        total = TASKS * len(SEEDS)
        deadline = time.monotonic() + 1200
        before: list[float] = []
        while time.monotonic() < deadline and thread.is_alive():
            before = [served_requests(url) for url in urls]
            done = len(read_jsonl(out / EPISODES_FILE)) if (out / EPISODES_FILE).exists() else 0
            if min(before) >= 1 and 1 <= done < total - 2:
                break
            time.sleep(0.2)
        assert thread.is_alive(), f"the eval ended before the kill: {outcome}"
        assert min(before) >= 1, f"a replica got no request before the kill: {before}"
        os.killpg(pids[1], signal.SIGKILL)
        killed_at = len(read_jsonl(out / EPISODES_FILE))
        thread.join(1200)
        assert not thread.is_alive(), "the eval did not finish after the kill"
        assert "error" not in outcome, repr(outcome.get("error"))
        assert not alive(pids[1], settle_s=1.0) and alive(pids[0], settle_s=0.0)
        lines = outcome["lines"]
        keys = [tuple(line["key"]) for line in lines]
        assert len(lines) == total and len(set(keys)) == total
        assert not [line["key"] for line in lines if line["termination"] == "error"]
        episodes = [tuple(t.key) for t in read_trajectories(out / EPISODES_FILE)]
        assert sorted(episodes) == sorted(keys)  # every episode recorded once
        assert killed_at < total  # the kill fell mid-run
        assert served_requests(urls[0]) > before[0]  # the survivor took the rest
        assert any(line["model_tokens"].get("agent.completion") for line in lines)
    finally:
        group.stop()
