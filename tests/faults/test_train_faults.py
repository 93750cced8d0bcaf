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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from test_checkpoint import _recipe_file, _train, _weights  # tests/train: the tiny trainer
from train_helpers import instance_rows

from prour.interrupt import INTERRUPTED_EXIT
from prour.runlock import LOCK_FILE
from prour.train import checkpoint as ckpt


@pytest.mark.full
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_mid_training_names_the_checkpoint_and_resume_saves_every_step_once(
        tiny_model_dir, tmp_path, signum):
    from prour.data.dataset import write_rows

    data = write_rows(instance_rows(5), tmp_path / "train.parquet")
    recipe = _recipe_file(tmp_path, "stopped", tiny_model_dir, data)
    out = tmp_path / "ckpt" / "stopped"
    proc = _train(recipe)
    deadline = time.time() + 600
    while ckpt.latest_checkpoint(out) is None:
        assert proc.poll() is None, proc.communicate()[0]
        assert time.time() < deadline, "no checkpoint in time"
        time.sleep(0.02)
    proc.send_signal(signum)
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
