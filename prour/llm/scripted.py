"""A deterministic model double for tests: replies from rules or a queue, scores from a function.

How a chat prompt is seen by the rules: the request's messages are rendered with
:func:`prour.llm.history.render_history` (system prompt included: one ``role: text`` line per
utterance, ``role calls tool: name({...})`` per call, ``tool NAME returned: ...`` per result).
The same rendering is used whatever backend a stage would otherwise run, so a rule written
against it matches the same prompts everywhere. Rules are regular expressions searched in that
text (``re.DOTALL``); the first matching rule answers. A reply is a string, a list of strings
(used in turn, one per sample, cycling) or a callable ``messages -> str``. Without a matching
rule the next reply of the queue is used, then ``default``; with none of them the call fails with
a :class:`BackendError` that shows the end of the prompt.

Scoring: ``scorer(context_text, target) -> list[float]`` when given; otherwise each
whitespace-separated word of the target gets -0.1 if it occurs in the context (case and edge
punctuation ignored) and a fixed value in [-3, -2) derived from a hash of the word if not, so a
context that mentions the target scores higher, deterministically.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prour.files import write_atomic
from prour.llm.base import BackendError, ChatRequest, Completion, Message, ScoreRequest, ScoreResult
from prour.llm.history import render_history
from prour.registry import Registry, unknown_name

Reply = str | Sequence[str] | Callable[[list[Message]], str]
Scorer = Callable[[str, str], Sequence[float]]
_EDGE_PUNCT = ".,;:!?\"'()[]{}<>"


@dataclass
class Rule:
    """``pattern`` (regex searched in the rendered prompt) answered by ``reply``."""

    pattern: str
    reply: Reply
    _regex: re.Pattern[str] = field(init=False, repr=False)
    _turn: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        try:
            self._regex = re.compile(self.pattern, re.DOTALL)
        except re.error as exc:
            raise ValueError(
                f"scripted rule pattern {self.pattern!r} is not a valid regex: {exc}"
            ) from None

    def matches(self, prompt: str) -> bool:
        return self._regex.search(prompt) is not None

    def next_reply(self, messages: list[Message]) -> str:
        """The reply for one sample; list replies are used in turn."""
        if callable(self.reply):
            return str(self.reply(messages))
        if isinstance(self.reply, str):
            return self.reply
        choice = self.reply[self._turn % len(self.reply)]
        self._turn += 1
        return choice


def render_prompt(messages: Sequence[Message]) -> str:
    """The text rules are matched against (see the module docstring)."""
    return render_history(messages, include_system=True)


def word_overlap_logprobs(context: str, target: str) -> list[float]:
    """Default score: -0.1 per target word seen in the context, else a hashed value in [-3, -2)."""
    seen = {w.strip(_EDGE_PUNCT).lower() for w in context.split()}
    scores = []
    for word in target.split():
        key = word.strip(_EDGE_PUNCT).lower()
        if key and key in seen:
            scores.append(-0.1)
        else:
            fraction = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 16**8
            scores.append(-2.0 - fraction)
    return scores


class ScriptedLLM:
    """Deterministic :class:`~prour.llm.base.LLM` for tests; ``calls`` counts calls and requests."""

    name = "scripted"

    def __init__(
        self,
        rules: Sequence[Rule | tuple[str, Reply]] = (),
        replies: Sequence[str] = (),
        default: str | None = None,
        scorer: Scorer | None = None,
    ):
        self.rules = [r if isinstance(r, Rule) else Rule(*r) for r in rules]
        self.queue: deque[str] = deque(replies)
        self.default = default
        self.scorer = scorer or word_overlap_logprobs
        self.calls: Counter[str] = Counter()
        self.chat_log: list[ChatRequest] = []
        self.score_log: list[ScoreRequest] = []
        self._lock = threading.Lock()

    @classmethod
    def from_file(cls, path: str | Path) -> ScriptedLLM:
        """Load ``{rules: [{pattern, reply}], replies: [...], default: ...}`` (YAML or JSON)."""
        import yaml

        path = Path(path)
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a script must be a mapping with rules/replies/default")  # noqa: TRY004
        unknown = set(data) - {"rules", "replies", "default"}
        if unknown:
            raise ValueError(
                f"{path}: unknown script keys {sorted(unknown)}; allowed: rules, replies, default"
            )
        rules = []
        for i, item in enumerate(data.get("rules") or []):
            if not isinstance(item, dict) or set(item) != {"pattern", "reply"}:
                raise ValueError(f"{path}: rules[{i}] must have exactly the keys pattern and reply")
            rules.append(Rule(str(item["pattern"]), item["reply"]))
        return cls(
            rules=rules,
            replies=[str(r) for r in data.get("replies") or []],
            default=data.get("default"),
        )

    def _reply(self, messages: list[Message], prompt: str) -> str:
        """The next reply text for one sample (rules, then queue, then default)."""
        for rule in self.rules:
            if rule.matches(prompt):
                return rule.next_reply(messages)
        if self.queue:
            return self.queue.popleft()
        if self.default is not None:
            return self.default
        raise BackendError(
            f"scripted backend: no rule matches and no reply is queued; prompt ends with:\n"
            f"{prompt[-500:]}"
        )

    def chat(self, requests: Sequence[ChatRequest]) -> list[list[Completion]]:
        """Answer every request with ``n`` scripted completions, in order."""
        with self._lock:
            self.calls["chat"] += 1
            self.calls["chat_requests"] += len(requests)
            self.chat_log.extend(requests)
            out = []
            for request in requests:
                messages = list(request.messages)
                prompt = render_prompt(messages)
                texts = [self._reply(messages, prompt) for _ in range(request.sampling.n)]
                out.append([_completion(t, request.sampling.stop) for t in texts])
            return out

    def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        """Score each target with ``scorer`` on the rendered context."""
        with self._lock:
            self.calls["score"] += 1
            self.calls["score_requests"] += len(requests)
            self.score_log.extend(requests)
            results = []
            for request in requests:
                context = (
                    request.context
                    if isinstance(request.context, str)
                    else render_prompt(request.context)
                )
                results.append(
                    ScoreResult([float(x) for x in self.scorer(context, request.target)])
                )
            return results

    def close(self) -> None:
        """Nothing to release."""


def _completion(text: str, stop: Iterable[str]) -> Completion:
    """A scripted reply as a backend returns it; its token count is its word count."""
    completion = Completion.from_text(text, stop=stop)
    completion.completion_tokens = len(completion.text.split())
    return completion


SCRIPTS: Registry[Callable[[], ScriptedLLM]] = Registry("script")


def register_script(name: str, factory: Callable[[], ScriptedLLM]) -> None:
    """Make ``models.X.script: NAME`` in a recipe build ``factory()`` (a later call replaces it)."""
    SCRIPTS.register(name, factory, replace=True)


def scripted_from_config(script: str | None) -> ScriptedLLM:
    """A :class:`ScriptedLLM` from a rules file path or a registered script name."""
    if not script:
        raise ValueError(
            "backend 'scripted' needs `script` (a rules file or a registered script name)"
        )
    if script in SCRIPTS:
        return SCRIPTS.get(script)()
    if Path(script).is_file():
        return ScriptedLLM.from_file(script)
    raise ValueError(f"{unknown_name('script', script, SCRIPTS)} (not a rules file either)")


def dump_script(path: str | Path, replies: Sequence[str], default: str | None = None) -> None:
    """Write a replay script (recorded replies in order) for :meth:`ScriptedLLM.from_file`."""
    write_atomic(path, json.dumps({"replies": list(replies), "default": default}, indent=2) + "\n")
