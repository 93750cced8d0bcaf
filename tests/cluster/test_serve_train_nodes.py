"""Serving on one node, training on another (issue 27 item 3), on the two-node Slurm of
prour.cluster.nodes: `prour slurm submit --stages serve` pinned to node1 starts the vLLM CPU
server of the tiny model bound to every interface of node1; `prour slurm submit --stages train`
pinned to node2 (serve.colocate_train: false) starts no server of its own, waits for the run's
endpoints file and trains one step whose strict-user requests node1's server answers. From
node2, a request without the run's key is refused (401) and one with it is answered.

Root (namespaces, Slurm) and the vLLM venv; PROUR_REQUIRE_SLURM=1 / PROUR_REQUIRE_VLLM=1 make a
missing one fail instead of skip.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import alive, write_recipe
from test_slurm_local import REPO, job_logs, scontrol, wait_done

pytestmark = [pytest.mark.slurm, pytest.mark.vllm, pytest.mark.slow]

PROMPT = "Ask me one question."
QUESTION = "YES [QUESTION]Which size do you want?[/QUESTION]"  # the query format, well formed
TIMEOUT_S = 400
# a chat request sent from node2 with or without the key; prints the HTTP status and the reply
REQUEST = """
import json, sys, urllib.error, urllib.request
url, key = sys.argv[1], sys.argv[2]
body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
        "temperature": 0}
