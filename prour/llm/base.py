"""The one model protocol every stage talks to: batched chat generation and teacher-forced scoring.

Backends (``hf``, ``openai``, ``scripted``) implement :class:`LLM`. Requests are plain dataclasses
so that they can be logged, cached and replayed; every call takes a *batch* so that a backend can
share work between requests (one prefill for a shared prefix, one HTTP round of concurrent calls).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from prour.llm.toolcalls import ToolCall, parse_tool_calls, split_thinking

__all__ = ["LLM", "BackendError", "ChatRequest", "Completion", "Message", "SamplingParams",
           "ScoreRequest", "ScoreResult", "ToolCall"]  # what ``prour.llm`` exports

Message = dict[str, Any]
"""An OpenAI-style chat message: ``{"role": ..., "content": ...}``; assistant messages may carry
``tool_calls`` (OpenAI format) and tool messages ``tool_call_id`` / ``name``."""


class BackendError(RuntimeError):
    """A backend call failed for good (after its retries); the message says what and where."""


@dataclass(frozen=True)
class SamplingParams:
    """Per-request decoding settings. ``top_k=None`` means no top-k truncation."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"SamplingParams.n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"SamplingParams.top_k must be None or >= 1, got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be >= 1, got {self.max_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class ChatRequest:
    """Generate ``sampling.n`` assistant replies to ``messages``.

    ``tools`` are OpenAI-format function schemas rendered into the prompt by the chat template;
    ``enable_thinking`` switches Qwen3's ``<think>`` block on or off.
    """

    messages: tuple[Message, ...] | list[Message]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    tools: tuple[dict[str, Any], ...] | list[dict[str, Any]] | None = None
    enable_thinking: bool = False


@dataclass
class Completion:
    """One generated reply.

    ``text`` is the raw generated text (think block included, special tokens removed);
    ``reasoning`` is the inside of ``<think>…</think>`` (None without one); ``content`` is what
    follows the think block with tool-call blocks removed; ``tool_calls`` are the parsed calls.
    ``finish_reason`` is ``"stop"`` or ``"length"``.
    """

    text: str
    content: str
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None

    @classmethod
    def from_text(
        cls,
        text: str,
        finish_reason: str = "stop",
        *,
        stop: Iterable[str] = (),
        prompt_tokens: int = 0,
        completion_tokens: int | None = None,
        token_ids: list[int] | None = None,
        logprobs: list[float] | None = None,
    ) -> Completion:
        """The completion of generated ``text``, as every backend builds it.

        The text is cut before the first ``stop`` string it contains; the think block is split
        off as ``reasoning`` and the ``<tool_call>`` blocks of the rest are parsed. Without
        ``completion_tokens`` the count is that of ``token_ids`` (else of ``logprobs``, else 0).
        """
        cuts = [text.find(s) for s in stop if s and s in text]
        if cuts:
            text = text[: min(cuts)]
        reasoning, rest = split_thinking(text)
        content, calls = parse_tool_calls(rest)
        if completion_tokens is None:
            completion_tokens = len(token_ids if token_ids is not None else logprobs or [])
        return cls(
            text=text,
            content=content,
            reasoning=reasoning,
            tool_calls=calls,
            finish_reason=finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            token_ids=token_ids,
            logprobs=logprobs,
        )


@dataclass(frozen=True)
class ScoreRequest:
    """Teacher-forced log-likelihood of ``target`` following ``context``.

    ``context`` is either raw prompt text or a chat message list (rendered with the chat template
    and the generation prompt, thinking as ``enable_thinking`` says). Context and target are
    tokenized separately and concatenated, so the scored tokens are exactly the target's tokens.
    """

    context: str | tuple[Message, ...] | list[Message]
    target: str
    enable_thinking: bool = False


@dataclass
class ScoreResult:
    """Log-probabilities (natural log) of each target token given everything before it."""

    token_logprobs: list[float]

    @property
    def n_tokens(self) -> int:
        return len(self.token_logprobs)

    @property
    def sum(self) -> float:
        return float(sum(self.token_logprobs))

    @property
    def mean(self) -> float:
        return self.sum / max(1, self.n_tokens)


@runtime_checkable
class LLM(Protocol):
    """What every backend provides. Both calls are batched and keep request order."""

    name: str

    def chat(self, requests: Sequence[ChatRequest]) -> list[list[Completion]]:
        """Return, for each request, ``request.sampling.n`` completions."""
        ...

    def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        """Return one :class:`ScoreResult` per request."""
        ...

    def close(self) -> None:
        """Release resources (connections, memory). Safe to call twice."""
        ...
