"""verl's trainer across two Slurm nodes over Ray: `prour slurm submit` of a recipe with
``train.verl.nnodes=2`` renders ``train_multinode.sbatch``, whose Ray head runs on node 1 and a
Ray worker on node 2 (each node a network namespace, :mod:`prour.cluster.nodes`), and the job's
`prour train` runs the CPU rehearsal of the verl trainer (``train.verl.engine: cpu_rehearsal``)
against that cluster: one policy rank per node, real updates, checkpoints, metrics.

Root only (as CI runs); the single-node session cluster is requested first (it installs Slurm
and owns munged, which both clusters share).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import alive

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
JOB_TIMEOUT_S = 420
RESPONDER = "rules:\n  - pattern: '.'\n    reply: 'The blue one, size M.'\n"


def sets(run_dir: Path, model: Path, steps: int) -> list[str]:
    """The paper recipe on the tiny model, verl backend on the CPU rehearsal engine, 2 nodes."""
    return [
        f"run_dir={run_dir}",
        f"models.generator.path={model}",
        "models.strict_user.backend=scripted",
        f"models.strict_user.script={run_dir / 'strict_user.yaml'}",
        "reward.responder_retries=0",
        "train.backend=verl",
        "train.verl.engine=cpu_rehearsal",
        "train.verl.nnodes=2",
        "train.verl.n_gpus_per_node=1",
        "train.states_per_step=2",
        "train.rollout.n=2",
        "train.rollout.keep=2",
        "train.rollout.max_response_tokens=8",
        "train.ppo.epochs=1",
        "train.optim.lr=1e-3",
        "train.optim.warmup_steps=0",
        f"train.total_steps={steps}",
        "slurm.defaults.cpus_per_task=2",
        "slurm.defaults.mem=2G",
        "slurm.defaults.gpus_per_node=0",
        "slurm.defaults.time=00:15:00",
        "slurm.ray_object_store_mb=128",
        # prour's training alone: the ig-clarifier's (the train stage's other step) needs its own
        # every-state dataset, which the hand-written rows here do not include
        'eval.methods=["base", "prour"]',
    ]


def prour(cluster: Any, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "prour.cli.main", *args], cwd=REPO,
                          env=cluster.env(), capture_output=True, text=True, timeout=timeout,
                          check=False)


def submit(cluster: Any, run_dir: Path, overrides: list[str]) -> str:
    """`prour slurm submit --stages train`; the job id."""
    options = [part for item in overrides for part in ("--set", item)]
    done = prour(cluster, "slurm", "submit", "--recipe", str(REPO / "recipes" / "paper.yaml"),
                 "--stages", "train", "--run-dir", str(run_dir), *options)
    assert done.returncode == 0, done.stdout + done.stderr
    manifest = json.loads((run_dir / "slurm_jobs.json").read_text())
    return str(manifest["stages"][-1]["job_id"])


def job_log(run_dir: Path, job: str) -> Path:
    return run_dir / "slurm" / "logs" / f"train-{job}.out"


def wait_job(cluster: Any, job: str, timeout_s: float = JOB_TIMEOUT_S) -> str:
    """The job's final state (sacct-free: scontrol while it is known, then the status file)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        shown = subprocess.run(["scontrol", "show", "job", "-o", job], env=cluster.env(),
                               capture_output=True, text=True, timeout=30, check=False).stdout
        state = re.search(r"JobState=(\S+)", shown)
        if state and state.group(1) not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            return state.group(1)
        time.sleep(2)
    raise AssertionError(f"job {job} still running after {timeout_s} s")


def ray_pids(job: str) -> list[int]:
    """PIDs of processes whose command line names this job's Ray folder (/tmp/ray-<job>-<pid>)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"/tmp/ray-{job}-" in cmd:
            found.append(int(proc.name))
    return found


def ranks(log: str) -> dict[int, tuple[str, str, int]]:
    """rank -> (node, address, pid) from the rehearsal's lines."""
    found = re.findall(r"^\[rehearsal\] rank (\d+) on node (\S+) (\S+) \(pid (\d+)\)", log,
                       re.MULTILINE)
    return {int(r): (node, addr, int(pid)) for r, node, addr, pid in found}