request = urllib.request.Request(url + "/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
if key:
    request.add_header("Authorization", "Bearer " + key)
try:
    with urllib.request.urlopen(request, timeout=120) as answer:
        print(answer.status, json.dumps(json.loads(answer.read())["choices"][0]["message"]))
except urllib.error.HTTPError as exc:
    print(exc.code, exc.read().decode()[:200])
"""


def asking_policy(model_dir: Path, out_dir: Path) -> Path:
    """The tiny model taught to answer PROMPT with QUESTION, so that the step's samples are
    questions the strict user answers (the reward calls no responder for a malformed one). It is
    the served strict user too: the untaught tiny model's replies came back empty (finish=length),
    which leaves the step no reward to learn from."""
    from tiny_finetune import learned_by_heart

    from prour.demo.corpus import SFTExample

    example = SFTExample("format", [{"role": "user", "content": PROMPT}],
                         {"role": "assistant", "content": QUESTION}, enable_thinking=True)
    return learned_by_heart(model_dir, out_dir, [example], steps=30, max_tokens=256)


def train_file(path: Path) -> Path:
    """One clarify state with a short prompt (the data stage's schema)."""
    from prour.data.dataset import write_rows
    from prour.data.schema import Instance, tool_traffic_hash

    row = Instance(
        mode="clarify", domain="retail", task_id="0", trajectory_id="retail/0/s0/t", step=0,
        history=[{"role": "user", "content": "hi"}], prompt=[{"role": "user", "content": PROMPT}],
        target="I want to return order #W1000.", au=0.4, eu=0.1, total=0.5, truncated=False,
        dropped_messages=0, prompt_tokens=16, target_tokens=8, decomposer_calls=3,
        prompts_version="test", env_history=[], db_hash=tool_traffic_hash("retail", "0", []),
    ).to_row(0)
    return write_rows([row], path)


def nodes_recipe(tmp_path: Path, run_dir: Path, vllm_python: Path, served: Path,
                 policy: Path) -> Path:
    """Generator in process, strict user served by the tiny model's vLLM server elsewhere."""
    return write_recipe(tmp_path / "nodes.yaml", {
        "name": "nodes",
        "seed": 0,
        "run_dir": str(run_dir),
        "models": {
            "generator": {"backend": "hf", "path": str(policy), "device": "cpu",
                          "dtype": "float32", "max_model_len": 1024},
            "strict_user": {"backend": "openai", "model": "tiny", "max_retries": 1,
                            "timeout_s": 120},
        },
        "reward": {"responder_max_tokens": 16, "verifier_max_steps": 1},
        "train": {"backend": "local", "val_file": None, "states_per_step": 1, "total_steps": 1,
                  "save_every": 1, "device": "cpu", "dtype": "float32",
                  "gradient_checkpointing": False,
                  "rollout": {"n": 2, "keep": 2, "max_response_tokens": 24},
                  "ppo": {"epochs": 1, "mini_batch_states": 1, "micro_batch_size": 1},
                  "wandb": {"track": False}},
        "serve": {"host": "0.0.0.0", "colocate_train": False, "python": str(vllm_python),
                  "startup_timeout_s": 300,
                  "models": {"tiny": {"path": str(served), "dtype": "float32",
                                      "enforce_eager": True, "max_model_len": 1024,
                                      "reasoning_parser": None}}},
        "slurm": {"defaults": {"cpus_per_task": 1, "mem": "1G", "gpus_per_node": 0,
                               "time": "00:20:00"},
                  "serve": {"nodelist": "node1"}, "train": {"nodelist": "node2"}},
    })


def submit(cluster: Any, recipe: Path, run_dir: Path, stage: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "prour.cli.main", "slurm", "submit", "--recipe", str(recipe),
         "--stages", stage, "--run-dir", str(run_dir)],
        cwd=REPO, env=cluster.env(), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads((run_dir / "slurm_jobs.json").read_text())


def chat_posts(log: Path) -> list[tuple[str, str]]:
    """(client address, HTTP status) of each chat request in a vLLM server's access log."""
    return re.findall(r"(\d+\.\d+\.\d+\.\d+):\d+ - \"POST /v1/chat/completions HTTP/1.1\" (\d+)",
                      log.read_text())


def from_node2(cluster: Any, base_url: str, key: str) -> tuple[int, str]:
    done = subprocess.run(cluster.in_node("node2", [sys.executable, "-c", REQUEST, base_url, key]),
                          capture_output=True, text=True, timeout=150, check=False)
    assert done.returncode == 0, done.stderr
    status, _, reply = done.stdout.strip().partition(" ")
    return int(status), reply


def test_served_on_node1_trained_on_node2_through_the_endpoints_file_with_the_runs_key(
    slurm_cluster: Any, vllm_python: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from prour.cluster.nodes import MultiNodeSlurm

    policy = asking_policy(tiny_model_dir, tmp_path / "policy")
    run_dir = tmp_path / "run"
    train_file(run_dir / "data" / "dataset" / "train.parquet")
    recipe = nodes_recipe(tmp_path, run_dir, vllm_python, policy, policy)
    cluster = MultiNodeSlurm(tmp_path / "cluster", count=2)
    cluster.start()
    daemons = [proc.pid for proc in cluster._procs.values()]
    serve_job = None
    server_pid = None
    try:
        nodes = cluster.nodes()
        serve_job = submit(cluster, recipe, run_dir, "serve")["stages"][0]["job_id"]
        manifest = submit(cluster, recipe, run_dir, "train")
        train_job = manifest["stages"][0]["job_id"]
        wait_done(cluster, manifest, TIMEOUT_S)
        # each job on the node its recipe pins it to (slurm.<stage>.nodelist)
        assert " NodeList=node1 " in scontrol(cluster, serve_job)
        assert " NodeList=node2 " in scontrol(cluster, train_job)
        train_log = Path(manifest["stages"][0]["log"]).read_text()
        endpoints = json.loads((run_dir / "endpoints.json").read_text())
        server = endpoints["servers"]["tiny"]
        server_pid = server["pid"]
        # served on node1's own address (the shared hostname names no node), the key by file
        assert server["base_url"] == f"http://{nodes['node1']}:{server['port']}/v1", endpoints
        assert endpoints["key_file"] == str(run_dir / "secrets" / "api-key")
        status = (run_dir / "slurm" / "status" / "train").read_text()
        assert "rc=0" in status and "== train: done" in train_log, train_log + job_logs(run_dir)
        assert f"using the servers of `prour serve` on {endpoints['node']}: tiny at " \
               f"{server['base_url']}" in train_log, train_log
        assert "serving for train" not in train_log  # the train job started no server
        metrics = [json.loads(line) for line in
                   (run_dir / "checkpoints" / "metrics.jsonl").read_text().splitlines()]
        assert [m["step"] for m in metrics] == [1]
        calls = metrics[0]["strict_user_calls"]
        assert calls > 0 and metrics[0]["reward_mean"] is not None, metrics  # answers scored
        # the server's access log: every strict-user request came from node2's address
        served_log = Path(server["log"])
        assert served_log.parent == run_dir / "serve"
        assert chat_posts(served_log) == [(nodes["node2"], "200")] * calls

        key = (run_dir / "secrets" / "api-key").read_text().strip()
        assert from_node2(cluster, server["base_url"], "")[0] == 401
        code, reply = from_node2(cluster, server["base_url"], key)
        assert code == 200 and json.loads(reply)["role"] == "assistant", reply
        assert chat_posts(served_log)[calls:] == [(nodes["node2"], "401"), (nodes["node2"], "200")]
    finally:
        try:
            if serve_job is not None:  # the batch script forwards TERM to `prour serve`
                subprocess.run(["scancel", "--batch", "--signal=TERM", serve_job],
                               env=cluster.env(), timeout=30, check=False)
                wait_done(cluster, {"stages": [{"job_id": serve_job}],
                                    "run_dir": str(run_dir)}, 120)
        finally:
            cluster.stop()
    assert json.loads((run_dir / "endpoints.json").read_text())["status"] == "stopped"
    assert server_pid is None or not alive(server_pid)
    assert cluster.network.leftovers() == []
    assert [pid for pid in daemons if alive(pid)] == []
