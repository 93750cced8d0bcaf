"""``prour run`` on the smoke recipe, shrunk, with the warm tiny model in process (no server): the
chain runs its real commands as child processes. A run killed during train resumes only the
missing train steps; a second run skips every step; a changed ``router.n_actions`` names exactly
the stale steps and runs none; the dry run and ``prour status`` print the same table; the review
gate stops with its message and the printed command goes on."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prour.runlock import LOCK_FILE, read_holder
from prour.stages import steps
from prour.train.checkpoint import complete_checkpoints

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "recipes" / "smoke.yaml"
ROLES = ("generator", "agent", "user", "teacher", "normalizer", "decomposer", "strict_user",
         "verifier", "judge")
COUNTS = ("env.max_steps=4", "env.agent_max_tokens=16", "env.user_max_tokens=12",
          "data.max_tasks=1", "data.num_trajectories=2", "data.trial_seeds=[0,1]",
          "data.teacher_max_tokens=8", "data.normalizer_max_tokens=16", "data.max_decisions=2",
          "router.goal_max_tokens=12", "router.action_max_tokens=48",
          "reward.responder_max_tokens=8", "train.total_steps=3", "train.states_per_step=1",
          "train.rollout.n=2", "train.rollout.keep=2", "train.rollout.max_response_tokens=8",
          "eval.max_tasks=1", "eval.methods=[base]", "eval.seeds=[0]",
          "data.calibration_reserve=1", "router.calibration.dev_episodes=2",
          # one task: its two trials go one to each side (as recipes/rehearsal.yaml does)
          "data.split_by=trajectory", "protocol.on_breach=warn")
STEP_LINE = re.compile(r"^== (\S+): (\w+)", re.MULTILINE)
TRAINER_STEP = re.compile(r"prour\.train\.local: step (\d+)/3 ")


def _sets(model: Path, run_dir: Path, *more: str) -> list[str]:
    items = [f"run_dir={run_dir}", *(f"models.{role}.path={model}" for role in ROLES), *COUNTS,
             *more]
    return [part for item in items for part in ("--set", item)]


def _prour(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prour.cli.main", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, check=False)


def _lines(done: subprocess.CompletedProcess) -> dict[str, str]:
    """Step -> the word of its last ``== step: word`` line."""
    return dict(STEP_LINE.findall(done.stdout))


@pytest.fixture(scope="module")
def collected(warm_tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder whose chain ran up to extract (collect, normalize, extract: real commands)."""
    run_dir = tmp_path_factory.mktemp("runner") / "run"
    done = _prour("run", "--recipe", str(SMOKE), *_sets(warm_tiny_model, run_dir),
                  "--to", "extract")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert _lines(done) == {"serve": "skipped", "collect-retail": "done",
                            "collect-dev": "skipped", "collect-airline": "skipped", "normalize": "done",
                            "states-dev": "skipped", "states-test": "skipped",
                            "annotate": "skipped", "review": "skipped", "search": "skipped",
                            "heldout": "skipped", "extract": "done",
                            "extract-ig-clarifier": "skipped"}
    return run_dir


def _kill_train_after_first_checkpoint(args: list[str], checkpoints: Path) -> str:
    """Start ``prour run``, kill -9 the train child once it saved a step; the runner's output."""
    runner = subprocess.Popen([sys.executable, "-m", "prour.cli.main", "run", *args],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              cwd=ROOT)
    try:
        deadline = time.monotonic() + 400
        holder = None  # the trainer holds its output folder from before its first step
        while holder is None or not complete_checkpoints(checkpoints):
            assert runner.poll() is None, runner.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint within 400 s"
            holder = holder or read_holder(checkpoints / LOCK_FILE)
            time.sleep(0.05)
        assert holder.pid != runner.pid
        try:
            os.kill(holder.pid, signal.SIGKILL)
        except ProcessLookupError:  # it ended on its own between the checkpoint and the kill
            runner.wait(timeout=120)
            raise AssertionError("the trainer ended before the kill: "
                                 + runner.stdout.read()[-3000:]) from None
        out, _ = runner.communicate(timeout=120)
    finally:
        if runner.poll() is None:
            runner.kill()
    return out


