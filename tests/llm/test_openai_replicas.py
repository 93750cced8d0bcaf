"""The ``openai`` client over several replicas of one model, against local scripted HTTP servers
(no vLLM): each request goes to the least busy replica, and one that cannot be reached is left
out at once, its request sent to another without counting as a retry."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from test_openai_faults import FakeServer, chat_body

from prour.llm.base import BackendError, ChatRequest, SamplingParams
from prour.llm.openai import OpenAILLM, Replica, pick_replica, retried_requests


def request(i: int) -> ChatRequest:
    return ChatRequest(messages=[{"role": "user", "content": f"hi {i}"}],
                       sampling=SamplingParams(seed=i))


def ok(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    return 200, chat_body(["ok"])


def refused_url() -> str:
    """A base URL nothing listens on (a port taken from the OS and let go)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def client(url: str, *more: str, **options: Any) -> OpenAILLM:
    settings = {"api_key_env": "PROUR_NO_KEY", "max_concurrency": 8, "timeout_s": 5.0,
                "max_retries": 1, "backoff_s": 0.01, **options}
    return OpenAILLM(url, "tiny", replicas=more, **settings)


def test_the_replica_for_each_attempt() -> None:
    """Fewest in flight first (c and b have 1, a 2), then fewest sent (c: 3 < b: 9); c tried
    already: b; b left out until t=100 as well: a; every one tried: the least busy of all."""
    replicas = [Replica("a", busy=2, sent=5), Replica("b", busy=1, sent=9),
                Replica("c", busy=1, sent=3)]
    assert pick_replica(replicas, (), now=50.0) == 2
    assert pick_replica(replicas, {2}, now=50.0) == 1
    replicas[1].down_until = 100.0
    assert pick_replica(replicas, {2}, now=50.0) == 0
    assert pick_replica(replicas, {0, 1, 2}, now=50.0) == 2


def test_requests_in_flight_are_spread_over_the_replicas() -> None:
    """Eight requests at once, each held 0.3 s: the least busy replica takes the next one, so
    each of the two gets four."""
    with FakeServer(ok, hold_s=0.3) as one, FakeServer(ok, hold_s=0.3) as two:
        llm = client(one.url, two.url)
        try:
            outputs = llm.chat([request(i) for i in range(8)])
        finally:
            llm.close()
    assert [out[0].text for out in outputs] == ["ok"] * 8
    assert (one.count("/v1/chat/completions"), two.count("/v1/chat/completions")) == (4, 4)


def test_a_replica_that_cannot_be_reached_costs_no_request_and_no_retry() -> None:
    """The first replica refuses connections: the first request goes on to the live one at once
    (not a retry), and for the next ten seconds no request tries the refused one again."""
    with FakeServer(ok) as live:
        llm = client(refused_url(), live.url, max_retries=0)
        before = retried_requests()
        try:
            outputs = [llm.chat([request(i)])[0][0].text for i in range(6)]
        finally:
            llm.close()
    assert outputs == ["ok"] * 6
    assert live.count("/v1/chat/completions") == 6
    assert retried_requests() == before
    assert [r.sent for r in llm.replicas] == [1, 6]


def test_when_no_replica_answers_the_request_fails_with_its_reason() -> None:
    """Both replicas refuse: each is tried once, then the request counts an attempt and, with no
    retry left, fails naming the model's path."""
    llm = client(refused_url(), refused_url(), max_retries=0)
    try:
        with pytest.raises(BackendError, match=r"POST /v1/chat/completions of tiny failed after "
                                               r"1 attempt\(s\); last error: http://127\.0\.0\.1"):
            llm.chat([request(0)])
    finally:
        llm.close()
