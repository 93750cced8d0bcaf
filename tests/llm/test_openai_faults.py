"""The ``openai`` backend against a local scripted HTTP server (no vLLM): faults and parsing."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

import pytest
import wall_clock

from prour.llm.base import BackendError, ChatRequest, SamplingParams, ScoreRequest
from prour.llm.openai import OpenAILLM, prompt_logprobs_of

SECRET = "sk-test-0123456789abcdef"
Reply = tuple[int, dict[str, Any] | None]  # (status, JSON body); status 0 closes, -1 hangs
HANG_S = 30.0  # how long a hanging reply holds its request (released early when the test ends)


class FakeServer:
    """A threaded HTTP server whose reply to each POST comes from ``respond(path, body)``."""

    def __init__(self, respond: Callable[[str, dict[str, Any]], Reply], hold_s: float = 0.0):
        self.respond = respond
        self.hold_s = hold_s
        self.requests: list[tuple[str, dict[str, Any], dict[str, str]]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.release = threading.Event()
        self._lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def count(self, path: str) -> int:
        return sum(1 for p, _, _ in self.requests if p == path)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                with server._lock:
                    server.requests.append((self.path, body, dict(self.headers)))
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    status, reply = server.respond(self.path, body)
                    if server.hold_s:
                        time.sleep(server.hold_s)
                finally:
                    with server._lock:
                        server.in_flight -= 1
                if status == -1:
                    server.release.wait(HANG_S)
                    return
                if status == 0:
                    return  # close the connection without any response
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if status == 429:
                    self.send_header("Retry-After", "0")
                self.end_headers()
                self.wfile.write(data)

        return Handler

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def scripted(*statuses: int, after: Reply | None = None) -> Callable[[str, dict[str, Any]], Reply]:
    """Reply with the given statuses in order (error bodies), then ``after`` forever."""
    queue = list(statuses)
    lock = threading.Lock()

    def respond(path: str, body: dict[str, Any]) -> Reply:
        with lock:
            status = queue.pop(0) if queue else None
        if status is None:
            return after or (200, chat_body(["ok"]))
        return status, {"error": {"message": f"scripted failure {status}", "code": status}}

    return respond


def chat_body(contents: list[str], **message_extra: Any) -> dict[str, Any]:
    """A well-formed chat completion with one choice per content."""
    choices = [
        {
            "index": i,
            "message": {"role": "assistant", "content": c, **message_extra},
            "finish_reason": "stop",
        }
        for i, c in enumerate(contents)
    ]
    return {"choices": choices, "usage": {"prompt_tokens": 7, "completion_tokens": 3}}


@pytest.fixture
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("PROUR_TEST_KEY", SECRET)
    return SECRET


def make_llm(server: FakeServer, **kwargs: Any) -> OpenAILLM:
    options = {
        "timeout_s": 2.0,
        "max_retries": 2,
        "max_concurrency": 8,
        "backoff_s": 0.01,
        "api_key_env": "PROUR_TEST_KEY",
    }
    return OpenAILLM(server.url, "tiny", **{**options, **kwargs})


def one_chat(llm: OpenAILLM, n: int = 1) -> list[Any]:
    request = ChatRequest(
        messages=[{"role": "user", "content": "hi"}], sampling=SamplingParams(n=n)
    )
    return llm.chat([request])[0]


@pytest.fixture
def llm_factory() -> Iterator[Callable[..., OpenAILLM]]:
    made: list[OpenAILLM] = []

    def factory(server: FakeServer, **kwargs: Any) -> OpenAILLM:
        made.append(make_llm(server, **kwargs))
        return made[-1]

    yield factory
    for llm in made:
        llm.close()


# ---- faults --------------------------------------------------------------------------------


def test_500s_retried_a_bounded_number_of_times_then_clear_error(
    llm_factory, api_key, caplog
) -> None:
    with FakeServer(scripted(*[500] * 10)) as server:
        llm = llm_factory(server, max_retries=2)
        with caplog.at_level(logging.DEBUG), pytest.raises(BackendError) as info:
            one_chat(llm)
    assert server.count("/v1/chat/completions") == 3
    message = str(info.value)
    assert server.url.removesuffix("/v1") + "/v1/chat/completions" in message
    assert "3 attempt" in message and "HTTP 500" in message and "scripted failure 500" in message
    assert "retrying" in caplog.text  # the retries were logged ...
    assert api_key not in message and api_key not in caplog.text  # ... without the key
    assert api_key not in repr(llm)


def test_hanging_server_times_out_without_hanging(llm_factory, api_key) -> None:
    with FakeServer(scripted(-1, -1, -1, -1)) as server:  # each request hangs for HANG_S
        llm = llm_factory(server, timeout_s=0.4, max_retries=2)
        start = time.monotonic()
        with pytest.raises(BackendError, match=r"timed out after 0.4 s"):
            one_chat(llm)
        elapsed = time.monotonic() - start
    assert server.count("/v1/chat/completions") == 3
    worst = wall_clock.retried_worst_s(llm.timeout_s, llm.max_retries + 1, llm.backoff_s)
    assert wall_clock.bound(worst) < HANG_S  # the bound tells a timeout from a hang
    assert 3 * 0.4 <= elapsed < wall_clock.bound(worst)


def test_closed_connection_retried_then_clear_error(llm_factory, api_key) -> None:
    with FakeServer(scripted(0, 0, 0, 0, 0)) as server:
        llm = llm_factory(server, max_retries=3)
        with pytest.raises(BackendError, match=r"4 attempt\(s\).*RemoteProtocolError"):
            one_chat(llm)
    assert server.count("/v1/chat/completions") == 4


def test_success_after_transient_errors(llm_factory, api_key) -> None:
    with FakeServer(scripted(429, 503, 0, after=(200, chat_body(["fine"])))) as server:
        llm = llm_factory(server, max_retries=3)
        completions = one_chat(llm)
    assert [c.content for c in completions] == ["fine"]
    assert server.count("/v1/chat/completions") == 4


def test_400_fails_at_once_with_server_message(llm_factory, api_key) -> None:
    def respond(path: str, body: dict[str, Any]) -> Reply:
        return 400, {"error": {"message": "max_tokens is too large", "code": 400}}

    with FakeServer(respond) as server:
        llm = llm_factory(server, max_retries=3)
        with pytest.raises(BackendError, match=r"HTTP 400: max_tokens is too large"):
            one_chat(llm)
    assert server.count("/v1/chat/completions") == 1


def test_api_key_sent_in_header_but_scrubbed_from_echoed_errors(
    llm_factory, api_key, caplog
) -> None:
    def respond(path: str, body: dict[str, Any]) -> Reply:  # a server that echoes the key back
        return 401, {"error": {"message": f"bad key {server.requests[-1][2]['Authorization']}"}}

    with FakeServer(respond) as server:
        llm = llm_factory(server)
        with caplog.at_level(logging.DEBUG), pytest.raises(BackendError) as info:
            one_chat(llm)
    assert server.requests[0][2]["Authorization"] == f"Bearer {api_key}"
    assert "bad key Bearer ***" in str(info.value)
    assert api_key not in str(info.value) and api_key not in caplog.text


def test_no_authorization_header_without_key(llm_factory, monkeypatch) -> None:
    monkeypatch.delenv("PROUR_TEST_KEY", raising=False)
    with FakeServer(scripted()) as server:
        one_chat(llm_factory(server))
    assert "Authorization" not in server.requests[0][2]


def test_closed_backend_refuses_calls(llm_factory, api_key) -> None:
    with FakeServer(scripted()) as server:
        llm = llm_factory(server)
        llm.close()
        llm.close()
        with pytest.raises(BackendError, match="closed"):
            one_chat(llm)


# ---- request shape and response parsing ----------------------------------------------------


def test_payload_passes_every_sampling_parameter(llm_factory, api_key) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    sampling = SamplingParams(
        n=2, temperature=0.7, top_p=0.9, top_k=5, max_tokens=33, stop=("X",), seed=11
    )
    request = ChatRequest(
        messages=[{"role": "user", "content": "q"}], sampling=sampling, tools=tools
    )
    with FakeServer(lambda p, b: (200, chat_body(["a"] * b["n"]))) as server:
        llm = llm_factory(server)
        llm.chat(
            [
                request,
                ChatRequest(messages=[{"role": "user", "content": "r"}], enable_thinking=True),
            ]
        )
    bodies = sorted((b for _, b, _ in server.requests), key=lambda b: b["messages"][0]["content"])
    first, second = bodies
    expected = {
        "model": "tiny",
        "n": 2,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 5,
        "max_tokens": 33,
        "stop": ["X"],
        "seed": 11,
        "tools": tools,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    assert {k: first[k] for k in expected} == expected
    assert "top_k" not in second and "tools" not in second
    assert second["chat_template_kwargs"] == {"enable_thinking": True}
    assert second["temperature"] == 1.0 and second["top_p"] == 1.0 and second["seed"] is None


def test_think_block_and_tool_calls_parsed_from_text(llm_factory, api_key) -> None:
    text = (
        "<think>\nlook up the order\n</think>\n\nLet me check.\n"
        '<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "#W1"}}\n</tool_call>'
    )
    with FakeServer(
        lambda p, b: (200, chat_body([text, "<think>\n\n</think>\n\nNO", "{bad"]))
    ) as server:
        done = one_chat(llm_factory(server), n=3)
    first, second, third = done
    assert first.text == text
    assert first.reasoning.strip() == "look up the order"
    assert first.content.strip() == "Let me check."
    assert [(c.name, c.arguments, c.error) for c in first.tool_calls] == [
        ("get_order_details", {"order_id": "#W1"}, None)
    ]
    assert (
        second.reasoning.strip() == "" and second.content.strip() == "NO" and not second.tool_calls
    )
    assert third.reasoning is None and third.content == "{bad"
    assert first.prompt_tokens == 7


def test_malformed_tool_call_block_reported_as_error(llm_factory, api_key) -> None:
    text = '<tool_call>\n{"name": "cancel", "arguments": {oops}\n</tool_call>'
    with FakeServer(lambda p, b: (200, chat_body([text]))) as server:
        (done,) = one_chat(llm_factory(server))
    assert len(done.tool_calls) == 1 and done.tool_calls[0].error


def test_server_parsed_reasoning_and_tool_calls_accepted(llm_factory, api_key) -> None:
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "find", "arguments": '{"q": 1}'}},
        {"id": "c2", "type": "function", "function": {"name": "find", "arguments": "[1]"}},
    ]
    body = chat_body(["Done."], reasoning="why", tool_calls=calls)
    with FakeServer(lambda p, b: (200, body)) as server:
        (done,) = one_chat(llm_factory(server))
    assert done.reasoning == "why" and done.content == "Done."
    assert [(c.id, c.name, c.arguments) for c in done.tool_calls] == [
        ("c1", "find", {"q": 1}),
        ("c2", "find", {}),
    ]
    assert done.tool_calls[0].error is None and "JSON object" in done.tool_calls[1].error


def test_concurrency_limit_holds_across_threads(llm_factory, api_key) -> None:
    with FakeServer(
        lambda p, b: (200, chat_body([b["messages"][0]["content"]])), hold_s=0.15
    ) as server:
        llm = llm_factory(server, max_concurrency=3)
        results: dict[int, list[str]] = {}

        def worker(k: int) -> None:
            requests = [
                ChatRequest(messages=[{"role": "user", "content": f"{k}-{i}"}]) for i in range(4)
            ]
            results[k] = [done[0].content for done in llm.chat(requests)]

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
    assert results == {k: [f"{k}-{i}" for i in range(4)] for k in range(3)}  # order kept per batch
    assert server.max_in_flight == 3


# ---- scoring over prompt log-probs ---------------------------------------------------------


def char_ids(text: str) -> list[int]:
    return [ord(ch) for ch in text]


def fake_vllm(path: str, body: dict[str, Any]) -> Reply:
    """/tokenize by characters (chat: ``role:content|``); prompt log-prob of id t is -t/1000."""
    if path == "/tokenize":
        if "messages" in body:
            think = "T" if body["chat_template_kwargs"]["enable_thinking"] else "F"
            text = "".join(f"{m['role']}:{m['content']}|" for m in body["messages"]) + think
            return 200, {"tokens": char_ids(text), "count": len(text)}
        prefix = "^" if body.get("add_special_tokens", True) else ""  # vLLM's default adds them
        return 200, {"tokens": char_ids(prefix + body["prompt"]), "count": 0}
    ids = body["prompt"]
    entries = [None] + [
        {str(t): {"logprob": -t / 1000, "rank": 3}, "1": {"logprob": -0.01, "rank": 1}}
        for t in ids[1:]
    ]
    return 200, {"choices": [{"index": 0, "text": "x", "prompt_logprobs": entries}]}


def test_score_reads_target_token_logprobs(llm_factory, api_key) -> None:
    requests = [
        ScoreRequest(context="ab", target="cd"),
        ScoreRequest(
            context=[{"role": "user", "content": "x"}], target="YES", enable_thinking=True
        ),
        ScoreRequest(context="ab", target="e"),
        ScoreRequest(context="ab", target=""),
    ]
    with FakeServer(fake_vllm) as server:
        results = llm_factory(server).score(requests)
    assert results[0].token_logprobs == pytest.approx([-0.099, -0.100])
    assert results[1].sum == pytest.approx(-(89 + 69 + 83) / 1000)
    assert results[2].token_logprobs == pytest.approx([-0.101])
    assert results[3].token_logprobs == []
    completions = [b for p, b, _ in server.requests if p == "/v1/completions"]
    assert min(b["prompt"] for b in completions) == char_ids("ab") + char_ids("cd")
    assert all(
        b["max_tokens"] == 1 and b["temperature"] == 0 and b["prompt_logprobs"] == 0
        for b in completions
    )
    # the shared text context "ab" is tokenized once; each target once
    tokenized = [b.get("prompt") for p, b, _ in server.requests if p == "/tokenize"]
    assert tokenized.count("ab") == 1 and len(tokenized) == 2 + 4


def test_prompt_logprobs_must_hold_each_target_token() -> None:
    with pytest.raises(BackendError, match="lacks token 5 at position 1"):
        prompt_logprobs_of([None, {"6": {"logprob": -1.0}}], [4, 5], 1)
    with pytest.raises(BackendError, match="2 entries for a 3-token prompt"):
        prompt_logprobs_of([None, {}], [1, 2, 3], 1)


def test_score_errors_surface_as_backend_error(llm_factory, api_key) -> None:
    with (
        FakeServer(scripted(*[500] * 20)) as server,
        pytest.raises(BackendError, match="/tokenize failed after 2 attempt"),
    ):
        llm_factory(server, max_retries=1).score([ScoreRequest(context="a", target="b")])


def test_unclosed_backend_stops_its_thread_when_collected(api_key) -> None:
    import gc

    with FakeServer(scripted()) as server:
        llm = make_llm(server)
        one_chat(llm)
        thread = llm._runner._thread
        del llm
        gc.collect()
        thread.join(5)
    assert not thread.is_alive()


def test_local_tokenizer_replaces_tokenize_endpoint(
    llm_factory, api_key, tiny_model_dir, tiny_tokenizer
) -> None:
    tok = tiny_tokenizer
    chat = [{"role": "user", "content": "Where is my order?"}]
    with FakeServer(fake_vllm) as server:
        llm = llm_factory(server, tokenizer_path=str(tiny_model_dir))
        (result,) = llm.score([ScoreRequest(context=chat, target=" #W1234567")])
    assert server.count("/tokenize") == 0
    rendered = tok.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    context = tok(rendered, add_special_tokens=False)["input_ids"]
    target = tok(" #W1234567", add_special_tokens=False)["input_ids"]
    (body,) = [b for p, b, _ in server.requests if p == "/v1/completions"]
    assert body["prompt"] == context + target
    assert rendered.endswith("<think>\n\n</think>\n\n")
    assert result.token_logprobs == pytest.approx([-t / 1000 for t in target])
