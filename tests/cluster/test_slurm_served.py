"""A served model that dies inside a Slurm job: the eval job's own vLLM server (`prour run --only
eval` serves what eval calls) is killed while its episodes run; the job is FAILED and `prour slurm
status` names the server it lost as the cause.

The whole chain on served models through Slurm is tests/cluster/test_slurm_rehearsal.py.
Needs root (Slurm) and the vLLM venv; PROUR_REQUIRE_SLURM=1 / PROUR_REQUIRE_VLLM=1 make a
missing one fail instead of skip.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_helpers import write_recipe
from test_slurm_local import REPO, prour, status_of, submit, wait_done

pytestmark = [pytest.mark.slurm, pytest.mark.vllm, pytest.mark.slow]

PAPER = REPO / "recipes" / "paper.yaml"
# Every role some stage reads (collect: agent, user, teacher; normalize: normalizer; calibrate:
# annotator, decomposer; train: strict_user, verifier; eval: the same plus judge).
PIPELINE_ROLES = ("agent", "user", "teacher", "normalizer", "annotator", "decomposer",
                  "strict_user", "verifier", "judge")
TIMEOUT_S = 1800
STATES = {"dev": ["d1", "d2"], "test": ["t1"]}


@pytest.fixture(scope="module")
def served_model(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a position limit that holds retail's prompts: its policy and tool
    schemas alone are ~9k tiny-tokenizer tokens, and vLLM serves no prompt past the config's
    positions (RoPE, no weights of its own, so only the limit changes)."""
    folder = tmp_path_factory.mktemp("served") / "model"
    shutil.copytree(tiny_model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 16384}))
    return folder


def served_recipe(tmp_path: Path, run_dir: Path, vllm_python: Path, served: Path,
                  generator: Path) -> Path:
    """paper.yaml's roles: the generator in process, every other role the one served model."""
    paper = yaml.safe_load(PAPER.read_text())
    roles = sorted(set(paper["models"]) - {"generator"} | set(PIPELINE_ROLES))
    openai = {"backend": "openai", "model": "tiny", "max_retries": 1, "timeout_s": 120}
    models: dict[str, Any] = {role: dict(openai) for role in roles}
    models["generator"] = {"backend": "hf", "path": str(generator), "device": "cpu",
                           "dtype": "float32", "max_model_len": 4096}
    calibration = tmp_path / "calibration-states"
    for split, ids in STATES.items():
        lines = [{"id": i, "domain": "retail",
                  "messages": [{"role": "user", "content": f"Hi, I need help with order {i}."}]}
                 for i in ids]
        (calibration / f"{split}.jsonl").parent.mkdir(parents=True, exist_ok=True)
        (calibration / f"{split}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return write_recipe(tmp_path / "served.yaml", {
        "name": "served",
        "seed": 0,
        "run_dir": str(run_dir),
        "models": models,
        "env": {"max_steps": 4, "agent_max_tokens": 12, "user_max_tokens": 12},
        # two trials of one task: one trajectory for train, one for validation
        "data": {"domain": "retail", "max_tasks": 1, "num_trajectories": 2, "trial_seeds": [0, 1],
                 "concurrency": 1, "teacher_max_tokens": 8, "normalizer_max_tokens": 16,
                 "max_decisions": 2, "val_ratio": 0.5, "max_prompt_tokens": 1024},
        "router": {"n_interpretations": 2, "n_actions": 2, "goal_max_tokens": 12,
                   "action_max_tokens": 48, "action_temperature": 0.3, "tool_detail": "brief", "empty_route": "clarify",
                   "calibration": {"dev_states": str(calibration / "dev.jsonl"),
                                   "test_states": str(calibration / "test.jsonl")}},
        "reward": {"responder_max_tokens": 8, "verifier_max_steps": 1},
        "train": {"backend": "local", "val_file": None, "states_per_step": 1, "total_steps": 1,
                  "save_every": 1, "output_dir": str(tmp_path / "checkpoints"), "device": "cpu",
                  "dtype": "float32", "gradient_checkpointing": False,
                  "rollout": {"n": 2, "keep": 2, "max_response_tokens": 8},
                  "ppo": {"epochs": 1, "mini_batch_states": 1, "micro_batch_size": 1},
                  "wandb": {"track": False}},
        "eval": {"methods": ["prour"], "seeds": [0], "domains": ["retail"], "max_tasks": 1,
                 "concurrency": 1, "judge": False},
        "serve": {"python": str(vllm_python), "startup_timeout_s": 600,
                  "models": {"tiny": {"path": str(served), "dtype": "float32",
                                      "enforce_eager": True, "max_model_len": 16384}}},
    })


def status_lines(run_dir: Path, cluster: Any) -> tuple[int, str]:
    done = prour(cluster, "slurm", "status", str(run_dir))
    return done.returncode, done.stdout + done.stderr


def stage_log(manifest: dict, stage: str) -> Path:
    entry = next(e for e in manifest["stages"] if e["stage"] == stage)
    return Path(entry["tasks"][0]["log"] if entry["tasks"] else entry["log"])


def test_a_server_killed_inside_the_eval_job_fails_it_naming_the_server(
    slurm_cluster: Any, vllm_python: Path, tiny_model_dir: Path, served_model: Path,
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    recipe = served_recipe(tmp_path, run_dir, vllm_python, served_model, tiny_model_dir)
    manifest = submit(slurm_cluster, recipe, run_dir, "eval",
                      ["eval.methods=[base]", "eval.max_tasks=2"], ["--base-model"])
    pid, base_url = kill_server_once_eval_runs(run_dir, stage_log(manifest, "eval"))
    wait_done(slurm_cluster, manifest, TIMEOUT_S)
    assert status_of(run_dir, "eval")["rc"] != "0"
    code, shown = status_lines(run_dir, slurm_cluster)
    assert code == 1, shown
    assert re.search(r"^eval\s.*\sFAILED\s", shown, re.MULTILINE), shown
    failure = shown.split("failed stage: ")[1]
    cause = next(line for line in failure.splitlines() if line.startswith("cause: "))
    assert base_url in cause or f"pid {pid}" in cause, shown  # names the server it lost


def kill_server_once_eval_runs(
    run_dir: Path, eval_log: Path, timeout_s: float = TIMEOUT_S
) -> tuple[int, str]:
    """SIGKILL the eval job's vLLM server (its process group) once the eval step has started
    with it; returns its pid and base URL."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = eval_log.read_text() if eval_log.is_file() else ""
        if "== eval: start" in text:
            for path in sorted((run_dir / "endpoints").glob("*.json")):
                record = json.loads(path.read_text())
                server = record.get("servers", {}).get("tiny")
                if record.get("status") == "ready" and server:
                    os.killpg(server["pid"], signal.SIGKILL)
                    return server["pid"], server["base_url"]
        time.sleep(1)
    raise AssertionError(f"the eval step never started with its server: {eval_log}")
