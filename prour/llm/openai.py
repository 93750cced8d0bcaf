"""The ``openai`` backend: an OpenAI-compatible HTTP server (vLLM) behind the :class:`LLM` protocol.

Requests of a batch run concurrently (at most ``max_concurrency`` in flight) on a private event
loop in a background thread, so the synchronous ``chat``/``score`` can be called from any thread.
Connect errors, timeouts, 5xx and 429 are retried with exponential backoff and jitter within a
count and a time budget (:mod:`prour.llm.retry`, which also tallies every attempt, failure and
retry under the client's ``label``); other 4xx fail at once with the server's message.
A model served by several replicas (``replicas``: their base
URLs besides ``base_url``) gets each request on the replica with the fewest requests in flight
(ties: the one sent the fewest); a replica that cannot be reached (connection refused or cut) is
left out for :data:`REPLICA_DOWN_S` and the request goes to another at once, without counting
as a retry, so that one replica dying mid-run costs no request. Scoring uses vLLM's prompt log-probs over the concatenation of
separately tokenized context and target ids. The API key is read from an environment variable
and never logged, repr'd or put in an error message.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Collection, Coroutine, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from prour import interrupt
from prour.llm import chat as chat_rules
from prour.llm import retry
from prour.llm.base import (
    BackendError,
    ChatRequest,
    Completion,
    ScoreRequest,
    ScoreResult,
    ToolCall,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")
REPLICA_DOWN_S = 10.0  # a replica that could not be reached is tried again after this long
RETRY_STATUS = frozenset({408, 429})
"""Statuses retried besides every 5xx: request timeout and rate limiting."""

_retried = 0  # attempts retried after a transient error, by every backend of this process
_retried_lock = threading.Lock()


def retried_requests() -> int:
    """How many attempts this process has retried after a transient error (connect error,
    timeout, 5xx, 408/429) so far, over every backend: a command reports the difference over its
    run, so retries that succeeded are counted, not hidden."""
    return _retried


def api_root(base_url: str) -> str:
    """Server root from a base URL given with or without the conventional ``/v1`` suffix."""
    root = base_url.strip().rstrip("/")
    root = root.removesuffix("/v1")
    if not root.startswith(("http://", "https://")):
        raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
    return root


def server_message(response: httpx.Response, limit: int = 500) -> str:
    """The error text a server put in its body (OpenAI ``{"error": {"message"}}`` or vLLM's)."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:limit]
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:limit]
        for key in ("message", "detail", "error"):
            if body.get(key):
                return str(body[key])[:limit]
    return json.dumps(body)[:limit]


class _TransientError(Exception):
    """One attempt failed in a way worth retrying; ``reason`` says how; ``unreachable``: the
    server could not be reached or cut the connection (not a timeout, not an HTTP status)."""

    def __init__(self, reason: str, retry_after: float | None = None, unreachable: bool = False,
                 kind: str = "http"):
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after
        self.unreachable = unreachable
        self.kind = "connection" if unreachable else kind  # one of retry.FAILURE_KINDS


class _UnreachableReplica(_TransientError):
    """Replica ``index`` could not be reached or cut the connection."""

    def __init__(self, index: int, reason: str):
        super().__init__(reason, unreachable=True)
        self.index = index


@dataclass
class Replica:
    """One server of a model: its root URL, its requests in flight, how many it was sent and
    until when it is left out (monotonic seconds)."""

    root: str
    busy: int = 0
    sent: int = 0
    down_until: float = 0.0


def pick_replica(replicas: Sequence[Replica], tried: Collection[int], now: float) -> int:
    """Index of the replica for the next attempt: among those up and not yet tried by this
    request (else those not tried, else all), the fewest in flight, then the fewest sent, then
    the first."""
    indices = range(len(replicas))
    up = [i for i in indices if i not in tried and replicas[i].down_until <= now]
    pool = up or [i for i in indices if i not in tried] or list(indices)
    return min(pool, key=lambda i: (replicas[i].busy, replicas[i].sent, i))


class _LoopThread:
    """An asyncio event loop running forever in a daemon thread; coroutines are submitted to it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="prour-openai", daemon=True
        )
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result from the calling thread."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("OpenAILLM cannot be called from inside its own event loop")
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def stop(self) -> None:
        """Stop the loop and join its thread."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()


