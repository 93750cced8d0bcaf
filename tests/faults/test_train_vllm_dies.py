"""The "vLLM dies mid-step" cells of ``prour train``, local and verl's CPU rehearsal
(tests/faults/matrix.py lists every cell): the strict user and the verifier are the tiny model
on a real vLLM CPU server (the clarify states here ask only the strict user), which is killed
(SIGKILL to its process group: no goodbye) once the first checkpoint is saved. The next step's
questions all fail, so training stops before its update (train.max_failed_ask_fraction): exit
1, one error line naming the responders and the newest checkpoint with --resume, no traceback,
the lock freed. With the server back on the same address, ``--resume`` trains the missing
steps: steps 1-4 once each in metrics.jsonl, and the checkpoints load.

The responders decode at ``reward.responder_temperature: 1.0``, a recipe setting: greedy, the
random-init tiny model answers with newlines only, which the strict user counts as no reply, so
every question would fail while the server is up."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

for folder in ("train", "data"):  # the tiny trainer's recipe; the served name and start timeout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / folder))
from test_checkpoint import _recipe_file, _weights
from test_checkpoint import _train as _train_local
from test_collect_vllm import SERVED, START_TIMEOUT_S
from test_rehearsal_faults import _prepared
from test_rehearsal_faults import _train as _rehearse
from train_helpers import instance_rows

from prour.cluster.vllm_server import VLLMServer, free_port
from prour.runlock import LOCK_FILE
from prour.train import checkpoint as ckpt

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.full]  # 2 server starts each
WAIT_S = 600
STEPS = [1, 2, 3, 4]
# What the served responders are told in both tests: sampled replies of 16 tokens, no retry.
REWARD = {"responder_retries": 0, "responder_max_tokens": 16, "responder_temperature": 1.0}
ROLLOUT = {"n": 6, "keep": 5, "max_response_tokens": 24}  # room for a whole [QUESTION] block


def _served(base_url: str) -> dict:
    return {"backend": "openai", "base_url": base_url, "model": SERVED, "max_retries": 1,
            "timeout_s": 60.0}


def _server(model: Path, vllm_python: Path, port: int) -> VLLMServer:
    return VLLMServer(model, python=vllm_python, served_name=SERVED, port=port,
                      max_model_len=4096, extra_args=("--distributed-executor-backend", "uni"))


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _asked(record: dict) -> int:
    """The strict user's calls a step's metrics line counts (plain keys, or verl's prefixed)."""
    flat = {**record, **(record.get("data") or {})}
    return sum(int(v or 0) for k, v in flat.items() if k.endswith("strict_user_calls"))


def _kill_after_the_first_checkpoint(proc: subprocess.Popen, out: Path,
                                     server: VLLMServer) -> str:
    """SIGKILL the server's process group once ``out`` holds a checkpoint; the trainer's log."""
    deadline = time.monotonic() + WAIT_S
    while ckpt.latest_checkpoint(out) is None:
        assert proc.poll() is None, "training ended before its first checkpoint: " + (
            proc.communicate()[0][-5000:])
        assert time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.02)
    assert server.pid is not None
    os.killpg(server.pid, signal.SIGKILL)
    return proc.communicate(timeout=WAIT_S)[0]


def _check_the_stop(log: str, returncode: int, out: Path) -> None:
    """Exit 1, one error line naming the responders, the newest checkpoint and --resume."""
    assert returncode == 1, log[-5000:]
    assert "Traceback" not in log, log[-5000:]
    errors = [line for line in log.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, log[-5000:]
    saved = [s for s, _ in ckpt.complete_checkpoints(out)]
    assert saved and max(saved) < 4, (saved, log[-5000:])
    assert "sampled questions failed" in errors[0], errors[0]
    assert "models.strict_user" in errors[0], errors[0]
    assert f"newest checkpoint {out / f'step_{max(saved)}'}" in errors[0], errors[0]
    assert "rerun with --resume" in errors[0], errors[0]
    assert not (out / LOCK_FILE).exists(), "the lock was left behind"


def _check_the_resumed(out: Path) -> None:
    """Every step once (none lost, none repeated), the served strict user answered the steps'
    questions while it was up, and every checkpoint loads."""
    assert [s for s, _ in ckpt.complete_checkpoints(out)] == STEPS
    records = _records(out)
    assert [r["step"] for r in records] == STEPS
    assert sum(_asked(r) for r in records) > 0, records
    for step in STEPS:
        assert _weights(out / f"step_{step}")
    assert not (out / LOCK_FILE).exists()


def _kill_then_resume(train: Callable[..., subprocess.Popen], out: Path, first: VLLMServer,
                      server: Callable[[], VLLMServer]) -> None:
    """Kill ``first`` once the run ``train()`` starts has saved a checkpoint and check the stop;
    then, with the server back (``server()``, the same port), ``train("--resume")`` trains every
    step once."""
    try:
        proc = train()
        log = _kill_after_the_first_checkpoint(proc, out, first)
    finally:
        first.stop()
    _check_the_stop(log, proc.returncode, out)
    with server().start(timeout_s=START_TIMEOUT_S):
        resumed = train("--resume")
        log = resumed.communicate(timeout=WAIT_S)[0]
    assert resumed.returncode == 0, log[-5000:]
    _check_the_resumed(out)


def test_the_responders_server_dies_mid_training_then_resume_trains_every_step_once(
        format_policy_dir, tiny_model_dir, vllm_python, tmp_path):
    """`prour train` with the local backend; the generator is the warm-started tiny model that
    asks a well-formed question some of the time, so every step sends the strict user a few."""
    from prour.data.dataset import write_rows

    data = write_rows(instance_rows(5), tmp_path / "train.parquet")
    path = _recipe_file(tmp_path, "served", format_policy_dir, data)
    recipe = yaml.safe_load(path.read_text())
    port = free_port()
    first = _server(tiny_model_dir, vllm_python, port).start(timeout_s=START_TIMEOUT_S)
    recipe["models"].update(strict_user=_served(first.base_url),
                            verifier=_served(first.base_url))
    recipe["reward"] = REWARD
    recipe["train"]["rollout"] = ROLLOUT
    path.write_text(yaml.safe_dump(recipe))
    _kill_then_resume(lambda *extra: _train_local(path, *extra), tmp_path / "ckpt" / "served",
                      first, lambda: _server(tiny_model_dir, vllm_python, port))


def test_the_responders_server_dies_mid_rehearsal_then_resume_trains_every_step_once(
        format_policy_dir, tiny_model_dir, vllm_python, tmp_path):
    """`prour train` on verl's CPU rehearsal (the paper recipe, Ray, one policy rank)."""
    out = tmp_path / "ckpt"
    sets = _prepared(tmp_path / "run", format_policy_dir, out)
    port = free_port()
    first = _server(tiny_model_dir, vllm_python, port).start(timeout_s=START_TIMEOUT_S)
    served = [f"{key}={value}" for key, value in _served(first.base_url).items()]
    sets += [part for role in ("strict_user", "verifier") for item in [*served, "script=null"]
             for part in ("--set", f"models.{role}.{item}")]
    sets += [part for section, values in (("reward", REWARD), ("train.rollout", ROLLOUT))
             for key, value in values.items() for part in ("--set", f"{section}.{key}={value}")]
    _kill_then_resume(lambda *extra: _rehearse(sets, *extra), out, first,
                      lambda: _server(tiny_model_dir, vllm_python, port))
