"""The evaluation's one queue (prour.eval.queue) on real tau2 tasks with scripted models:

- each model (lane) stays at its own limit of requests in flight while the methods interleave;
- SIGTERM during the queued ``prour eval`` exits 130, and the rerun holds every episode exactly
  once, equal to an uninterrupted run of the same keys;
- an unknown ``eval.max_in_flight`` key is one line naming it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from test_harness import AGENT_RULES, USER_RULES, _comparable

from prour.env.trajectory import read_jsonl, read_trajectories
from prour.eval.harness import EPISODES_FILE, RESULTS_FILE, Evaluation
from prour.eval.queue import QUEUE_FILE, read_sessions
from prour.interrupt import INTERRUPTED_EXIT
from prour.recipes import load_recipe

REPO = Path(__file__).resolve().parents[2]
METHODS = ["base", "ask-before-plan"]


def _recipe(root: Path, **eval_section) -> Path:
    scripts = {}
    for name, rules in (("agent", AGENT_RULES), ("user", USER_RULES)):
        scripts[name] = root / f"{name}.yaml"
        scripts[name].write_text(yaml.safe_dump(rules))
    data = {"name": "queue", "run_dir": str(root),
            "models": {r: {"backend": "scripted", "script": str(p)} for r, p in scripts.items()},
            "env": {"max_steps": 10},
            "eval": {"methods": METHODS, "seeds": [0, 1], "domains": ["retail", "airline"],
                     "max_tasks": 2, "concurrency": 3, **eval_section}}
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_each_lane_stays_at_its_limit_while_the_methods_interleave(tmp_path, monkeypatch):
    """eval.max_in_flight holds the user's model at 1 request in flight although 3 episodes run
    at once (eval.concurrency): the agent's model, unlimited here, has more than one request in
    flight; both methods start before either is done; queue.jsonl records the session, the
    limit and the calls that waited for the user's slot."""
    from prour.env import runner
    from prour.llm.scripted import ScriptedLLM

    recipe = load_recipe(_recipe(tmp_path, max_in_flight={"user": 1}))
    evaluation = Evaluation(recipe, tmp_path / "run", progress=False)
    running, most, started = Counter(), Counter(), []
    lock, real_job, real_chat = threading.Lock(), runner.run_job, ScriptedLLM.chat
    user_script = str(tmp_path / "user.yaml")

    def track(name, step):
        with lock:
            running[name] += step
            most[name] = max(most[name], running[name])

    def counted_job(job, limits):
        track("episodes", 1)
        with lock:
            started.append(job.agent_name)
        try:
            return real_job(job, limits)
        finally:
            track("episodes", -1)

    def counted_chat(self, requests):
        name = "user" if user_script in evaluation.kit.builder.lane_of(self) else "agent"
        track(name, 1)
        try:
            time.sleep(0.01)  # long enough for a second request to arrive if the gate let it
            return real_chat(self, requests)
        finally:
            track(name, -1)

    monkeypatch.setattr(runner, "run_job", counted_job)
    monkeypatch.setattr(ScriptedLLM, "chat", counted_chat)
    try:
        results = evaluation.run()
    finally:
        evaluation.close()
    assert len(results) == len(METHODS) * 2 * 2 * 2
    assert most["user"] == 1  # every episode calls the user's model: one request at a time
    assert most["episodes"] == 3 and most["agent"] > 1  # the others' work goes on meanwhile
    assert started[:2] == METHODS  # taken in turn, not one method after another
    (session,) = read_sessions(tmp_path / "run")
    assert session["episodes"] == len(results)
    (lane,) = [v for k, v in session["lanes"].items() if "user.yaml" in k]
    assert lane["limit"] == 1 and lane["mean_requests"] <= 1.0 and lane["waited"] > 0
    assert lane["calls"] >= len(results)  # each episode's user speaks at least once


def test_an_unknown_limit_key_is_named(tmp_path):
    recipe = load_recipe(_recipe(tmp_path, max_in_flight={"Qwen/Nope": 2}))
    evaluation = Evaluation(recipe, tmp_path / "run", progress=False)
    with pytest.raises(ValueError, match=r"^eval\.max_in_flight\.Qwen/Nope: names no model role "
                                         r"\(agent, user\)"):
        evaluation.run()
    evaluation.close()


def _cli(recipe: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "prour.cli.main", "eval", "--recipe", str(recipe), "--out",
            str(out), "--no-progress"]


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.slow
def test_sigterm_during_the_queue_then_a_rerun_holds_every_episode_once(tmp_path):
    recipe = _recipe(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    stopped, clean = tmp_path / "stopped", tmp_path / "clean"
    log = tmp_path / "stopped.log"
    with open(log, "wb") as stderr:
        process = subprocess.Popen(_cli(recipe, stopped), env=env, cwd=REPO,
                                   stdout=subprocess.DEVNULL, stderr=stderr)
    deadline = time.monotonic() + 300
    while len(_lines(stopped / EPISODES_FILE)) < 3 and time.monotonic() < deadline:
        assert process.poll() is None, "the evaluation ended before the signal"
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=300) == INTERRUPTED_EXIT
    text = log.read_text()
    assert "Traceback" not in text and "SIGTERM received: stopping" in text
    before = _lines(stopped / EPISODES_FILE)
    total = len(METHODS) * 2 * 2 * 2
    assert 3 <= len(before) < total, "the signal came after the work was done"
    assert {json.loads(line)["agent"] for line in before} == set(METHODS)  # interleaved
    first = read_sessions(stopped)
    assert len(first) == 1 and first[0]["episodes"] == len(before)  # recorded when stopped

    subprocess.run(_cli(recipe, stopped), env=env, cwd=REPO, check=True, capture_output=True)
    assert _lines(stopped / EPISODES_FILE)[:len(before)] == before  # kept, not run again
    keys = [t.key for t in read_trajectories(stopped / EPISODES_FILE)]
    assert len(keys) == len(set(keys)) == total  # every episode exactly once
    results = [tuple(line["key"]) for line in read_jsonl(stopped / RESULTS_FILE)]
    assert sorted(results) == sorted(keys)
    assert len(_lines(stopped / QUEUE_FILE)) == 2

    subprocess.run(_cli(recipe, clean), env=env, cwd=REPO, check=True, capture_output=True)
    assert _comparable(stopped) == _comparable(clean)
