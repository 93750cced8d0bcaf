"""The pipeline on a real single-node Slurm (Debian's slurmctld/slurmd, started for the session).

Runs as root (CI); elsewhere the fixture skips unless PROUR_REQUIRE_SLURM=1. Jobs run the real
`prour` commands from this checkout's environment, so these tests take minutes, not seconds.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import FAKE_VLLM, alive, write_recipe

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "recipes" / "smoke.yaml"
JOB_TIMEOUT_S = 900
# Resources that fit a laptop-sized node: the templates ask for GPU-node sizes by default.
SMALL = [
    "slurm.defaults.cpus_per_task=1",
    "slurm.defaults.mem=1G",
    "slurm.defaults.gpus_per_node=0",
    "slurm.defaults.time=00:20:00",
]


def prour(
    cluster: Any, *args: str, cwd: Path = REPO, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run the prour CLI against the local cluster."""
    return subprocess.run(
        [sys.executable, "-m", "prour.cli.main", *args],
        cwd=cwd,
        env=cluster.env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def submit(cluster: Any, recipe: Path, run_dir: Path, stages: str, overrides: list[str],
           options: list[str] = ()) -> dict:
    sets = [part for item in [*SMALL, *overrides] for part in ("--set", item)]
    done = prour(
        cluster,
        "slurm",
        "submit",
        "--recipe",
        str(recipe),
        "--stages",
        stages,
        "--run-dir",
        str(run_dir),
        *sets,
        *options,
    )
    assert done.returncode == 0, done.stderr
    return json.loads((run_dir / "slurm_jobs.json").read_text())


def job_logs(run_dir: Path) -> str:
    return "\n".join(f"--- {p}\n{p.read_text()[-3000:]}"
                     for p in sorted(run_dir.glob("slurm/logs/*.out")))


def wait_done(cluster: Any, manifest: dict, timeout_s: float = JOB_TIMEOUT_S) -> None:
    """Wait until none of the manifest's jobs is queued or running."""
    ids = {entry["job_id"] for entry in manifest["stages"]}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        listed = subprocess.run(
            ["squeue", "-h", "-o", "%F"],
            env=cluster.env(),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        # a cluster that stopped answering (munged gone) is not an empty queue
        assert listed.returncode == 0, f"squeue failed: {listed.stderr}"
        if not ids & set(listed.stdout.split()):
            return
        time.sleep(2)
    logs = "\n".join(
        f"--- {p}\n{p.read_text()[-2000:]}"
        for p in sorted(Path(manifest["run_dir"]).glob("slurm/logs/*.out"))
    )
    raise AssertionError(f"jobs {sorted(ids)} still queued after {timeout_s} s\n{logs}")


def status_of(run_dir: Path, name: str) -> dict[str, str]:
    text = (run_dir / "slurm" / "status" / name).read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def scontrol(cluster: Any, job: str) -> str:
    return subprocess.run(
        ["scontrol", "show", "job", "-o", job],
        env=cluster.env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    ).stdout


def smoke_inputs(tmp_path: Path, model_dir: Path) -> list[str]:
    """A two-state dataset and overrides pointing the smoke recipe at it and at the tiny model."""
    from prour.data.dataset import write_rows
    from prour.data.schema import Instance, tool_traffic_hash

    rows = []
    for i, mode in enumerate(("clarify", "verify")):
        target = (
            "I want to exchange the blue shirt in order #W1001."
            if mode == "clarify"
            else ('{"arguments":{"order_id":"#W1001"},"tool":"get_order_details"}')
        )
        history = [{"role": "user", "content": "Hi, I need help with an order."}]
        instance = Instance(
            mode,
            "retail",
            str(i),
            f"traj-{i}",
            1,
            history,
            [{"role": "user", "content": "Ask one question."}],
            target,
            0.5,
            0.2,
            0.7,
            False,
            0,
            8,
            12,
            0,
            "v1",
            env_history=[],
            db_hash=tool_traffic_hash("retail", str(i), []),
        )
        rows.append(instance.to_row(i))
    train_file = write_rows(rows, tmp_path / "data" / "train.parquet")
    tiny = str(model_dir)
    # the retail policy and tool schemas alone are ~9k tiny-tokenizer tokens (as in smoke.yaml)
    model = f"{{backend: hf, path: {tiny}, device: cpu, dtype: float32, max_model_len: 16384}}"
    return [
        f"models.generator={model}",
        f"models.strict_user={model}",
        f"models.verifier={model}",
        f"models.agent={model}",
        f"models.user={model}",
        f"train.train_file={train_file}",
        "train.val_file=null",
        "train.total_steps=1",
        "train.states_per_step=2",
        "train.save_every=1",
        "train.rollout.max_response_tokens=8",
        f"train.output_dir={tmp_path / 'checkpoints'}",
        "eval.methods=[base]",
        "eval.seeds=[0,1]",
        "eval.domains=[retail]",
        "eval.max_tasks=1",
        "eval.concurrency=1",
        "env.agent_max_tokens=8",
        "env.user_max_tokens=8",
        "eval.judge=false",
        "env.max_steps=2",
    ]


def test_smoke_pipeline_runs_in_order(
    slurm_cluster: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """train -> eval (the smoke recipe serves nothing): eval starts after train ends."""
    run_dir = tmp_path / "run"
    manifest = submit(
        slurm_cluster, SMOKE, run_dir, "train,eval", smoke_inputs(tmp_path, tiny_model_dir)
    )
    wait_done(slurm_cluster, manifest)
    report = prour(slurm_cluster, "slurm", "status", str(run_dir))
    assert report.returncode == 0, report.stdout + report.stderr + job_logs(run_dir)
    assert "all stages done" in report.stdout
    train, evaluated = status_of(run_dir, "train"), status_of(run_dir, "eval")
    assert [s["rc"] for s in (train, evaluated)] == ["0"] * 2
    assert float(train["end"]) <= float(evaluated["start"])
    assert sorted((tmp_path / "checkpoints").glob("step_*")), "training wrote no checkpoint"
    results = [
        json.loads(line) for line in (run_dir / "eval" / "results.jsonl").read_text().splitlines()
    ]
    assert sorted({r["seed"] for r in results}) == [0, 1]


def test_failed_stage_stops_its_dependants(slurm_cluster: Any, tmp_path: Path) -> None:
    """Train fails at run time; the eval array never starts and status names train and its log."""
    run_dir = tmp_path / "run"
    broken = [
        "train.train_file=/nonexistent/train.parquet",
        "models.generator.path=/nonexistent/model",
        "eval.seeds=[0,1]",
        "eval.domains=[retail]",
    ]
    manifest = submit(slurm_cluster, SMOKE, run_dir, "train,eval", broken)
    wait_done(slurm_cluster, manifest)
    stages = {entry["stage"]: entry for entry in manifest["stages"]}
    assert status_of(run_dir, "train")["rc"] != "0"
    assert not list((run_dir / "slurm" / "status").glob("eval*")), (
        "an eval task ran after train failed"
    )
    shown = scontrol(slurm_cluster, stages["eval"]["job_id"])
    assert "JobState=CANCELLED" in shown and "Reason=DependencyNeverSatisfied" in shown
    report = prour(slurm_cluster, "slurm", "status", str(run_dir))
    assert report.returncode == 1
    train_log = stages["train"]["log"]
    assert "failed stage: train" in report.stdout and f"log: {train_log}" in report.stdout
    assert "never ran: eval" in report.stdout
    assert "/nonexistent" in Path(train_log).read_text()


def test_a_serve_job_alone_serves_until_cancelled(slurm_cluster: Any, tmp_path: Path) -> None:
    """`--stages serve` (the chain's jobs serve for themselves): the servers come up, and a
    SIGTERM to the job stops them cleanly, leaving the endpoints file marked stopped."""
    python = tmp_path / "fake-vllm-python"
    python.write_text(FAKE_VLLM.format(python=sys.executable))
    python.chmod(0o755)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")  # a model folder (prour.llm.weights)
    (tmp_path / "model" / "model.safetensors").write_bytes(b"")  # with a weight file (preflight)
    recipe = write_recipe(
        tmp_path / "serving.yaml",
        {
            "name": "serving",
            "run_dir": str(tmp_path / "run"),
            "models": {"strict_user": {"backend": "openai", "model": "frozen"}},
            "serve": {
                "python": str(python),
                "startup_timeout_s": 60,
                "models": {"frozen": {"path": str(tmp_path / "model"), "env": {"FAKE_DELAY": "1"}}},
            },
        },
    )
    run_dir = tmp_path / "run"
    manifest = submit(slurm_cluster, recipe, run_dir, "serve", [])
    assert [e["stage"] for e in manifest["stages"]] == ["serve"]
    endpoints_file = run_dir / "endpoints.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        text = endpoints_file.read_text() if endpoints_file.is_file() else ""
        if '"status": "ready"' in text:
            break
        time.sleep(1)
    else:
        raise AssertionError(f"the servers never came up\n{job_logs(run_dir)}")
    # the batch script forwards the signal to `prour serve`, which stops its servers (a plain
    # scancel signals the servers directly too, and serve then records them as having died)
    subprocess.run(["scancel", "--batch", "--signal=TERM", manifest["stages"][0]["job_id"]],
                   env=slurm_cluster.env(), check=True, timeout=30)
    wait_done(slurm_cluster, manifest, 120)
    endpoints = json.loads(endpoints_file.read_text())
    assert endpoints["status"] == "stopped", job_logs(run_dir)
    assert not alive(endpoints["servers"]["frozen"]["pid"])
    assert "end" in status_of(run_dir, "serve")  # the job's own bookkeeping ran to its end
