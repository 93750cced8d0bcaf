"""Flaky-server cells of the fault matrix (tests/faults/matrix.py, ``FLAKY``): a real ``prour
eval`` and a real ``prour train`` (local backend) against servers that fail a seeded share of
requests (tests/flaky_openai.py: HTTP 500, a hang past the client's time limit, a connection
dropped mid-reply, a latency spike), each run beside the same command against the same server
answering cleanly. The scripted models' logic runs behind the servers, so both runs ask the same
requests: what the flaky run records must equal what the clean one does (every episode and every
reward once, none invented), and what it reports of its requests (attempts, failures by kind,
their share, retries, requests given up) must equal what the flaky server says it did."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from flaky_openai import KINDS, FlakyServer, scripted_answer
from test_eval_faults import AGENT, WAIT_S, _clean, _planned, _recipe, _run, _start, _stored

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))  # the tiny trainer

from prour.llm.retry import RequestCounts
from prour.runlock import LOCK_FILE

FULL = pytest.mark.full
MIXED = {kind: 0.1 for kind in KINDS}  # 30% of the attempts fail, 10% more are slow
SHARE = 0.35  # a single kind's share in its own cell
TIMEOUT_S = 6.0  # well past a loaded machine's answer time: a timeout is a drawn one
EVAL = {"domains": ("retail",), "tasks": 3}  # three tasks x two seeds: six episodes


def _served(server: FlakyServer, retries: int = 8) -> dict[str, Any]:
    return {"backend": "openai", "base_url": server.url, "model": "m", "script": None,
            "max_retries": retries, "timeout_s": TIMEOUT_S, "retry_budget_s": 60.0}


def _flaky(answer: Any, rates: dict[str, float], seed: int = 11) -> FlakyServer:
    return FlakyServer(answer, rates, seed=seed, hang_s=TIMEOUT_S + 1.5, spike_s=0.4)


def _expected(clean: FlakyServer, flaky: FlakyServer) -> RequestCounts:
    """What the flaky run must report: the clean run's requests (the same ones), the flaky
    server's POSTs as attempts and its faults as failed attempts, each retried once."""
    errors = flaky.errors()
    return RequestCounts(requests=clean.posts, attempts=flaky.posts,
                         retries=sum(errors.values()), **errors)


# ---- prour eval --------------------------------------------------------------------------------


def _eval(tmp_path: Path, server: FlakyServer, name: str) -> tuple[Path, str]:
    """``prour eval`` of the six episodes with the agent served by ``server``: (run folder, log)."""
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    recipe = _recipe(folder, **EVAL, **_served(server))
    data = yaml.safe_load(recipe.read_text())
    data["eval"]["concurrency"] = 2  # two episodes at once: their requests interleave
    recipe.write_text(yaml.safe_dump(data))
    log = folder / "eval.log"
    code = _start(recipe, log).wait(timeout=WAIT_S)
    assert code == 0, log.read_text()
    return _run(recipe), _clean(log)


def _outcomes(run: Path) -> dict[tuple, tuple]:
    """Each episode's (domain, task, seed) -> its reward, termination, errors and conversation
    (role and text of every message): what must not depend on the server's faults."""
    out = {}
    for line in (run / "episodes.jsonl").read_text().splitlines():
        episode = json.loads(line)
        talk = tuple((m.get("role"), m.get("content")) for m in episode["messages"])
        out[(episode["domain"], episode["task_id"], episode["seed"])] = (
            episode["reward"], episode["termination"], episode["errors"], talk)
    return out


@pytest.mark.parametrize("rates", [
    pytest.param(MIXED, id="mixed"),
    *(pytest.param({kind: SHARE}, id=kind, marks=FULL) for kind in KINDS)])
def test_an_eval_against_a_flaky_server_stores_every_episode_once_and_reports_its_errors(
        tmp_path, rates):
    """The agent's server fails its seeded share: the episodes are those of the clean run, each
    stored once in episodes.jsonl and results.jsonl, none errored; the summary's line for the
    agent and the queue's session record count the flaky server's POSTs, its faults by kind and
    their share, and as many retries, and the retried-requests line says the same number."""
    with _flaky(scripted_answer(AGENT), {}) as clean:
        clean_run, _ = _eval(tmp_path, clean, "clean")
    with _flaky(scripted_answer(AGENT), rates) as flaky:
        run, text = _eval(tmp_path, flaky, "flaky")
    assert sum(flaky.faults.values()) > 0, "the seed drew no fault: pick another"
    planned = _planned(**EVAL)
    assert _stored(run / "episodes.jsonl") == planned  # each episode once
    assert _stored(run / "results.jsonl") == planned
    assert _outcomes(run) == _outcomes(clean_run)  # the faults changed no outcome
    assert not any(json.loads(line)["error"]
                   for line in (run / "results.jsonl").read_text().splitlines())
    expected = _expected(clean, flaky)
    assert f"requests to agent: {expected.text()}" in text.splitlines(), text
    assert (f"retried: 0 errored episode(s) of an earlier run, {expected.retries} request(s) "
            "after a transient backend error; 0 episode(s) still errored") in text, text
    session = json.loads((run / "queue.jsonl").read_text().splitlines()[-1])
    assert session["requests"] == {"agent": expected.record()}
    assert session["requests"]["agent"]["error_share"] == round(
        sum(flaky.errors().values()) / flaky.posts, 4)
    if set(rates) == {"latency-spike"}:
        assert expected.failed == 0 and flaky.faults["latency-spike"] > 0


