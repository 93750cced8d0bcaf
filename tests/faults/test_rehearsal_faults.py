"""Fault cells of ``prour train`` on verl's CPU rehearsal (``train.verl.engine: cpu_rehearsal``;
tests/faults/matrix.py lists every cell): verl's trainer code on a local Ray cluster, one policy
rank, the tiny model, 4 steps with a checkpoint each. A signal after the first checkpoint (in a
Slurm job also SIGTERM repeated until the exit) ends it with exit 130 and one line naming the
newest checkpoint and the rerun, the lock freed and Ray stopped (Ray's own SIGTERM handler aborted
the process with exit 134 before prour took its handlers back); a metrics line torn by a crash is
cut off on resume; a read-only output folder is one line. The rerun saves every step exactly once
(steps 1-4 in metrics.jsonl, each checkpoint loadable)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))  # test_bad_setups' tmpfs
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from train_helpers import instance_rows

from prour.interrupt import INTERRUPTED_EXIT
from prour.runlock import LOCK_FILE
from prour.train import checkpoint as ckpt

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 300


def _prepared(run: Path, model: Path, out: Path) -> list[str]:
    """The paper recipe's ``--set`` items for a 4-step CPU rehearsal into ``out``, its data
    written under ``run``."""
    from prour.data.dataset import write_rows

    write_rows(instance_rows(4), run / "data/dataset/train.parquet")
    write_rows(instance_rows(6)[4:], run / "data/dataset/validation.parquet")
    (run / "strict_user.yaml").write_text("rules:\n  - pattern: '.'\n    reply: 'The blue one.'\n")
    items = [f"run_dir={run}", f"models.generator.path={model}", f"train.output_dir={out}",
             "models.strict_user.backend=scripted",
             f"models.strict_user.script={run / 'strict_user.yaml'}",
             "reward.responder_retries=0", "train.backend=verl",
             "train.verl.engine=cpu_rehearsal", "train.verl.nnodes=1",
             "train.verl.n_gpus_per_node=1", "train.states_per_step=2", "train.rollout.n=2",
             "train.rollout.keep=2", "train.rollout.max_response_tokens=8", "train.ppo.epochs=1",
             "train.optim.lr=1e-3", "train.optim.warmup_steps=0", "train.total_steps=4",
             "train.save_every=1", "eval.methods=[base,prour]"]
    return [part for item in items for part in ("--set", item)]


def _train(sets: list[str], *extra: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "prour.cli.main", "train", "--recipe",
         str(REPO / "recipes" / "paper.yaml"), *sets, *extra], cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **env})


def _repeat_sigterm(proc: subprocess.Popen, every_s: float = 0.1) -> None:
    """SIGTERM to ``proc`` every ``every_s`` seconds until it has exited."""
    while proc.poll() is None:
        time.sleep(every_s)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)


def _steps(out: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.full  # ~50 s each: two rehearsals on Ray (the row's CI cells: start-up, checkpoint)
@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "slurm-repeated-SIGTERM"])
def test_a_signal_mid_rehearsal_names_the_checkpoint_and_resume_saves_every_step_once(
        tiny_model_dir, tmp_path, how):
    """In a Slurm job (SLURM_JOB_ID) a SIGTERM every 0.1 s from the first to the exit stands for
    Slurm's repetitions: it covers the second of ``ray.shutdown`` in which Ray used to put
    SIGTERM's default action back (prour.train.verl_ext.ray_signals)."""
    out = tmp_path / "ckpt"
    sets = _prepared(tmp_path / "run", tiny_model_dir, out)
    proc = _train(sets, **({"SLURM_JOB_ID": "4242"} if how.startswith("slurm") else {}))
    deadline = time.monotonic() + WAIT_S
    while ckpt.latest_checkpoint(out) is None:
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT if how == "SIGINT" else signal.SIGTERM)
    if how.startswith("slurm"):
        threading.Thread(target=_repeat_sigterm, args=(proc,), daemon=True).start()
    log = proc.communicate(timeout=WAIT_S)[0]
    assert proc.returncode == INTERRUPTED_EXIT, log
    assert "Traceback" not in log and "SIGTERM received at time" not in log, log  # Ray's abort
    saved = [s for s, _ in ckpt.complete_checkpoints(out)]
    assert saved and max(saved) < 4, (saved, log)
    reports = [line for line in log.splitlines() if line.startswith("interrupted:")]
    expected = (f"interrupted: newest checkpoint {out / f'step_{max(saved)}'}, metrics in "
                f"{out / 'metrics.jsonl'}; rerun with --resume to continue from it; released "
                f"the lock {out / LOCK_FILE}; exit 130")
    assert reports == [expected], log
    assert not (out / LOCK_FILE).exists()
    with open(out / "metrics.jsonl", "a") as handle:  # and a metrics line cut by a crash
        handle.write('{"step": 9, "loss')

    resumed = _train(sets, "--resume")
    log = resumed.communicate(timeout=WAIT_S)[0]
    assert resumed.returncode == 0, log
    assert [s for s, _ in ckpt.complete_checkpoints(out)] == [1, 2, 3, 4]
    assert _steps(out) == [1, 2, 3, 4]  # each step once: none lost, none repeated, none torn
    assert not (out / LOCK_FILE).exists()


