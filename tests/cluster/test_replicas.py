"""A served model run as several replicas, with a stand-in vLLM (seconds): each copy its own
process, port, log and GPUs; the endpoints file lists them and the requests they run at once;
a role reads every copy's URL from it; the model is down only once every copy is; and `prour
run` restarts a server that a step sizes otherwise."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

from cluster_helpers import alive, write_recipe

from prour.cluster.endpoints import read_endpoints
from prour.cluster.serve import ReplicaSet, plan_servers, resized_servers, serve, vllm_server
from prour.eval.queue import lane_limits
from prour.llm.registry import client_concurrency, lane_name
from prour.recipes import load_recipe
from prour.stages import get_step

PAPER = Path(__file__).resolve().parents[2] / "recipes" / "paper.yaml"


def recipe(tmp_path: Path, python: Path) -> Path:
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")
    return write_recipe(tmp_path / "recipe.yaml", {
        "name": "copies",
        "run_dir": str(tmp_path / "run"),
        "models": {"user": {"backend": "openai", "model": "tiny"},
                   "judge": {"backend": "openai", "model": "tiny"}},
        "eval": {"concurrency": 16},
        "serve": {"python": str(python), "startup_timeout_s": 30, "models": {
            "tiny": {"path": str(folder), "replicas": 2, "max_num_seqs": 5}}},
    })


def wait_ready(path: Path, timeout_s: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        record = read_endpoints(path)
        if record and record["status"] == "ready":
            return record
        time.sleep(0.05)
    raise AssertionError(f"{path} never got ready: {read_endpoints(path)}")


def test_two_copies_are_served_listed_and_reached(tmp_path: Path, fake_vllm_python: Path) -> None:
    """replicas: 2 of a server without gpus: two processes on two ports, each with its log; the
    record's slots are 2 x max_num_seqs 5 = 10; a role reads the second copy's URL and those
    slots, so its client keeps 10 in flight (above the default 8) and eval's queue holds the
    model at 10 (below eval.concurrency 16). One copy killed: the model still serves; both:
    the server is named dead."""
    path = recipe(tmp_path, fake_vllm_python)
    loaded = load_recipe(path, cluster=True)
    stop = threading.Event()
    outcome: dict = {}

    def body() -> None:
        try:
            serve(loaded, stop, poll_s=0.1)
        except Exception as exc:  # noqa: BLE001 - looked at below
            outcome["error"] = exc

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    try:
        record = wait_ready(tmp_path / "run" / "endpoints.json")
        server = record["servers"]["tiny"]
        copies = server["replicas"]
        assert len(copies) == 2 and server["slots"] == 10
        assert copies[0]["base_url"] == server["base_url"] != copies[1]["base_url"]
        assert copies[0]["log"].endswith("tiny.log") and copies[1]["log"].endswith(
            "tiny.replica2.log")
        assert all(alive(copy["pid"]) for copy in copies)
        resolved = load_recipe(path, endpoints=True)
        user = resolved.models["user"]
        assert (user.base_url, user.replica_urls, user.server_slots) == (
            copies[0]["base_url"], [copies[1]["base_url"]], 10)
        assert client_concurrency(user) == 10
        assert lane_limits(resolved, ["user", "judge"]) == {lane_name(user): 10}
        os.killpg(copies[1]["pid"], signal.SIGKILL)
        time.sleep(0.5)
        assert thread.is_alive() and "error" not in outcome  # the other copy serves on
        os.killpg(copies[0]["pid"], signal.SIGKILL)
        thread.join(15)
        assert not thread.is_alive()
        assert "server 'tiny'" in str(outcome["error"]) and "exited while serving" in str(
            outcome["error"])
    finally:
        stop.set()
        thread.join(15)


def test_each_copy_of_a_step_carries_its_own_gpus_share_and_limit(tmp_path: Path) -> None:
    """paper.yaml's eval step: the 8B's first copy on GPU 1 at 0.94 with 103 requests at once,
    the second on GPU 0 at 0.55 with 48 (test_sizing.py works them out), each on a port and in a
    log of its own; posthoc, without the generator and IG-Clarifier beside it, sizes the GPU 0
    copy otherwise (0.94), so `prour run` restarts the 8B between them, and keeps it from eval
    to eval-budget only where the sizes agree."""
    run = tmp_path / "run"
    checkpoint = run / "checkpoints" / "step_2010"  # what export writes: the 1.7B's config
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text(json.dumps({
        "hidden_size": 2048, "num_hidden_layers": 28, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
        "intermediate_size": 6144, "tie_word_embeddings": True}))
    loaded = load_recipe(PAPER, [f"run_dir={run}"], cluster=True)
    eval_step = get_step("eval")
    plans = {p.model_id: p for p in plan_servers(loaded, step=eval_step)}
    eight = plans["Qwen/Qwen3-8B"]
    assert plans["exported-generator"].spec.gpu_memory_utilization == 0.33
    assert len(eight.specs) == 2
    first, second = (vllm_server(eight, None, strict=False, replica=i) for i in (0, 1))
    for server, gpu, share, seqs in ((first, "1", "0.94", "103"), (second, "0", "0.55", "48")):
        command = server.command()
        assert server.env["CUDA_VISIBLE_DEVICES"] == gpu
        assert command[command.index("--gpu-memory-utilization") + 1] == share
        assert command[command.index("--max-num-seqs") + 1] == seqs
    assert first.port != second.port and second.log_path.name == "Qwen_Qwen3-8B.replica2.log"

    class Group:  # what the runner keeps of a started server: its plan
        def __init__(self, plan):
            self.plans = {plan.model_id: plan}

    running = {"Qwen/Qwen3-8B": Group(eight)}
    assert resized_servers(loaded, get_step("posthoc"), running) == {"Qwen/Qwen3-8B"}
    budget = get_step("eval-budget")
    budget_plan = {p.model_id: p for p in plan_servers(loaded, step=budget)}["Qwen/Qwen3-8B"]
    assert resized_servers(loaded, budget, {"Qwen/Qwen3-8B": Group(budget_plan)}) == set()


def test_a_replica_set_answers_with_a_live_copy(tmp_path: Path, fake_vllm_python: Path) -> None:
    """The set's PID is a live copy's while one runs (what the runner's check of a dead server
    reads), the first copy's once none does; stop stops both."""
    loaded = load_recipe(recipe(tmp_path, fake_vllm_python), cluster=True)
    (plan,) = plan_servers(loaded)
    copies = ReplicaSet([vllm_server(plan, str(fake_vllm_python), replica=i) for i in (0, 1)])
    copies.start(timeout_s=30)
    try:
        pids = [copy.pid for copy in copies.replicas]
        os.killpg(pids[0], signal.SIGKILL)
        copies.replicas[0]._process.wait(10)  # reaped: gone, not a zombie
        assert copies.pid == pids[1]
    finally:
        copies.stop()
    assert not any(alive(pid) for pid in pids)