def weights(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


@pytest.fixture(scope="module")
def two_nodes(slurm_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from prour.cluster.nodes import MultiNodeSlurm

    cluster = MultiNodeSlurm(tmp_path_factory.mktemp("mnverl") / "cluster", count=2)
    cluster.start()
    daemons = [proc.pid for proc in cluster._procs.values()]
    cluster.jobs: list[str] = []
    try:
        yield cluster
    finally:
        cluster.stop()
    assert cluster.network.leftovers() == []
    assert [pid for pid in daemons if alive(pid)] == []
    assert [pid for job in cluster.jobs for pid in ray_pids(job) if alive(pid)] == []


def prepare(run_dir: Path) -> None:
    sys.path.insert(0, str(REPO / "tests" / "train"))
    from train_helpers import instance_rows

    from prour.data.dataset import write_rows

    write_rows(instance_rows(4), run_dir / "data/dataset/train.parquet")
    write_rows(instance_rows(6)[4:], run_dir / "data/dataset/validation.parquet")  # other tasks
    (run_dir / "strict_user.yaml").write_text(RESPONDER)


def test_verls_trainer_runs_on_two_nodes_and_updates_the_model(
    two_nodes: Any, warm_tiny_model: Path, tmp_path: Path
) -> None:
    import torch

    run_dir = tmp_path / "run"
    prepare(run_dir)
    job = submit(two_nodes, run_dir, sets(run_dir, warm_tiny_model, steps=2))
    two_nodes.jobs.append(job)
    state = wait_job(two_nodes, job)
    log = job_log(run_dir, job).read_text() if job_log(run_dir, job).exists() else ""
    assert state == "COMPLETED", log[-6000:] + two_nodes.log_tail()
    assert "all 2 node(s) joined Ray" in log
    nodes = two_nodes.nodes()
    assert re.search(r"Ray cluster of 2 node\(s\): " + re.escape(
        ", ".join(sorted(nodes.values()))), log), log[-3000:]
    placed = ranks(log)
    assert {r: placed[r][:2] for r in placed} == {0: ("node1", nodes["node1"]),
                                                   1: ("node2", nodes["node2"])}
    # each actor said it itself, from its own process (Ray prefixes the actor's lines)
    for rank, (node, addr, pid) in placed.items():
        assert re.search(rf"\(PolicyRank pid={pid}[^)]*\)\S* rank {rank} on node {node} "
                         rf"{re.escape(addr)} \(pid {pid}\)", log), (rank, log[-3000:])
    out = run_dir / "checkpoints"
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for record in records:  # each optimizer mini-batch one state, on both ranks (checked there)
        assert record["mini_batches"] == 2 and record["actor/grad_norm"] > 0
    initial, final = weights(warm_tiny_model), weights(out / "step_2")
    changed = [k for k in initial if not torch.equal(initial[k], final[k])]
    assert changed, "two steps left every weight as it was"
    # both ranks held the same weights after each step (each rank's digest in the log)
    for step, record in enumerate(records, start=1):
        shown = re.search(rf"step {step} weights: rank 0 (\w+), rank 1 (\w+)", log)
        assert shown and shown.group(1) == shown.group(2) == record["weights_sha256"]
    assert records[0]["weights_sha256"] != records[1]["weights_sha256"]
    for step in (1, 2):
        assert re.search(rf"step {step}/2: 2 mini-batches of one state on each of 2 ranks", log)
    assert "verl CPU rehearsal on CPU x 2 nodes" in log
    # the job's Ray is gone once it ended: its processes, and the rank actors by PID
    assert [pid for pid in ray_pids(job) if alive(pid)] == []
    assert [pid for _, _, pid in placed.values() if alive(pid)] == []


@pytest.mark.full  # two Ray trainings across the two nodes, one killed mid-step: ~100 s
def test_a_rank_killed_mid_run_fails_the_job_and_a_resubmission_resumes(
    two_nodes: Any, warm_tiny_model: Path, tmp_path: Path
) -> None:
    import os
    import signal

    run_dir = tmp_path / "run"
    prepare(run_dir)
    overrides = sets(run_dir, warm_tiny_model, steps=3)
    job = submit(two_nodes, run_dir, overrides)
    two_nodes.jobs.append(job)
    log_path = job_log(run_dir, job)
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while time.monotonic() < deadline:  # step 1 saved: kill rank 1's actor on node 2
        log = log_path.read_text() if log_path.exists() else ""
        if "[rehearsal] step 1/3:" in log:
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"step 1 never finished:\n{log[-3000:]}")
    node, address, pid = ranks(log)[1]
    assert (node, address) == ("node2", two_nodes.nodes()["node2"])
    os.kill(pid, signal.SIGKILL)
    assert wait_job(two_nodes, job) == "FAILED"
    status = prour(two_nodes, "slurm", "status", str(run_dir))
    shown = status.stdout + status.stderr
    assert re.search(rf"error: rank 1 on node node2 \({re.escape(address)}\) died during step",
                     shown), shown
    out = run_dir / "checkpoints"
    from prour.train.checkpoint import complete_checkpoints

    saved = max(step for step, _ in complete_checkpoints(out))  # step 1 at least, not step 3
    assert 1 <= saved < 3
    logged = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert logged == list(range(1, len(logged) + 1)) and saved - 1 <= len(logged) <= saved

    again = submit(two_nodes, run_dir, overrides)
    two_nodes.jobs.append(again)
    state = wait_job(two_nodes, again)
    log = job_log(run_dir, again).read_text()
    assert state == "COMPLETED", log[-6000:]
    assert f"[rehearsal] steps {saved + 1}..3 from {out / f'step_{saved}'}" in log
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]  # each step once
    assert (out / "step_3" / "trainer_state.pt").is_file()
    assert [pid for _, _, pid in ranks(log).values() if alive(pid)] == []
    assert (out / "step_3" / "trainer_state.pt").is_file()