@pytest.mark.full  # ~27 s each: the rerun is a rehearsal on Ray
@pytest.mark.parametrize("fault", ["read-only", "full"])
def test_a_read_only_or_full_output_folder_is_one_line_then_the_rehearsal_trains(
        tiny_model_dir, tmp_path, fault):
    from test_bad_setups import tmpfs
    from test_stage_faults import _fill

    mount = tmp_path / "ckpt"
    with tmpfs(mount, "64m"):
        out = mount / "run"
        sets = _prepared(tmp_path / "run", tiny_model_dir, out)
        if fault == "read-only":
            subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        else:
            filler = _fill(mount)
        proc = _train(sets, "--set", "train.total_steps=1")
        log = proc.communicate(timeout=WAIT_S)[0]
        assert proc.returncode == 1 and "Traceback" not in log, log
        errors = [line for line in log.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1, log
        assert f"cannot write {out}" in errors[0], errors[0]
        assert (f"the file system ({mount}) is read-only" if fault == "read-only" else
                f"no space left on the device ({mount})") in errors[0], errors[0]
        if fault == "read-only":
            subprocess.run(["mount", "-o", "remount,rw", str(mount)], check=True)
        else:
            filler.unlink()
        rerun = _train(sets, "--set", "train.total_steps=1")
        log = rerun.communicate(timeout=WAIT_S)[0]
        assert rerun.returncode == 0, log
        assert [s for s, _ in ckpt.complete_checkpoints(out)] == [1]
        assert not (out / LOCK_FILE).exists()


@pytest.mark.full  # ~55 s each: two rehearsals on Ray
@pytest.mark.parametrize("kind", ["http-500", "timeout", "closed-mid-reply"])
def test_responders_that_fail_every_request_stop_the_rehearsal_in_one_line(
        format_policy_dir, tmp_path, kind):
    """The strict user and the verifier are served (an OpenAI-style server) and fail every
    request: verl's sampler stops the first step (train.max_failed_ask_fraction) and `prour
    train` says so in one line naming the responders and that no checkpoint was saved (exit 1,
    no traceback, the lock freed, Ray stopped); the server answering again, the same command
    trains the step."""
    from test_collect_faults import Faulty
    from test_local import _tau2_rows  # tests/train: a clarify and a verify state of tau2

    from prour.data.dataset import write_rows

    run, out = tmp_path / "run", tmp_path / "ckpt"
    sets = _prepared(run, format_policy_dir, out)
    write_rows(_tau2_rows(), run / "data/dataset/train.parquet")
    server = Faulty(kind, failures=None)
    served = ["backend=openai", "model=m", f"base_url={server.url}", "max_retries=1",
              "timeout_s=1.0", "script=null"]
    sets += [part for role in ("strict_user", "verifier") for item in served
             for part in ("--set", f"models.{role}.{item}")]
    sets += [part for item in ("train.total_steps=1", "train.rollout.n=6", "train.rollout.keep=5",
                               "train.rollout.max_response_tokens=24",
                               "reward.responder_max_tokens=16", "reward.verifier_max_steps=1")
             for part in ("--set", item)]
    try:
        proc = _train(sets)
        log = proc.communicate(timeout=WAIT_S)[0]
        assert proc.returncode == 1 and "Traceback" not in log, log
        errors = [line for line in log.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1, log
        assert "sampled questions failed" in errors[0], errors[0]
        assert "train.max_failed_ask_fraction=0.5" in errors[0], errors[0]
        assert "models.strict_user" in errors[0], errors[0]
        assert f"no checkpoint saved yet in {out}" in errors[0], errors[0]
        assert not (out / LOCK_FILE).exists()

        server.failures = server.posts  # answering again
        rerun = _train(sets)
        log = rerun.communicate(timeout=WAIT_S)[0]
        assert rerun.returncode == 0, log
    finally:
        server.close()
    assert [s for s, _ in ckpt.complete_checkpoints(out)] == [1]
    assert _steps(out) == [1]
