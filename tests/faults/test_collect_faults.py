"""Fault cells of ``prour collect`` (tests/faults/matrix.py lists every cell): a real ``prour
collect`` process on scripted models, a fault, then the fault removed and a rerun; the records
are counted by key against the plan an uninterrupted run carries out (every key exactly once).
The faulty backend is a small HTTP server here that answers 500, hangs past the client's time
limit, or closes the connection mid-reply, for its first requests or for all of them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import data_scripts as scripts
import pytest
import yaml
from flaky_openai import LocalServer

from prour.interrupt import INTERRUPTED_EXIT
from prour.runlock import LOCK_FILE

TASKS, SEEDS = 12, (0,)
WAIT_S = 240.0
FULL = pytest.mark.full  # `make test-full`; CI runs the one cell of each family left unmarked


def _recipe(tmp_path: Path, tasks: int = TASKS, **agent: Any) -> Path:
    files = scripts.write_script_files(tmp_path / "scripts")
    models = {role: {"backend": "scripted", "script": str(files[role])}
              for role in ("agent", "user")}
    models["agent"].update(agent)
    recipe = {"name": "faults", "run_dir": str(tmp_path / "run"), "models": models,
              "env": {"max_steps": 12},
              "data": {"num_trajectories": tasks * len(SEEDS), "trial_seeds": list(SEEDS),
                       "max_tasks": tasks, "concurrency": 1, "teacher": False}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _planned(tasks: int = TASKS) -> Counter:
    """The keys an uninterrupted collection stores, each once (the plan, not the code under
    test: the data split's first ``tasks`` tasks times the seeds)."""
    from prour.env.domains import select_tasks

    return Counter({(t.id, s): 1 for t in select_tasks("retail", "train", max_tasks=tasks)
                    for s in SEEDS})


def _out(recipe: Path) -> Path:
    return recipe.parent / "run" / "data" / "trajectories.jsonl"


def _stored(path: Path) -> Counter:
    """(task, seed) of every complete record in the file, counted (a torn line is not one)."""
    keys: Counter = Counter()
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        keys[(record["task_id"], record["seed"])] += 1
    return keys


def _start(recipe: Path, log: Path, **env: str) -> subprocess.Popen:
    with open(log, "wb") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "prour.cli.main", "collect", "--recipe", str(recipe),
             "--no-progress"], stdout=output, stderr=subprocess.STDOUT,
            env={**os.environ, **env})


def _wait_for_records(proc: subprocess.Popen, out: Path, n: int = 1) -> None:
    deadline = time.monotonic() + WAIT_S
    while sum(_stored(out).values()) < n:
        assert proc.poll() is None, f"collect ended (exit {proc.returncode}) before {n} record(s)"
        assert time.monotonic() < deadline, f"no {n} record(s) within {WAIT_S:g} s"
        time.sleep(0.02)


def _clean(log: Path) -> str:
    text = log.read_text()
    assert "Traceback" not in text, text
    return text


def _rerun_completes(recipe: Path, tmp_path: Path, tasks: int = TASKS) -> str:
    """The fault removed: a rerun exits 0 and the file holds every planned key exactly once."""
    log = tmp_path / "rerun.log"
    proc = _start(recipe, log)
    assert proc.wait(timeout=WAIT_S) == 0, log.read_text()
    assert _stored(_out(recipe)) == _planned(tasks), "a record lost or stored twice"
    assert not (_out(recipe).parent / LOCK_FILE).exists()
    return _clean(log)


@pytest.mark.parametrize("how", [pytest.param("SIGINT", marks=FULL),
                                 pytest.param("SIGTERM", marks=FULL), "slurm-repeated-SIGTERM"])
def test_a_signal_mid_run_saves_reports_frees_the_lock_and_a_rerun_completes(tmp_path, how):
    """SIGINT/SIGTERM after the first record: exit 130, one 'interrupted:' line naming what was
    saved and the rerun, the lock freed. Inside a Slurm job (SLURM_JOB_ID) Slurm's second
    SIGTERM 1.5 s later is its own repetition: the save still ends with the same single report."""
    recipe = _recipe(tmp_path)
    out, log = _out(recipe), tmp_path / "collect.log"
    env = {"SLURM_JOB_ID": "4242"} if how.startswith("slurm") else {}
    proc = _start(recipe, log, **env)
    _wait_for_records(proc, out)
    signum = signal.SIGINT if how == "SIGINT" else signal.SIGTERM
    proc.send_signal(signum)
    if how.startswith("slurm"):
        time.sleep(1.5)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=WAIT_S) == INTERRUPTED_EXIT
    text = _clean(log)
    saved = _stored(out)
    reports = [line for line in text.splitlines() if line.startswith("interrupted:")]
    expected = (f"interrupted: {sum(saved.values())} trajectories saved in {out}; rerun "
                "`prour collect` with the same recipe to collect only the missing ones; "
                f"released the lock {out.parent / LOCK_FILE}; exit 130")
    assert reports == [expected], text
    assert "stopped at once" not in text
    assert not (out.parent / LOCK_FILE).exists()
    assert max(saved.values()) == 1 and sum(saved.values()) < TASKS
    _rerun_completes(recipe, tmp_path)


