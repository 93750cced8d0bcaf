"""The client's retry policy (prour.llm.retry): the backoff with jitter and the budgets against
hand-computed numbers, and the per-label tally against what a flaky server (tests/flaky_openai.py)
says it did."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from flaky_openai import ERRORS, KINDS, FlakyServer, draw, fault_of, scripted_answer

from prour.llm import retry
from prour.llm.base import BackendError, ChatRequest, SamplingParams
from prour.llm.openai import OpenAILLM
from prour.llm.retry import RequestCounts, backoff_delay, stop_reason

ECHO = {"rules": [{"pattern": r"question (\d+)", "reply": "ok"}], "default": "ok"}


def test_backoff_doubles_and_equal_jitter_keeps_half_to_all_of_it():
    assert backoff_delay(1, 0.5, 0.0) == 0.25  # 0.5 * 2**0 * (1 + 0) / 2
    assert backoff_delay(3, 0.5, 0.5) == 1.5  # 0.5 * 2**2 * 1.5 / 2
    assert backoff_delay(2, 1.0, 0.75) == 1.75  # 1 * 2 * 1.75 / 2
    assert backoff_delay(4, 0.0, 0.3) == 0.0
    with pytest.raises(ValueError, match="retry counts from 1"):
        backoff_delay(0, 0.5, 0.1)
    with pytest.raises(ValueError, match=r"u must be in \[0, 1\)"):
        backoff_delay(1, 0.5, 1.0)


def test_a_request_stops_at_its_count_or_its_time_budget():
    assert stop_reason(2, 2, 0.1, 0.5, None) == "max_retries=2 used"
    assert stop_reason(0, 0, 0.0, 0.0, 10.0) == "max_retries=0 used"
    assert stop_reason(1, 3, 8.5, 1.5, 10.0) == "retry_budget_s=10 spent (8.5 s)"  # 8.5 + 1.5
    assert stop_reason(1, 3, 8.4, 1.5, 10.0) is None  # 9.9 < 10
    assert stop_reason(1, 3, 500.0, 60.0, None) is None  # no time budget: the count alone


def test_counts_subtract_and_say_their_share():
    before = RequestCounts(requests=3, attempts=4, http=1, retries=1)
    after = RequestCounts(requests=20, attempts=25, http=2, timeout=2, connection=1, retries=4,
                          gave_up=1)
    delta = after.minus(before)
    assert delta == RequestCounts(requests=17, attempts=21, http=1, timeout=2, connection=1,
                                  retries=3, gave_up=1)
    assert delta.failed == 4 and delta.error_share == pytest.approx(4 / 21)
    assert delta.record()["error_share"] == 0.1905 and delta.record()["failed"] == 4
    assert delta.text() == ("21 attempt(s) for 17 request(s), 4 failed (19.0%: 1 HTTP error, "
                            "2 timeouts, 1 dropped connection), 3 retried, 1 given up")
    assert RequestCounts().error_share is None
    assert RequestCounts().text() == ("0 attempt(s) for 0 request(s), 0 failed (–: no attempt), "
                                      "0 retried, 0 given up")


def test_the_flaky_server_draws_its_faults_from_the_seed_at_their_rates():
    rates = {"http-500": 0.1, "timeout": 0.05, "closed-mid-reply": 0.05, "latency-spike": 0.1}
    assert fault_of(0.05, rates) == "http-500" and fault_of(0.12, rates) == "timeout"
    assert fault_of(0.17, rates) == "closed-mid-reply" and fault_of(0.29, rates) == "latency-spike"
    assert fault_of(0.31, rates) is None
    draws = [draw(7, f"body {i}".encode(), 0) for i in range(4000)]
    assert draws == [draw(7, f"body {i}".encode(), 0) for i in range(4000)]  # seeded
    assert draw(7, b"x", 0) != draw(7, b"x", 1) != draw(8, b"x", 1)
    for kind, share in rates.items():  # 4000 draws: within 4 standard errors of the rate
        seen = sum(fault_of(u, rates) == kind for u in draws) / len(draws)
        assert abs(seen - share) < 4 * (share * (1 - share) / len(draws)) ** 0.5, kind


def _client(server: FlakyServer, label: str, **kwargs) -> OpenAILLM:
    options = {"api_key_env": "PROUR_NO_KEY", "max_concurrency": 4, "timeout_s": 3.0,
               "max_retries": 6, "backoff_s": 0.02, "label": label}
    return OpenAILLM(server.url, "m", **{**options, **kwargs})


def _ask(llm: OpenAILLM, i: int) -> str:
    request = ChatRequest(messages=[{"role": "user", "content": f"question {i}"}],
                          sampling=SamplingParams(max_tokens=8))
    return llm.chat([request])[0][0].text


@pytest.mark.parametrize("kind", KINDS)
def test_the_client_counts_every_attempt_failure_and_retry_the_server_made(kind):
    """40 requests, a third of the attempts failing as ``kind`` (seeded): every request is
    answered after retries, and the client's tally under its label is what the server did:
    its POSTs are the attempts, its faults the failed attempts by kind, each retried once."""
    label = f"flaky-{kind}"
    with FlakyServer(scripted_answer(ECHO), {kind: 0.33}, seed=3, hang_s=4.0,
                     spike_s=0.2) as server:
        llm = _client(server, label)
        before = retry.snapshot()
        try:
            with ThreadPoolExecutor(4) as pool:
                replies = list(pool.map(lambda i: _ask(llm, i), range(40)))
        finally:
            llm.close()
        counts = retry.since(before)[label]
    assert replies == ["ok"] * 40
    assert server.faults[kind] > 0, "the seed drew no fault: pick another"
    failed = sum(server.errors().values())
    assert counts == RequestCounts(requests=40, attempts=server.posts, retries=failed,
                                   **server.errors())
    assert server.posts == 40 + failed and server.answered == 40 + server.faults[
        "closed-mid-reply"]  # a reply cut mid-way was answered, then dropped
    assert counts.error_share == pytest.approx(failed / server.posts)
    if kind == "latency-spike":
        assert counts.failed == 0 and counts.retries == 0


def test_a_request_gives_up_when_its_time_budget_is_spent():
    """A server that never answers in time: with retry_budget_s=2.5 and a 1 s time limit the
    request stops after about 2.5 s, not after its 10 retries (~11 s), its last attempt cut to
    the rest of the budget; one request given up."""
    with FlakyServer(scripted_answer(ECHO), {"timeout": 1.0}, hang_s=4.0) as server:
        llm = _client(server, "flaky-budget", timeout_s=1.0, max_retries=10, backoff_s=0.01,
                      retry_budget_s=2.5)
        before = retry.snapshot()
        began = time.monotonic()
        try:
            with pytest.raises(BackendError) as caught:
                _ask(llm, 0)
        finally:
            llm.close()
        took = time.monotonic() - began
        counts = retry.since(before)["flaky-budget"]
    message = str(caught.value)
    assert f"POST {server.url}/chat/completions failed after 3 attempt(s) (retry_budget_s=2.5 " \
           "spent" in message, message
    assert "(the rest of retry_budget_s=2.5)" in message, message  # the last attempt was cut
    assert 2.4 < took < 4.0, took
    assert counts == RequestCounts(requests=1, attempts=3, timeout=3, retries=2, gave_up=1)
    assert server.posts == 3 and server.faults["timeout"] == 3


def test_errors_map_each_fault_to_the_clients_kind():
    assert set(ERRORS.values()) == set(retry.FAILURE_KINDS)
    assert set(ERRORS) | {"latency-spike"} == set(KINDS)