def test_a_killed_train_resumes_only_its_missing_steps_then_reruns_skip_and_stale_is_named(
        collected: Path, warm_tiny_model: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(collected, run_dir)  # a copy of a finished collect stage
    args = ["--recipe", str(SMOKE), *_sets(warm_tiny_model, run_dir)]
    checkpoints = run_dir / "checkpoints"
    out = _kill_train_after_first_checkpoint(args, checkpoints)
    assert "== train: failed" in out and "exit code -9" in out, out[-3000:]
    assert f"log {run_dir / 'logs' / 'train.log'}" in out
    saved = max(step for step, _ in complete_checkpoints(checkpoints))
    assert saved < 3

    again = _prour("run", *args)
    assert again.returncode == 0, again.stdout[-3000:]
    words = _lines(again)
    assert {name: words[name] for name in ("collect-retail", "normalize", "extract")} == \
        {"collect-retail": "skipped", "normalize": "skipped", "extract": "skipped"}
    assert "== train: start (resumes)" in again.stdout and "--resume" in again.stdout
    ran = [int(n) for n in TRAINER_STEP.findall(again.stdout + again.stderr)]
    assert ran == list(range(saved + 1, 4))  # only the missing steps
    metrics = [json.loads(line)["step"] for line in
               (checkpoints / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert metrics == [1, 2, 3]  # one line per step the trainer ran, none twice
    assert {words[name] for name in ("train", "export", "eval", "report")} <= {"done", "skipped"}
    assert words["eval"] == "done" and words["report"] == "done"

    third = _prour("run", *args)  # everything is done now
    assert third.returncode == 0
    assert ": start" not in third.stdout
    assert set(_lines(third).values()) == {"skipped"}

    changed = _prour("run", *args, "--set", "router.n_actions=3")
    assert changed.returncode == 1 and ": start" not in changed.stdout
    stale = [name for name, word in STEP_LINE.findall(changed.stdout) if word == "stale"]
    assert stale == ["extract", "train", "export", "eval", "report"]  # calibrate: skipped here
    assert "router.n_actions: 2 -> 3" in changed.stdout
    assert "--rerun-stale" in changed.stdout

    dry = _prour("run", *args, "--dry-run")
    status = _prour("status", str(run_dir))
    assert dry.returncode == 0 and status.returncode == 0, status.stderr
    table = [line for line in dry.stdout.splitlines() if line.startswith("  ")
             and not line.startswith("    ")]
    assert len(table) == len(steps())  # one line per step of the chain
    assert all(" done " in line or " skipped " in line for line in table)
    assert table == [line for line in status.stdout.splitlines() if line.startswith("  ")]


def test_the_review_gate_stops_with_its_message_and_the_printed_command_goes_on(
        collected: Path, warm_tiny_model: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(collected, run_dir)
    annotator = json.dumps({"backend": "hf", "path": str(warm_tiny_model), "device": "cpu",
                            "dtype": "float32", "max_model_len": 16384})
    args = ["--recipe", str(SMOKE), *_sets(
        warm_tiny_model, run_dir, "router.tau_au=null", "router.tau_eu=null",
        "router.calibration.dev_states=calibration/states_dev.jsonl",
        "router.calibration.test_states=calibration/states_test.jsonl",
        "router.calibration.n_states=2", "router.calibration.test_episodes=2",
        "router.calibration.annotator_max_tokens=8", f"models.annotator={annotator}"),
        "--to", "search"]
    stopped = _prour("run", *args)
    assert stopped.returncode == 0, stopped.stdout[-3000:] + stopped.stderr[-2000:]
    words = _lines(stopped)
    assert words["collect-retail"] == "skipped"  # its values did not change
    assert {words[n] for n in ("collect-dev", "collect-airline", "states-dev", "states-test",
                               "annotate")} == \
        {"done"}
    assert "search" not in words  # the gate stopped the run before it
    gate = stopped.stdout[stopped.stdout.index("== review:"):]
    calibration = run_dir / "calibration"
    for split in ("dev", "test"):
        labels = calibration / f"labels_{split}.jsonl"
        counts: dict[str, int] = {}
        for line in labels.read_text().splitlines():
            record = json.loads(line)
            name = record.get("corrected") or record.get("label") or "(no label)"
            counts[name] = counts.get(name, 0) + 1
        expected = ", ".join(f"{name} {counts[name]}" for name in sorted(counts))
        assert f"{labels}: {expected}" in gate
    command = next(line.strip() for line in gate.splitlines()
                   if line.strip().startswith("prour run "))
    assert command.endswith("--approve-labels")
    assert not (calibration / "labels.approved.json").exists()

    argv = shlex.split(command)[1:]
    assert argv == ["run", *args, "--approve-labels"]  # the same command line, approving
    went_on = _prour(*argv)
    assert went_on.returncode == 0, went_on.stdout[-3000:] + went_on.stderr[-2000:]
    assert "== review: labels approved by --approve-labels" in went_on.stdout
    assert _lines(went_on)["search"] == "done"
    approved = json.loads((calibration / "labels.approved.json").read_text())
    assert set(approved["files"]) == {"labels_dev.jsonl", "labels_test.jsonl"}


@pytest.mark.vllm
def test_each_step_gets_the_servers_it_calls_and_the_next_step_stops_them(
        collected: Path, warm_tiny_model: Path, vllm_python: Path, tmp_path: Path) -> None:
    """normalize calls the normalizer, served by the vLLM CPU server; states-dev (after
    collect-dev, in process, wrote the reserve's trajectories) calls no model, so its server is
    stopped before it starts."""
    run_dir = tmp_path / "run"
    shutil.copytree(collected, run_dir)
    (run_dir / "data" / "goals.jsonl").unlink()  # normalize runs again, on the served model
    normalizer = json.dumps({"backend": "openai", "model": "tiny", "max_retries": 1,
                             "timeout_s": 120})
    served = json.dumps({"tiny": {"path": str(warm_tiny_model), "dtype": "float32",
                                  "enforce_eager": True, "max_model_len": 4096}})
    args = ["--recipe", str(SMOKE), *_sets(
        warm_tiny_model, run_dir, f"models.normalizer={normalizer}", f"serve.models={served}",
        f"serve.python={vllm_python}", "serve.startup_timeout_s=300", "router.tau_au=null",
        "router.tau_eu=null", "router.calibration.dev_states=calibration/states_dev.jsonl",
        "router.calibration.n_states=2"), "--only", "collect-dev,normalize,states-dev"]
    done = _prour("run", *args)
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-2000:]
    order = [out.index(text) for text in (
        "== normalize: start", "serving for normalize: tiny (roles normalizer)", "ready after",
        "== normalize: done", "== states-dev: start", "stopped server tiny (pid ",
        "the next step does not call it", "== states-dev: done")]  # stopped before its child
    assert order == sorted(order)
    pid = int(re.search(r"stopped server tiny \(pid (\d+)\)", out).group(1))
    assert not Path(f"/proc/{pid}").exists() or \
        Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    files = list((run_dir / "endpoints").glob("*.json"))
    assert len(files) == 1 and f"--set endpoints_file={files[0]}" in out  # the child read it
    record = json.loads(files[0].read_text())
    assert record["status"] == "stopped" and record["servers"] == {}
    assert (run_dir / "data" / "goals.jsonl").is_file()
    log = (run_dir / "logs" / "normalize.log").read_text()
    ran = [line for line in log.splitlines() if line.startswith("$ prour normalize")][-1]
    assert f"endpoints_file={files[0]}" in ran  # appended after the copied folder's own run