@FULL
def test_an_eval_whose_retries_run_out_errs_those_episodes_once_and_a_rerun_completes(tmp_path):
    """No retries (max_retries 0) against a server failing 35% of attempts with HTTP 500: each
    failed request fails its episode, which is stored once as errored and counted as given up;
    eval exits 1 naming the share; the rerun with retries runs exactly those episodes again and
    every key ends with one line that did not error."""
    rates = {"http-500": SHARE}
    flaky = _flaky(scripted_answer(AGENT), rates)
    folder = tmp_path / "flaky"
    folder.mkdir()
    try:
        recipe = _recipe(folder, **EVAL, **_served(flaky, retries=0))
        log = folder / "eval.log"
        assert _start(recipe, log).wait(timeout=WAIT_S) == 1, log.read_text()
    finally:
        flaky.close()
    text = _clean(log)
    run = _run(recipe)
    planned = _planned(**EVAL)
    assert _stored(run / "episodes.jsonl") == planned  # errored ones stored once too
    errored = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    errored = [line for line in errored if line["error"]]
    assert errored and len(errored) == flaky.faults["http-500"]  # one failed request each
    counts = RequestCounts(requests=flaky.posts, attempts=flaky.posts, http=len(errored),
                           gave_up=len(errored))
    assert f"requests to agent: {counts.text()}" in text.splitlines(), text
    assert not (run / LOCK_FILE).exists()
    with _flaky(scripted_answer(AGENT), rates) as again:
        recipe = _recipe(folder, **EVAL, **_served(again, retries=8))
        log = folder / "rerun.log"
        assert _start(recipe, log).wait(timeout=WAIT_S) == 0, log.read_text()
    text = _clean(log)
    assert f"retried: {len(errored)} errored episode(s) of an earlier run" in text, text
    latest = {tuple(json.loads(x)["key"][:3]): json.loads(x)
              for x in (run / "results.jsonl").read_text().splitlines()}
    assert Counter(latest.keys()) == planned
    assert not any(line["error"] for line in latest.values())
    episodes = _stored(run / "episodes.jsonl")
    assert sum(episodes.values()) == len(planned) + len(errored)  # only the errored ran again


# ---- prour train (local) -----------------------------------------------------------------------

USER = {"rules": [], "default": "I want to exchange the items I received in my order."}
VERIFIER = {"rules": [], "default": "How can I help you?"}
VARYING = ("time_", "_per_s", "_http_")  # seconds and request counts differ; nothing else may


def _train_run(tmp_path: Path, name: str, model_dir: Path, user: FlakyServer,
               verifier: FlakyServer, steps: int, verifier_retries: int = 8,
               verify_only: bool = False, **train: Any) -> list[dict[str, Any]]:
    """``prour train`` (local) on a clarify and a verify state of tau2 (``verify_only``: the
    verify state alone), the strict user and the verifier served: its metrics lines (exit 0, no
    traceback, no lock left)."""
    import yaml
    from test_checkpoint import _recipe_file, _train
    from test_local import _tau2_rows

    from prour.data.dataset import write_rows

    rows = _tau2_rows()[1:] if verify_only else _tau2_rows()
    data = write_rows(rows, tmp_path / f"{name}.parquet")
    path = _recipe_file(tmp_path, name, model_dir, data)
    recipe = yaml.safe_load(path.read_text())
    recipe["models"].update(strict_user=_served(user),
                            verifier=_served(verifier, retries=verifier_retries))
    recipe["reward"] = {"responder_retries": 0, "responder_max_tokens": 16,
                        "verifier_max_steps": 1}
    recipe["train"].update(total_steps=steps, states_per_step=len(rows), **train)
    recipe["train"]["rollout"] = {"n": 6, "keep": 5, "max_response_tokens": 24}
    path.write_text(yaml.safe_dump(recipe))
    proc = _train(path)
    log = proc.communicate(timeout=600)[0]
    assert proc.returncode == 0 and "Traceback" not in log, log
    out = tmp_path / "ckpt" / name
    assert not (out / LOCK_FILE).exists()
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _rewards(line: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in line.items() if not any(part in k for part in VARYING)}


