"""Fault cells of ``prour train`` with the local backend (tests/faults/matrix.py lists every
cell): a real trainer process on the tiny model (tests/train/test_checkpoint.py's recipe, 4 steps,
a checkpoint each) is stopped by SIGINT or SIGTERM after its first checkpoint. It exits 130 with
one line naming the newest checkpoint and --resume, frees the lock, and the resumed run saves
every step exactly once (steps 1-4 in metrics.jsonl, each checkpoint loadable)."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

for folder in ("train", "cli"):  # tests/train: the tiny trainer; tests/cli: the small mount
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / folder))
from test_checkpoint import _recipe_file, _train, _weights  # tests/train: the tiny trainer
from train_helpers import instance_rows

from prour.interrupt import INTERRUPTED_EXIT
from prour.runlock import LOCK_FILE
from prour.train import checkpoint as ckpt


@pytest.mark.full
@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "slurm-repeated-SIGTERM"])
def test_a_signal_mid_training_names_the_checkpoint_and_resume_saves_every_step_once(
        tiny_model_dir, tmp_path, how):
    """In a Slurm job (SLURM_JOB_ID) Slurm's second SIGTERM 1.5 s later is its own repetition:
    the save still ends with the same single report and exit 130."""
    from prour.data.dataset import write_rows

    data = write_rows(instance_rows(5), tmp_path / "train.parquet")
    recipe = _recipe_file(tmp_path, "stopped", tiny_model_dir, data)
    out = tmp_path / "ckpt" / "stopped"
    proc = _train(recipe, **({"SLURM_JOB_ID": "4242"} if how.startswith("slurm") else {}))
    deadline = time.time() + 600
    while ckpt.latest_checkpoint(out) is None:
        assert proc.poll() is None, proc.communicate()[0]
        assert time.time() < deadline, "no checkpoint in time"
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT if how == "SIGINT" else signal.SIGTERM)
    if how.startswith("slurm"):
        time.sleep(1.5)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    log = proc.communicate(timeout=600)[0]
    assert proc.returncode == INTERRUPTED_EXIT, log
    assert "Traceback" not in log, log
    saved = [s for s, _ in ckpt.complete_checkpoints(out)]
    assert saved and max(saved) < 4, (saved, log)
    reports = [line for line in log.splitlines() if line.startswith("interrupted:")]
    assert len(reports) == 1, log
    assert f"newest checkpoint {out / f'step_{max(saved)}'}" in reports[0], reports[0]
    assert "--resume" in reports[0] and "exit 130" in reports[0], reports[0]
    assert not (out / LOCK_FILE).exists()

    resumed = _train(recipe, "--resume")
    log = resumed.communicate(timeout=600)[0]
    assert resumed.returncode == 0, log
    assert [s for s, _ in ckpt.complete_checkpoints(out)] == [1, 2, 3, 4]
    steps = [json.loads(line)["step"]
             for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4], steps  # each step once: none lost, none repeated
    assert _weights(out / "step_4")  # loads
    assert not (out / LOCK_FILE).exists()


@pytest.mark.full  # ~40 s: the rerun trains a step
def test_a_read_only_output_folder_is_one_line_then_a_rerun_trains(tiny_model_dir, tmp_path):
    """train.output_dir on a read-only file system: exit 1, the disk's one line, no traceback;
    remounted read-write, the same command trains (one step here) and its checkpoint loads."""
    import subprocess

    from test_bad_setups import tmpfs

    from prour.data.dataset import write_rows

    data = write_rows(instance_rows(5), tmp_path / "train.parquet")
    recipe = _recipe_file(tmp_path, "ro", tiny_model_dir, data)
    mount, one_step = tmp_path / "ckpt", ("--set", "train.total_steps=1")
    with tmpfs(mount, "64m", read_only=True):
        proc = _train(recipe, *one_step)
        log = proc.communicate(timeout=600)[0]
        assert proc.returncode == 1 and "Traceback" not in log, log
        errors = [line for line in log.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1, log
        assert f"cannot write {mount / 'ro'}" in errors[0], errors[0]
        assert f"the file system ({mount}) is read-only" in errors[0], errors[0]
        subprocess.run(["mount", "-o", "remount,rw", str(mount)], check=True)
        rerun = _train(recipe, *one_step)
        log = rerun.communicate(timeout=600)[0]
        assert rerun.returncode == 0, log
        out = mount / "ro"
        assert [s for s, _ in ckpt.complete_checkpoints(out)] == [1]
        assert _weights(out / "step_1")
        assert not (out / LOCK_FILE).exists()


@pytest.mark.parametrize("kind", ["http-500", pytest.param("timeout", marks=pytest.mark.full),
                                  pytest.param("closed-mid-reply", marks=pytest.mark.full)])
def test_responders_that_fail_every_request_stop_training_then_a_rerun_trains(
        format_policy_dir, tmp_path, kind):
    """The strict user and the verifier are served (an OpenAI-style server) and fail every
    request: the questions of the first step fail after their retries, more than
    train.max_failed_ask_fraction of them, and `prour train` stops before any update (exit 1,
    one line naming the share, the responders and that no checkpoint was saved), no lock left;
    the server answering again, the same command (as the line says: a rerun starts over)
    trains and saves its step."""
    import yaml
    from test_collect_faults import Faulty
    from test_local import _tau2_rows  # tests/train: a clarify and a verify state of tau2

    from prour.data.dataset import write_rows

    data = write_rows(_tau2_rows(), tmp_path / "train.parquet")
    path = _recipe_file(tmp_path, "down", format_policy_dir, data)
    recipe = yaml.safe_load(path.read_text())
    server = Faulty(kind, failures=None)
    served = {"backend": "openai", "model": "m", "base_url": server.url, "max_retries": 1,
              "timeout_s": 1.0}
    recipe["models"].update(strict_user=served, verifier=served)
    recipe["reward"] = {"responder_retries": 0, "responder_max_tokens": 16,
                        "verifier_max_steps": 1}
    recipe["train"].update(total_steps=1, states_per_step=2)
    recipe["train"]["rollout"] = {"n": 6, "keep": 5, "max_response_tokens": 24}
    path.write_text(yaml.safe_dump(recipe))
    out = tmp_path / "ckpt" / "down"
    try:
        proc = _train(path)
        log = proc.communicate(timeout=600)[0]
        assert proc.returncode == 1 and "Traceback" not in log, log
        errors = [line for line in log.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1, log
        assert "sampled questions failed" in errors[0], errors[0]
        assert "train.max_failed_ask_fraction=0.5" in errors[0], errors[0]
        assert "models.strict_user" in errors[0], errors[0]
        assert f"no checkpoint saved yet in {out}" in errors[0], errors[0]
        assert not ckpt.complete_checkpoints(out)
        assert not (out / LOCK_FILE).exists()

        server.failures = server.posts  # answering again
        rerun = _train(path)
        log = rerun.communicate(timeout=600)[0]
        assert rerun.returncode == 0, log
    finally:
        server.close()
    assert [s for s, _ in ckpt.complete_checkpoints(out)] == [1]
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1], steps
    assert _weights(out / "step_1")
    assert not (out / LOCK_FILE).exists()
