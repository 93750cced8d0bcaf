"""Fault cells of ``prour eval`` (tests/faults/matrix.py lists every cell): a real ``prour eval``
process on scripted models (method ``base``), a fault, then the fault removed and a rerun; the
episodes and result lines are counted by key against the plan an uninterrupted run carries out
(the split's first tasks of each domain times the seeds, every key exactly once). The faulty
backend is tests/faults/test_collect_faults.py's small HTTP server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_collect_faults import KINDS, Faulty, _served_agent

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))  # test_bad_setups: tmpfs

from prour.interrupt import INTERRUPTED_EXIT
from prour.runlock import LOCK_FILE

DOMAINS, SEEDS, TASKS = ("retail",), (0, 1), 2
WAIT_S = 240.0
FULL = pytest.mark.full
AGENT = {"rules": [{"pattern": r"^(?!.*calls tool)",
                    "reply": '<tool_call>{"name": "list_all_product_types", "arguments": {}}'
                             '</tool_call>'}],
         "default": "Thank you. Your request is complete."}
USER = {"rules": [{"pattern": r"complete\.\s*\Z", "reply": "###STOP###"}],
        "default": "Hi, I need help with an item from my order."}


def _recipe(tmp_path: Path, domains: tuple[str, ...] = DOMAINS, tasks: int = TASKS,
            **agent: Any) -> Path:
    models = {}
    for role, rules in (("agent", AGENT), ("user", USER)):
        script = tmp_path / f"{role}.yaml"
        script.write_text(yaml.safe_dump(rules))
        models[role] = {"backend": "scripted", "script": str(script)}
    models["agent"].update(agent)
    recipe = {"name": "eval-faults", "run_dir": str(tmp_path), "models": models,
              "env": {"max_steps": 10},
              "eval": {"methods": ["base"], "seeds": list(SEEDS), "domains": list(domains),
                       "max_tasks": tasks, "concurrency": 1}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _planned(domains: tuple[str, ...] = DOMAINS, tasks: int = TASKS) -> Counter:
    """The keys an uninterrupted evaluation stores, each once (the plan: the eval split's first
    ``tasks`` tasks of each domain times the seeds, not the code under test)."""
    from prour.config.eval import EvalConfig
    from prour.env.domains import select_tasks

    split = EvalConfig().split
    return Counter({(d, t.id, s): 1 for d in domains
                    for t in select_tasks(d, split, max_tasks=tasks) for s in SEEDS})


def _run(recipe: Path) -> Path:
    return recipe.parent / "eval"


def _stored(path: Path) -> Counter:
    """(domain, task, seed) of every complete line of an episodes or results file, counted."""
    keys: Counter = Counter()
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        key = record.get("key") or (record["domain"], record["task_id"], record["seed"])
        keys[tuple(key[:3])] += 1
    return keys


def _latest_results(run: Path) -> dict[tuple, dict]:
    lines = [json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()]
    return {tuple(line["key"][:3]): line for line in lines}


def _start(recipe: Path, log: Path, **env: str) -> subprocess.Popen:
    with open(log, "wb") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "prour.cli.main", "eval", "--recipe", str(recipe), "--out",
             str(_run(recipe)), "--no-progress"], stdout=output, stderr=subprocess.STDOUT,
            env={**os.environ, **env})


def _clean(log: Path) -> str:
    text = log.read_text()
    assert "Traceback" not in text, text
    return text


def _rerun_completes(recipe: Path, tmp_path: Path, **plan: Any) -> str:
    """The fault removed: a rerun exits 0, every planned key has one episode and one latest
    result line without an error, and the lock is freed."""
    log = tmp_path / "rerun.log"
    assert _start(recipe, log).wait(timeout=WAIT_S) == 0, log.read_text()
    run = _run(recipe)
    latest = _latest_results(run)
    assert Counter(latest.keys()) == _planned(**plan)
    assert not any(line["error"] for line in latest.values())
    assert not (run / LOCK_FILE).exists()
    return _clean(log)


@pytest.mark.parametrize("how", ["SIGTERM", pytest.param("slurm-repeated-SIGTERM",
                                                       marks=FULL)])
def test_a_signal_mid_run_saves_reports_frees_the_lock_and_a_rerun_completes(tmp_path, how):
    """SIGTERM after the first episode: exit 130, one 'interrupted:' line naming the episodes
    saved and the rerun, the lock freed, no episode twice. Inside a Slurm job (SLURM_JOB_ID)
    Slurm's second SIGTERM 1.5 s later is its own repetition: still one report. The rerun runs
    only the missing episodes: every planned key once."""
    recipe = _recipe(tmp_path)
    run, log = _run(recipe), tmp_path / "eval.log"
    episodes = run / "episodes.jsonl"
    proc = _start(recipe, log, **({"SLURM_JOB_ID": "4242"} if how.startswith("slurm") else {}))
    deadline = time.monotonic() + WAIT_S
    while not _stored(episodes):
        assert proc.poll() is None, f"eval ended (exit {proc.returncode}) before an episode"
        assert time.monotonic() < deadline, "no episode in time"
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    if how.startswith("slurm"):
        time.sleep(1.5)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=WAIT_S) == INTERRUPTED_EXIT, log.read_text()
    text = _clean(log)
    saved = _stored(episodes)
    reports = [line for line in text.splitlines() if line.startswith("interrupted:")]
    assert len(reports) == 1, text
    assert reports[0].startswith(f"interrupted: {sum(saved.values())} episodes saved in "
                                 f"{episodes}"), reports[0]
    assert "rerun the same `prour eval`" in reports[0] and "exit 130" in reports[0]
    assert "stopped at once" not in text
    assert not (run / LOCK_FILE).exists()
    assert max(saved.values()) == 1 and sum(saved.values()) < sum(_planned().values())
    kept = episodes.read_bytes()
    _rerun_completes(recipe, tmp_path)
    assert episodes.read_bytes().startswith(kept)  # what was saved was kept, not run again
    assert _stored(episodes) == _planned()
    assert _stored(run / "results.jsonl") == _planned()


ONE = {"domains": ("retail",), "tasks": 1}  # two episodes (one task, two seeds)


@pytest.mark.parametrize("kind", [pytest.param(KINDS[0], marks=FULL), KINDS[1],
                                  pytest.param(KINDS[2], marks=FULL)])
def test_a_transient_backend_fault_is_retried_and_counted(tmp_path, kind):
    """The first 2 requests fail, the retries succeed: exit 0, every key once, and the summary
    counts the 2 retried requests with 0 episodes still errored."""
    server = Faulty(kind, failures=2)
    try:
        recipe = _recipe(tmp_path, **ONE, **_served_agent(server, retries=3))
        log = tmp_path / "eval.log"
        assert _start(recipe, log).wait(timeout=WAIT_S) == 0, log.read_text()
    finally:
        server.close()
    text = _clean(log)
    assert _stored(_run(recipe) / "results.jsonl") == _planned(**ONE)
    assert ("retried: 0 errored episode(s) of an earlier run, 2 request(s) after a transient "
            "backend error; 0 episode(s) still errored") in text, text
    assert server.posts > 2


@FULL
@pytest.mark.parametrize("kind", KINDS)
def test_a_persistent_backend_fault_fails_the_eval_then_a_rerun_retries_the_errored(tmp_path,
                                                                                   kind):
    """Every request fails: each episode errors after 1 + max_retries attempts, eval exits 1 with
    one error line naming the backend's failure and the rerun, the lock freed; with the backend
    fixed the rerun runs both errored episodes again and says so, each key once."""
    server = Faulty(kind, failures=None)
    try:
        recipe = _recipe(tmp_path, **ONE, **_served_agent(server, retries=1))
        log = tmp_path / "eval.log"
        assert _start(recipe, log).wait(timeout=WAIT_S) == 1, log.read_text()
    finally:
        server.close()
    text = _clean(log)
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, text
    assert f"POST {server.url}/chat/completions failed after 2 attempt(s)" in errors[0]
    assert "rerun the same command" in errors[0]
    assert "2 episode(s) still errored" in text
    assert not (_run(recipe) / LOCK_FILE).exists()
    healthy = Faulty(kind, failures=0)  # the backend fixed, the same settings (its own port)
    try:
        fixed = _recipe(tmp_path, **ONE, **_served_agent(healthy, retries=1))
        text = _rerun_completes(fixed, tmp_path, **ONE)
    finally:
        healthy.close()
    assert ("retried: 2 errored episode(s) of an earlier run, 0 request(s) after a transient "
            "backend error; 0 episode(s) still errored") in text, text


def test_a_torn_last_episode_is_run_again_and_every_key_stored_once(tmp_path):
    """A kill mid-write leaves the last episode torn and no results.jsonl (results are written
    at the end): the rerun runs that episode again on a fresh line, keeps the other, and stores
    every key once."""
    recipe = _recipe(tmp_path, **ONE)
    log = tmp_path / "eval.log"
    assert _start(recipe, log).wait(timeout=WAIT_S) == 0, log.read_text()
    run = _run(recipe)
    episodes = run / "episodes.jsonl"
    first, last = episodes.read_bytes().splitlines(keepends=True)
    episodes.write_bytes(first + last[: len(last) // 2])
    (run / "results.jsonl").unlink()
    _rerun_completes(recipe, tmp_path, **ONE)
    assert episodes.read_bytes().startswith(first)  # the complete one kept, not run again
    assert _stored(episodes) == _planned(**ONE)
    assert _stored(run / "results.jsonl") == _planned(**ONE)


@pytest.mark.parametrize("fault", ["read-only", "full"])
def test_a_read_only_or_full_run_folder_is_one_line_then_a_rerun_stores_every_key_once(tmp_path,
                                                                                       fault):
    """--out on a small tmpfs, read-only or with nothing free: exit 1, one line naming the file
    system and the fix, no lock left; remounted or freed, the rerun stores every key once."""
    from test_bad_setups import tmpfs

    recipe = _recipe(tmp_path, **ONE)
    mount = tmp_path / "eval"  # _run(recipe): the --out folder is the mount itself
    with tmpfs(mount, "8m", read_only=fault == "read-only"):
        filler = mount / "filler"
        if fault == "full":
            with open(filler, "wb") as handle, pytest.raises(OSError):
                while True:
                    handle.write(b"\0" * 65536)
                    handle.flush()
        log = tmp_path / "eval.log"
        assert _start(recipe, log).wait(timeout=WAIT_S) == 1, log.read_text()
        text = _clean(log)
        errors = [line for line in text.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1, text
        assert f"cannot write {mount}" in errors[0], errors[0]
        assert (f"the file system ({mount}) is read-only" if fault == "read-only" else
                f"no space left on the device ({mount})") in errors[0], errors[0]
        assert not (mount / LOCK_FILE).exists()
        if fault == "read-only":
            subprocess.run(["mount", "-o", "remount,rw", str(mount)], check=True)
        else:
            filler.unlink()
        _rerun_completes(recipe, tmp_path, **ONE)
        assert _stored(mount / "episodes.jsonl") == _planned(**ONE)
        assert _stored(mount / "results.jsonl") == _planned(**ONE)
