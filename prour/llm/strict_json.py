"""Strict-JSON model calls with validation and bounded retries, and a hash-keyed result cache.

The classifier, the judge and the self-review all ask a model for one JSON object, validate it
against rules of their own, and retry a bounded number of times with the validation error fed
back. A request that never validates comes back as failed, with every raw reply kept, so that
callers can record the failure instead of inventing a score. :func:`ask_json_cached` puts a
cache in front: what was answered before is not asked again, and failures are never cached.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from prour.files import append_jsonl
from prour.llm.base import LLM, ChatRequest, Message, SamplingParams

log = logging.getLogger(__name__)
T = TypeVar("T")
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)
JUDGE_SAMPLING = SamplingParams(n=1, temperature=0.0, max_tokens=512)


@dataclass
class JsonOutcome(Generic[T]):
    """Result of one strict-JSON request: the validated value, or the errors of every attempt."""

    value: T | None
    attempts: int
    errors: list[str] = field(default_factory=list)
    raw: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.value is None


def parse_json_object(text: str) -> dict[str, Any]:
    """The reply as one JSON object (a ```json fence is allowed); anything else raises."""
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1)
    if not body:
        raise ValueError("empty reply; expected one JSON object")
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")  # noqa: TRY004
    return data


def require_keys(data: dict[str, Any], keys: Sequence[str]) -> None:
    """Raise naming every missing and every unexpected top-level key."""
    missing = [k for k in keys if k not in data]
    extra = [k for k in data if k not in keys]
    problems = []
    if missing:
        problems.append(f"missing field(s) {missing}")
    if extra:
        problems.append(f"unexpected field(s) {extra}")
    if problems:
        raise ValueError("; ".join(problems) + f"; expected exactly {list(keys)}")


def _feedback(error: str) -> Message:
    return {"role": "user", "content": (
        f"That reply was rejected: {error}. Answer again with only the JSON object, "
        "following every rule above.")}


def ask_json(
    llm: LLM, prompts: Sequence[list[Message]], validate: Callable[[dict[str, Any]], T],
    max_attempts: int, sampling: SamplingParams = JUDGE_SAMPLING,
) -> list[JsonOutcome[T]]:
    """Ask every prompt for one JSON object; retry invalid replies (batched) with the error shown.

    ``validate`` turns a parsed object into a value or raises ``ValueError`` explaining why.
    """
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
    outcomes: list[JsonOutcome[T]] = [JsonOutcome(None, 0) for _ in prompts]
    dialogues = [list(p) for p in prompts]
    pending = list(range(len(prompts)))
    while pending:
        replies = llm.chat([ChatRequest(dialogues[i], sampling) for i in pending])
        still = []
        for i, completions in zip(pending, replies):
            text = completions[0].content if completions else ""
            outcome = outcomes[i]
            outcome.attempts += 1
            outcome.raw.append(text)
            try:
                outcome.value = validate(parse_json_object(text))
                continue
            except ValueError as exc:
                outcome.errors.append(str(exc))
            if outcome.attempts < max_attempts:
                retry = [{"role": "assistant", "content": text}, _feedback(outcome.errors[-1])]
                dialogues[i] += retry
                still.append(i)
            else:
                log.warning("strict-JSON request failed after %d attempts: %s",
                            outcome.attempts, outcome.errors[-1])
        pending = still
    return outcomes


Item = TypeVar("Item")


def ask_json_cached(
    llm: LLM | None, items: Sequence[Item], prompt: Callable[[Item], list[Message]],
    key: Callable[[Item], str], validate: Callable[[dict[str, Any]], T], cache: JsonCache,
    store: Callable[[JsonOutcome[T]], Any], max_attempts: int = 3,
) -> list[Any | JsonOutcome[T] | None]:
    """Per item: its cached value when ``key(item)`` is in the cache, else the outcome of a
    strict-JSON request (all misses asked in one batch), else None when ``llm`` is None.

    A successful outcome is cached as ``store(outcome)``; a failed one is not.
    """
    answers: list[Any | JsonOutcome[T] | None] = [cache.get(key(item)) for item in items]
    todo = [i for i, hit in enumerate(answers) if hit is None]
    if llm is None or not todo:
        return answers
    outcomes = ask_json(llm, [prompt(items[i]) for i in todo], validate, max_attempts)
    for i, outcome in zip(todo, outcomes):
        answers[i] = outcome
        if not outcome.failed:
            cache.put(key(items[i]), store(outcome))
    return answers


def cache_key(*parts: Any) -> str:
    """sha256 of the canonical JSON of ``parts`` (what was asked, and of which prompt version)."""
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class JsonCache:
    """A dict of key → JSON value, optionally mirrored to an append-only JSONL file."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else None
        self._data: dict[str, Any] = {}
        if self.path and self.path.exists():
            self._load(self.path)

    def _load(self, path: Path) -> None:
        with path.open(encoding="utf-8") as handle:
            for line_no, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    self._data[row["key"]] = row["value"]
                except (json.JSONDecodeError, KeyError, TypeError) as exc:
                    log.warning("%s:%d: skipping corrupt cache line (%s)", path, line_no, exc)

    def __contains__(self, key: str) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: str) -> Any:
        return self._data.get(key)

    def put(self, key: str, value: Any) -> None:
        """Store a value; with a file, append one line and flush it to disk."""
        self._data[key] = value
        if self.path is None:
            return
        append_jsonl(self.path, {"key": key, "value": value})