def _counted(lines: list[dict[str, Any]], role: str) -> RequestCounts:
    """A role's requests summed over the metrics lines (attempts, failed, retries, given up)."""
    total = lambda what: sum(line.get(f"{role}_http_{what}", 0) for line in lines)
    return RequestCounts(attempts=total("attempts"), http=total("failed"),
                         retries=total("retries"), gave_up=total("gave_up"))


@pytest.mark.parametrize("rates", [
    pytest.param(MIXED, id="mixed"),
    *(pytest.param({kind: SHARE}, id=kind, marks=FULL) for kind in KINDS)])
def test_training_against_flaky_responders_records_every_reward_once_and_counts_the_errors(
        format_policy_dir, tmp_path, rates):
    """The strict user and the verifier fail their seeded share (retried by the client): two
    steps, one metrics line each, whose samples, rewards and update equal those of the clean run
    (none lost, none invented); each line counts its responders' attempts, failures, retries
    and error share, and summed they are what the flaky servers did."""
    with _flaky(scripted_answer(USER), {}) as user, \
            _flaky(scripted_answer(VERIFIER), {}) as verifier:
        clean = _train_run(tmp_path, "clean", format_policy_dir, user, verifier, steps=2)
    with _flaky(scripted_answer(USER), rates, seed=5) as user, \
            _flaky(scripted_answer(VERIFIER), rates, seed=6) as verifier:
        flaky = _train_run(tmp_path, "flaky", format_policy_dir, user, verifier, steps=2)
    assert [line["step"] for line in flaky] == [1, 2]  # each step's rewards recorded once
    assert [_rewards(line) for line in flaky] == [_rewards(line) for line in clean]
    assert sum(user.faults.values()) + sum(verifier.faults.values()) > 0, "no fault drawn"
    for role, server in (("strict_user", user), ("verifier", verifier)):
        failed = sum(server.errors().values())
        assert _counted(flaky, role) == RequestCounts(attempts=server.posts, http=failed,
                                                      retries=failed), role
        for line in flaky:  # a step that asked the role nothing has no counts of it
            if f"{role}_http_attempts" in line:
                attempts, bad = line[f"{role}_http_attempts"], line[f"{role}_http_failed"]
                assert line[f"{role}_http_error_share"] == round(bad / attempts, 4), (role, line)
    assert all(line["n_failed"] == 0 for line in flaky)


def test_a_responder_whose_retries_run_out_fails_its_samples_and_invents_no_reward(
        format_policy_dir, tmp_path):
    """The verifier fails every attempt, so each request's retries run out: the step's
    questions (the same ones the clean run asked) are failed samples, all of them counted in
    n_failed, and none gets a reward: the step's reward mean is over the outputs that asked
    nothing alone (0 for NO, the invalid-format penalty -1 for a broken one), and the verifier's
    counts say every request was given up."""
    loose = {"max_failed_ask_fraction": 1.0}  # record the step, however many failed
    with _flaky(scripted_answer(USER), {}) as user, \
            _flaky(scripted_answer(VERIFIER), {}) as verifier:
        clean = _train_run(tmp_path, "clean", format_policy_dir, user, verifier, 1,
                           verify_only=True, **loose)[0]
    with _flaky(scripted_answer(USER), {}) as user, \
            _flaky(scripted_answer(VERIFIER), {"http-500": 1.0}) as verifier:
        flaky = _train_run(tmp_path, "down", format_policy_dir, user, verifier, 1,
                           verifier_retries=1, verify_only=True, **loose)[0]
    asks = clean["n_valid"]
    assert asks > 0 and clean["n_failed"] == 0, "the clean run asked no question"
    assert clean["reward_mean_verify"] is not None
    assert (flaky["n_sampled"], flaky["n_valid"]) == (clean["n_sampled"], asks)  # same outputs
    assert flaky["n_failed"] == asks and flaky["failed_ask_fraction"] == 1.0
    rest = flaky["n_none"] + flaky["n_invalid"]
    assert rest == flaky["n_sampled"] - asks
    assert flaky["reward_mean"] == (-flaky["n_invalid"] / rest if rest else None)
    # the first request given up cancels the rest of its batch (in flight or waiting to retry):
    # every POST the server got failed, the client saw no answer, and counted at least one give-up
    assert verifier.posts == verifier.faults["http-500"] > 0
    failed, attempts = flaky["verifier_http_failed"], flaky["verifier_http_attempts"]
    assert 0 < failed <= verifier.posts <= attempts
    assert flaky["verifier_http_error_share"] == round(failed / attempts, 4)
    assert flaky["verifier_http_gave_up"] > 0
    assert "strict_user_http_attempts" not in flaky  # a verify state asks no strict user