async def _gather_or_cancel(coros: Sequence[Awaitable[T]]) -> list[T]:
    """Await all coroutines concurrently, keeping order; the first failure cancels the rest."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _tool_call_from_server(call: dict[str, Any]) -> ToolCall:
    """Convert a server-parsed OpenAI tool call (arguments as a JSON string) to a :class:`ToolCall`."""
    fn = call.get("function") or {}
    name = str(fn.get("name") or "")
    raw_args = fn.get("arguments")
    raw = json.dumps({"name": name, "arguments": raw_args}, ensure_ascii=False)
    if isinstance(raw_args, dict):
        return ToolCall(name=name, arguments=raw_args, id=str(call.get("id") or ""), raw=raw)
    try:
        args = json.loads(raw_args) if raw_args else {}
    except (TypeError, ValueError) as exc:
        return ToolCall(name, {}, str(call.get("id") or ""), raw, f"arguments are not JSON: {exc}")
    if not isinstance(args, dict):
        error = f"arguments must be a JSON object, got {type(args).__name__}"
        return ToolCall(name, {}, str(call.get("id") or ""), raw, error)
    return ToolCall(name=name, arguments=args, id=str(call.get("id") or ""), raw=raw)


def completion_from_choice(choice: dict[str, Any], prompt_tokens: int) -> Completion:
    """Build a :class:`Completion` from one chat choice, parsing think and tool-call blocks.

    Without server-side parsers the content is the raw text; with them the server's
    ``reasoning`` (``reasoning_content`` in older vLLM) and ``tool_calls`` are used as well.
    """
    message = choice.get("message") or {}
    raw_content = message.get("content") or ""
    finish = "length" if choice.get("finish_reason") == "length" else "stop"
    completion = Completion.from_text(
        raw_content,
        finish,
        prompt_tokens=prompt_tokens,
        token_ids=choice.get("token_ids"),
        logprobs=_sampled_logprobs(choice.get("logprobs")),
    )
    server_reasoning = message.get("reasoning") or message.get("reasoning_content")
    if server_reasoning is not None:
        completion.text = f"<think>{server_reasoning}</think>{raw_content}"
        completion.reasoning = server_reasoning + (completion.reasoning or "")
    server_calls = [_tool_call_from_server(c) for c in message.get("tool_calls") or []]
    completion.tool_calls = server_calls + completion.tool_calls
    return completion


def _sampled_logprobs(logprobs: dict[str, Any] | None) -> list[float] | None:
    """The log-prob of each sampled token from a chat choice's ``logprobs.content`` list."""
    if not logprobs or logprobs.get("content") is None:
        return None
    return [float(item["logprob"]) for item in logprobs["content"]]


def prompt_logprobs_of(entries: list[Any], token_ids: list[int], start: int) -> list[float]:
    """Log-prob of ``token_ids[i]`` at each position ``i >= start`` from vLLM ``prompt_logprobs``.

    vLLM returns one entry per prompt token: ``None`` for the first, else a mapping from token id
    (a JSON string key) to ``{"logprob", "rank", "decoded_token"}`` that always holds the
    prompt's own token.
    """
    if len(entries) != len(token_ids):
        raise BackendError(
            f"prompt_logprobs has {len(entries)} entries for a {len(token_ids)}-token prompt"
        )
    values = []
    for i in range(start, len(token_ids)):
        entry = entries[i]
        item = entry.get(str(token_ids[i])) if isinstance(entry, dict) else None
        if item is None:
            raise BackendError(f"prompt_logprobs lacks token {token_ids[i]} at position {i}")
        values.append(float(item["logprob"] if isinstance(item, dict) else item))
    return values


def request_key(api_key_env: str, api_key_file: str | None) -> str:
    """The key a request sends: the file's when one is named (the run's key), else the variable's."""
    if api_key_file:
        from prour.llm.run_key import read_run_key

        return read_run_key(api_key_file)
    return os.environ.get(api_key_env) or ""


