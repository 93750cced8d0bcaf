"""A flaky OpenAI-compatible server, for the flaky-server fault cells and
benchmarks/flaky_server.py.

Every POST draws whether it fails, and how, from a seeded hash: of the seed, the request body
and how many times that same body came before. So the draws do not depend on the order in which
concurrent clients arrive, and a run with the same seed and requests meets the same faults. A
drawn fault is one of :data:`KINDS` at its own share (``rates``):

- ``http-500``: the answer is HTTP 500 with an OpenAI error body;
- ``timeout``: no answer for ``hang_s`` seconds (past the client's time limit), then the
  connection closes;
- ``closed-mid-reply``: the headers and half the body, then the connection drops;
- ``latency-spike``: the right answer after ``spike_s`` seconds (within the client's limit).

Every other POST is answered at once by ``answer(body) -> reply body``: :func:`scripted_answer`
runs a scripted model (tests/ rules files or a dict of rules) behind the server. ``GET
/v1/models`` always answers (the preflight's health probe). The server counts what it did:
``posts``, ``faults`` by kind, ``answered``.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

KINDS = ("http-500", "timeout", "closed-mid-reply", "latency-spike")
ERRORS = {"http-500": "http", "timeout": "timeout", "closed-mid-reply": "connection"}
"""The kind of failed attempt the client counts for each fault (prour.llm.retry.FAILURE_KINDS);
a latency spike is no failure."""

Answer = Callable[[dict[str, Any]], dict[str, Any]]


def draw(seed: int, body: bytes, occurrence: int) -> float:
    """A uniform number in [0, 1) from the seed, a request body and its occurrence (0 first)."""
    digest = hashlib.sha256(f"{seed}|{hashlib.sha256(body).hexdigest()}|{occurrence}".encode())
    return int(digest.hexdigest()[:16], 16) / 16 ** 16


def fault_of(u: float, rates: Mapping[str, float]) -> str | None:
    """The fault a draw ``u`` falls in: the kinds take consecutive intervals of [0, 1) of their
    rates' widths, in :data:`KINDS` order; past them, none."""
    edge = 0.0
    for kind in KINDS:
        edge += rates.get(kind, 0.0)
        if u < edge:
            return kind
    return None


class LocalServer:
    """An HTTP server on a free loopback port, served from a daemon thread: the handler class
    comes from ``_handler()``; ``url`` is its OpenAI-style base URL."""

    def _serve(self) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.httpd.handle_error = lambda *args: None  # a client that gave up: nothing to say
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        raise NotImplementedError

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"


class FlakyServer(LocalServer):
    """The server on a free loopback port, serving in threads until :meth:`close`."""

    def __init__(self, answer: Answer, rates: Mapping[str, float], *, seed: int = 0,
                 hang_s: float = 5.0, spike_s: float = 0.5, model: str = "m"):
        unknown = set(rates) - set(KINDS)
        if unknown or any(not 0 <= r <= 1 for r in rates.values()) or sum(rates.values()) > 1:
            raise ValueError(f"rates must be shares of {KINDS} adding up to at most 1: {rates}")
        self.answer, self.rates, self.seed = answer, dict(rates), seed
        self.hang_s, self.spike_s, self.model = hang_s, spike_s, model
        self.posts, self.answered, self.faults = 0, 0, Counter()
        self._seen: Counter[str] = Counter()
        self.lock = threading.Lock()
        self._serve()

    def errors(self) -> Counter:
        """The failed attempts a client saw, by prour.llm.retry's kinds (spikes are none)."""
        return Counter({ERRORS[k]: n for k, n in self.faults.items() if k in ERRORS})

    def _fault(self, body: bytes) -> str | None:
        key = hashlib.sha256(body).hexdigest()
        with self.lock:
            occurrence = self._seen[key]
            self._seen[key] += 1
            self.posts += 1
            kind = fault_of(draw(self.seed, body, occurrence), self.rates)
            if kind is not None:
                self.faults[kind] += 1
            return kind

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: dict[str, Any], cut: bool = False) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if cut:  # half the body, then the connection drops
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.connection.shutdown(2)
                    return
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._send(200, {"object": "list",
                                 "data": [{"id": server.model, "object": "model"}]})

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                kind = server._fault(raw)
                if kind == "http-500":
                    self._send(500, {"error": {"message": "flaky engine", "type": "Internal"}})
                    return
                if kind == "timeout":
                    time.sleep(server.hang_s)
                    return
                if kind == "latency-spike":
                    time.sleep(server.spike_s)
                reply = server.answer(json.loads(raw))
                with server.lock:
                    server.answered += 1
                self._send(200, reply, cut=kind == "closed-mid-reply")

        return Handler

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def scripted_answer(script: Any) -> Answer:
    """Chat replies of a scripted model (a :class:`~prour.llm.scripted.ScriptedLLM`, a rules
    file, a registered script or the rules as a dict), shaped as an OpenAI chat completion."""
    from prour.llm.base import ChatRequest, SamplingParams
    from prour.llm.scripted import ScriptedLLM, scripted_from_config

    if isinstance(script, ScriptedLLM):
        llm = script
    elif isinstance(script, Mapping):
        rules = [(r["pattern"], r["reply"]) for r in script.get("rules", [])]
        llm = ScriptedLLM(rules=rules, default=script.get("default"))
    else:
        llm = scripted_from_config(str(script))

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        sampling = SamplingParams(n=int(body.get("n") or 1), stop=tuple(body.get("stop") or ()))
        completions = llm.chat([ChatRequest(messages=body["messages"], sampling=sampling)])[0]
        choices = [{"index": i, "finish_reason": "stop",
                    "message": {"role": "assistant", "content": c.text}}
                   for i, c in enumerate(completions)]
        words = sum(c.completion_tokens for c in completions)
        return {"id": "flaky", "object": "chat.completion", "model": body.get("model"),
                "choices": choices, "usage": {"prompt_tokens": 0, "completion_tokens": words}}

    return answer