@FULL
@pytest.mark.parametrize("torn", [False, True])
def test_kill_minus_nine_mid_run_then_a_rerun_does_only_the_missing_work(tmp_path, torn):
    """SIGKILL after a few records (no handler runs; the lock is left behind, its process dead);
    with ``torn`` a half-written record is appended as a kill mid-write leaves it. The rerun takes
    the dead lock over, repairs the torn line, keeps the saved records and adds the rest."""
    recipe = _recipe(tmp_path)
    out = _out(recipe)
    proc = _start(recipe, tmp_path / "collect.log")
    _wait_for_records(proc, out, 2)
    proc.kill()
    proc.wait(timeout=30)
    kept = out.read_bytes()
    assert 2 <= sum(_stored(out).values()) < TASKS
    assert (out.parent / LOCK_FILE).exists()  # left by the killed process
    if torn:
        first = kept.split(b"\n")[0]
        with open(out, "ab") as handle:
            handle.write(first[: len(first) // 2])
    text = _rerun_completes(recipe, tmp_path)
    assert out.read_bytes().startswith(kept)  # what was saved was kept, not run again
    if torn:
        assert "torn" in text or "cut short" in text or "incomplete" in text, text


# ---- a faulty backend: HTTP 500, a hang past the time limit, a connection closed mid-reply -----

REPLY = {"id": "x", "object": "chat.completion", "model": "m",
         "choices": [{"index": 0, "finish_reason": "stop",
                      "message": {"role": "assistant", "content": "How can I help you?"}}],
         "usage": {"prompt_tokens": 3, "completion_tokens": 5}}


class Faulty(LocalServer):
    """An OpenAI-style server whose first ``failures`` POSTs fail as ``kind`` says (all of them
    when ``failures`` is None); the others answer one assistant message."""

    def __init__(self, kind: str, failures: int | None):
        self.kind, self.failures, self.posts = kind, failures, 0
        self.lock = threading.Lock()
        self._serve()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._send(200, {"object": "list", "data": [{"id": "m", "object": "model"}]})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with server.lock:
                    server.posts += 1
                    failing = server.failures is None or server.posts <= server.failures
                if not failing:
                    self._send(200, REPLY)
                elif server.kind == "http-500":
                    self._send(500, {"error": {"message": "engine died", "type": "Internal"}})
                elif server.kind == "timeout":
                    time.sleep(3.0)  # past the client's timeout_s of 1 s
                else:  # closed mid-reply: headers and half a body, then the connection drops
                    data = json.dumps(REPLY).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.connection.shutdown(2)

        return Handler

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _served_agent(server: Faulty, retries: int) -> dict[str, Any]:
    return {"backend": "openai", "base_url": server.url, "model": "m", "script": None,
            "max_retries": retries, "timeout_s": 1.0}


KINDS = ["http-500", "timeout", "closed-mid-reply"]


@pytest.mark.parametrize("kind", [KINDS[0], *(pytest.param(k, marks=FULL) for k in KINDS[1:])])
def test_a_transient_backend_fault_is_retried_and_counted(tmp_path, kind):
    """The first 2 requests fail, the retries succeed: exit 0, every key once, and the summary
    counts the 2 retried requests (they are not hidden) with 0 episodes still errored."""
    server = Faulty(kind, failures=2)
    try:
        recipe = _recipe(tmp_path, tasks=2, **_served_agent(server, retries=3))
        log = tmp_path / "collect.log"
        assert _start(recipe, log).wait(timeout=WAIT_S) == 0, log.read_text()
    finally:
        server.close()
    text = _clean(log)
    assert _stored(_out(recipe)) == _planned(2)
    assert ("2 trajectories in" in text and "0 errored" in text and "retried: 0 errored "
            "episode(s) of an earlier run, 2 request(s) after a transient backend error") in text
    assert server.posts > 2


@FULL
@pytest.mark.parametrize("kind", KINDS)
def test_a_persistent_backend_fault_fails_the_step_then_a_rerun_retries_the_errored(tmp_path,
                                                                                   kind):
    """Every request fails: after 1 + max_retries attempts each episode errors, collect exits 1
    with one error line naming the backend's failure and the rerun, the lock freed; with the
    backend fixed (the scripted agent) the rerun retries both errored episodes, each key once."""
    server = Faulty(kind, failures=None)
    try:
        recipe = _recipe(tmp_path, tasks=2, **_served_agent(server, retries=1))
        log = tmp_path / "collect.log"
        assert _start(recipe, log).wait(timeout=WAIT_S) == 1, log.read_text()
    finally:
        server.close()
    text = _clean(log)
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, text
    assert f"POST {server.url}/chat/completions failed after 2 attempt(s)" in errors[0]
    assert "rerun the same command" in errors[0]
    assert not (_out(recipe).parent / LOCK_FILE).exists()
    assert _stored(_out(recipe)) == _planned(2)  # stored, as errored: counted once each
    fixed = _recipe(tmp_path, tasks=2)  # the same recipe, the agent scripted again
    text = _rerun_completes(fixed, tmp_path, tasks=2)
    assert "0 errored" in text and "retried: 2 errored episode(s) of an earlier run" in text