class OpenAILLM:
    """:class:`prour.llm.base.LLM` over an OpenAI-compatible server (vLLM extensions used)."""

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str,
        api_key_file: str | None = None,
        max_concurrency: int,
        timeout_s: float,
        max_retries: int,
        backoff_s: float = 0.5,
        tokenizer_path: str | None = None,
        replicas: Sequence[str] = (),
        retry_budget_s: float | None = None,
        label: str | None = None,
    ):
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if max_retries < 0 or backoff_s < 0:
            raise ValueError(
                f"max_retries and backoff_s must be >= 0, got {max_retries}, {backoff_s}"
            )
        self.root = api_root(base_url)
        roots = dict.fromkeys([self.root, *(api_root(url) for url in replicas)])
        self.replicas = [Replica(root) for root in roots]
        self.model = model
        self.max_concurrency = max_concurrency
        self.timeout_s = float(timeout_s)
        self.max_retries = max_retries
        self.backoff_s = float(backoff_s)
        if retry_budget_s is not None and retry_budget_s <= 0:
            raise ValueError(f"retry_budget_s must be > 0, got {retry_budget_s}")
        self.retry_budget_s = retry_budget_s
        self.label = label or model  # the tally its attempts are counted under (prour.llm.retry)
        self._jitter = random.Random()  # spreads the waits only: no output depends on it
        self.tokenizer_path = tokenizer_path
        self._secret = request_key(api_key_env, api_key_file)
        self._local_tokenizer: Any = None
        self._runner: _LoopThread | None = _LoopThread()
        self._finalizer = weakref.finalize(self, self._runner.stop)  # if never closed
        self._client: httpx.AsyncClient = self._runner.run(self._make_client())
        self._semaphore = asyncio.Semaphore(max_concurrency)

    def __repr__(self) -> str:
        more = f", replicas={len(self.replicas)}" if len(self.replicas) > 1 else ""
        return (f"OpenAILLM(base_url={self.root!r}, model={self.model!r}, "
                f"max_concurrency={self.max_concurrency}{more})")

    async def _make_client(self) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {self._secret}"} if self._secret else {}
        limits = httpx.Limits(
            max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency
        )
        return httpx.AsyncClient(
            headers=headers, timeout=httpx.Timeout(self.timeout_s), limits=limits
        )

    def _scrub(self, text: str) -> str:
        """Remove the API key from text bound for a log line or an exception."""
        return text.replace(self._secret, "***") if self._secret else text

    def _run(self, coro_factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
        if self._runner is None:
            raise BackendError(f"{self!r} is closed")
        return self._runner.run(coro_factory())

    # ---- HTTP with retries -------------------------------------------------------------------

    async def _attempt(self, path: str, payload: dict[str, Any],
                       tried: Collection[int] = (), sent: list[float] | None = None
                       ) -> dict[str, Any]:
        """One POST under the concurrency limit and a hard time limit, to the replica
        :func:`pick_replica` gives once a slot is free; classifies failures (an unreachable
        replica is left out for :data:`REPLICA_DOWN_S`). None starts after a SIGINT/SIGTERM;
        those in flight are counted (:mod:`prour.interrupt`). ``sent`` gets the monotonic time
        the request's first attempt was sent; with ``retry_budget_s`` no attempt outlives it."""
        async with self._semaphore:
            now = time.monotonic()
            limit, cut = self.timeout_s, ""
            if sent is not None:
                sent[:] = sent or [now]
                if self.retry_budget_s is not None:
                    left = sent[0] + self.retry_budget_s - now
                    if left < limit:
                        limit = max(left, 0.001)
                        cut = f" (the rest of retry_budget_s={self.retry_budget_s:g})"
            retry.count(self.label, attempts=1)
            index = pick_replica(self.replicas, tried, now)
            replica = self.replicas[index]
            url = f"{replica.root}{path}"
            where = f"{url}: " if len(self.replicas) > 1 else ""
            replica.busy += 1
            replica.sent += 1
            try:
                with interrupt.request():
                    response = await asyncio.wait_for(
                        self._client.post(url, json=payload), limit
                    )
            except (TimeoutError, httpx.TimeoutException):
                took = f"{limit:.2f}" if cut else f"{limit:g}"
                raise _TransientError(f"{where}timed out after {took} s{cut}",
                                      kind="timeout") from None
            except httpx.TransportError as exc:
                replica.down_until = time.monotonic() + REPLICA_DOWN_S
                raise _UnreachableReplica(index, f"{where}{type(exc).__name__}: {exc}") from None
            finally:
                replica.busy -= 1
        status = response.status_code
        if status >= 500 or status in RETRY_STATUS:
            retry_after = _retry_after(response)
            raise _TransientError(f"HTTP {status}: {server_message(response)}", retry_after)
        if status >= 400:
            raise BackendError(f"POST {url}: HTTP {status}: {server_message(response)}")
        try:
            body = response.json()
        except ValueError:
            raise BackendError(
                f"POST {url}: response is not JSON: {response.text[:200]!r}"
            ) from None
        if not isinstance(body, dict):
            raise BackendError(f"POST {url}: expected a JSON object, got {type(body).__name__}")
        return body

    async def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """POST with bounded retries (``max_retries``, ``retry_budget_s``) and exponential
        backoff with jitter (:mod:`prour.llm.retry`); raises :class:`BackendError`. A replica
        that cannot be reached hands the request to another one at once (each replica once per
        request), not counted as an attempt. Attempts, failures by kind, retries and requests
        given up are counted under ``label``."""
        url = f"{self.root}{path}" if len(self.replicas) == 1 else f"{path} of {self.model}"
        attempts = self.max_retries + 1
        attempt, tried, sent = 1, set(), []
        retry.count(self.label, requests=1)
        while True:
            try:
                return await self._attempt(path, payload, tried, sent)
            except BackendError as exc:  # not worth retrying; the server may echo the key
                raise BackendError(self._scrub(str(exc))) from None
            except _TransientError as exc:
                error = exc
            retry.count(self.label, **{error.kind: 1})
            if isinstance(error, _UnreachableReplica) and len(self.replicas) > 1:
                tried.add(error.index)
                now = time.monotonic()
                if any(i not in tried and r.down_until <= now
                       for i, r in enumerate(self.replicas)):
                    logger.warning("%s; sending the request to another replica",
                                   self._scrub(error.reason))
                    continue
                tried.clear()  # no replica left to try: retry as any other failure
            reason = self._scrub(error.reason)
            delay = retry.backoff_delay(attempt, self.backoff_s, self._jitter.random())
            if error.retry_after is not None:
                delay = min(max(delay, error.retry_after), self.timeout_s)
            elapsed = time.monotonic() - sent[0] if sent else 0.0
            why = retry.stop_reason(attempt - 1, self.max_retries, elapsed, delay,
                                    self.retry_budget_s)
            if why is not None:
                retry.count(self.label, gave_up=1)
                spent = f" ({why})" if attempt < attempts else ""
                raise BackendError(
                    f"POST {url} failed after {attempt} attempt(s){spent}; last error: {reason}"
                ) from None
            global _retried
            with _retried_lock:
                _retried += 1
            retry.count(self.label, retries=1)
            logger.warning(
                "POST %s: %s (attempt %d/%d); retrying in %.2f s",
                url,
                reason,
                attempt,
                attempts,
                delay,
            )
            await asyncio.sleep(delay)
            attempt += 1

    # ---- chat --------------------------------------------------------------------------------

    def chat_payload(self, request: ChatRequest) -> dict[str, Any]:
        """The /v1/chat/completions body; every sampling parameter is explicit."""
        sp = request.sampling
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": list(request.messages),
            "n": sp.n,
            "temperature": sp.temperature,
            "top_p": sp.top_p,
            "max_tokens": sp.max_tokens,
            "stop": list(sp.stop),
            "seed": sp.seed,
            "chat_template_kwargs": {"enable_thinking": request.enable_thinking},
            "logprobs": True,
            "return_token_ids": True,
        }
        if sp.top_k is not None:
            payload["top_k"] = sp.top_k
        if request.tools:
            payload["tools"] = list(request.tools)
        return payload

    async def _chat_one(self, request: ChatRequest) -> list[Completion]:
        body = await self._post("/v1/chat/completions", self.chat_payload(request))
        choices = body.get("choices")
        if not isinstance(choices, list) or len(choices) != request.sampling.n:
            got = len(choices) if isinstance(choices, list) else choices
            raise BackendError(f"chat: expected {request.sampling.n} choices, got {got}")
        prompt_tokens = int((body.get("usage") or {}).get("prompt_tokens") or 0)
        ordered = sorted(choices, key=lambda c: c.get("index", 0))
        return [completion_from_choice(c, prompt_tokens) for c in ordered]

    def chat(self, requests: Sequence[ChatRequest]) -> list[list[Completion]]:
        """One concurrent POST per request; results keep request order."""
        if not requests:
            return []
        return self._run(lambda: _gather_or_cancel([self._chat_one(r) for r in requests]))

    # ---- scoring -----------------------------------------------------------------------------

    async def _tokenize(self, payload: dict[str, Any]) -> list[int]:
        body = await self._post("/tokenize", {"model": self.model, **payload})
        tokens = body.get("tokens")
        if not isinstance(tokens, list):
            raise BackendError(f"/tokenize returned no token list: {str(body)[:200]}")
        return [int(t) for t in tokens]

    async def _context_ids(self, request: ScoreRequest) -> list[int]:
        """Token ids of a score context by :mod:`prour.llm.chat`'s rule: text as is, messages
        through the chat template with the generation prompt, no special tokens added.

        With ``tokenizer_path`` a local tokenizer applies the rule; otherwise the server's
        ``/tokenize`` does, given the same inputs.
        """
        if self.tokenizer_path:
            return self.local_score_ids(request)[0]
        if isinstance(request.context, str):
            return await self._tokenize({"prompt": request.context, "add_special_tokens": False})
        return await self._tokenize(
            {
                "messages": list(request.context),
                "add_generation_prompt": True,
                "chat_template_kwargs": {"enable_thinking": request.enable_thinking},
            }
        )

    async def _target_ids(self, target: str) -> list[int]:
        if self.tokenizer_path:
            return chat_rules.encode(self._tokenizer(), target)
        return await self._tokenize({"prompt": target, "add_special_tokens": False})

    def _tokenizer(self) -> Any:
        if self._local_tokenizer is None:
            from transformers import AutoTokenizer

            self._local_tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)
        return self._local_tokenizer

    def local_score_ids(self, request: ScoreRequest) -> tuple[list[int], list[int]]:
        """(context ids, target ids) from the local tokenizer (servers without ``/tokenize``)."""
        return chat_rules.score_ids(self._tokenizer(), request)

    async def _prompt_logprobs(self, context: list[int], target: list[int]) -> ScoreResult:
        """Score ``target`` after ``context`` in one /v1/completions call with prompt log-probs."""
        if not target:
            return ScoreResult(token_logprobs=[])
        if not context:
            raise BackendError(
                "score: the context is empty, so the first target token has no log-prob"
            )
        ids = context + target
        payload = {
            "model": self.model,
            "prompt": ids,
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": 0,
        }
        body = await self._post("/v1/completions", payload)
        try:
            entries = body["choices"][0]["prompt_logprobs"]
        except (KeyError, IndexError, TypeError):
            raise BackendError(
                f"/v1/completions returned no prompt_logprobs: {str(body)[:200]}"
            ) from None
        return ScoreResult(token_logprobs=prompt_logprobs_of(entries, ids, len(context)))

    async def _score_all(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        """Tokenize each distinct context and target once, then score all requests concurrently."""
        context_keys = [json.dumps([r.context, r.enable_thinking], default=str) for r in requests]
        contexts = dict(zip(context_keys, requests))
        targets = list(dict.fromkeys(r.target for r in requests))
        ids = await _gather_or_cancel(
            [self._context_ids(r) for r in contexts.values()]
            + [self._target_ids(t) for t in targets]
        )
        context_ids = dict(zip(contexts, ids[: len(contexts)]))
        target_ids = dict(zip(targets, ids[len(contexts) :]))
        return await _gather_or_cancel(
            [
                self._prompt_logprobs(context_ids[k], target_ids[r.target])
                for k, r in zip(context_keys, requests)
            ]
        )

    def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        """Teacher-forced log-probs of each target token via vLLM prompt log-probs."""
        if not requests:
            return []
        return self._run(lambda: self._score_all(requests))

    def close(self) -> None:
        """Close the HTTP client and stop the event loop thread; safe to call twice."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        try:
            runner.run(self._client.aclose())
        finally:
            self._finalizer()


def _retry_after(response: httpx.Response) -> float | None:
    """Seconds from a numeric ``Retry-After`` header, if any."""
    value = response.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None
