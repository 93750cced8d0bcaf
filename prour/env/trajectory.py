"""Episode records: one schema-versioned :class:`Trajectory` per episode, stored one per JSONL line.

``messages`` is the whole transcript in OpenAI format (system prompt, assistant tool calls with
ids, tool observations verbatim, user turns, the user's own tool calls). ``steps`` has one record
per message after the system prompt saying who produced it, when, how long it took, and a free
``meta`` dict that later stages fill (route, label, ...). Views (what the agent or the user may
see) and the conversion for tau2's evaluator are derived from the step kinds.

Records are appended with :func:`prour.files.append_jsonl` (one ``write`` of the full line, then
fsync); a torn line left by a crash is reported by :func:`read_jsonl` with its file and line number.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1

StepKind = Literal[
    "agent_message",  # assistant text to the user
    "agent_tool_call",  # assistant message carrying tool calls
    "tool_result",  # observation of one tool call (agent's or user's, see ``requestor``)
    "user_message",  # user text to the agent
    "user_tool_call",  # user message carrying calls to the user's own tools (telecom)
    "agent_note",  # extra message an agent wrapper adds for itself (not shown to the user)
]
Termination = Literal["user_stop", "agent_stop", "max_steps", "too_many_errors", "error"]
NORMAL_ENDINGS: frozenset[str] = frozenset({"user_stop", "agent_stop"})


def is_cut(termination: str | None) -> bool:
    """The episode reached the turn cap (``env.max_steps``): tau2 scores it 0; reports say "cut"."""
    return termination == "max_steps"


class StepRecord(BaseModel):
    """One transcript message: its producer, timing and annotations."""

    model_config = ConfigDict(extra="forbid")

    kind: StepKind
    message_index: int = Field(ge=0)  # position of the message in ``Trajectory.messages``
    started_s: float = 0.0  # seconds from the episode start when the step began
    seconds: float = 0.0  # wall-clock time to produce the message (generation or tool run)
    requestor: Literal["assistant", "user"] | None = None  # tool calls and results only
    tool_name: str | None = None  # tool results only
    tool_call_id: str | None = None  # tool results only
    is_error: bool = False  # tool results: the observation is an error
    executed: bool = True  # tool results: the call reached the tau2 environment
    initial: bool = False  # part of the task's initial message history
    meta: dict[str, Any] = Field(default_factory=dict)


class Trajectory(BaseModel):
    """One episode of a task agent with a user simulator on a tau2 task."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    domain: str
    task_id: str
    split: str | None = None
    seed: int = 0
    agent: str
    user: str
    agent_model: str | None = None
    user_model: str | None = None
    prompts_version: str = ""
    # prour.env.prompts.prompts_hash() of the code that ran the episode (the agent's and the user
    # simulator's prompt texts); "" in files written before it was recorded: "unknown"
    prompts_hash: str = ""
    messages: list[dict[str, Any]] = Field(default_factory=list)
    steps: list[StepRecord] = Field(default_factory=list)
    termination: Termination | None = None
    reward: float | None = None
    reward_breakdown: dict[str, Any] = Field(default_factory=dict)
    seconds: float = 0.0
    started_at: str = ""
    errors: list[str] = Field(default_factory=list)
    meta: dict[str, Any] = Field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, int, str]:
        """Resume key: (domain, task id, seed, agent name)."""
        return (self.domain, self.task_id, self.seed, self.agent)

    def to_json(self) -> str:
        """One line of JSON (no newline inside)."""
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | dict[str, Any]) -> Trajectory:
        """Parse a stored episode; a newer or missing schema version is an error."""
        data = json.loads(text) if isinstance(text, str) else dict(text)
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(
                f"trajectory schema_version {version!r} is not supported (this prour reads "
                f"{SCHEMA_VERSION}); re-collect or convert the file"
            )
        return cls.model_validate(data)

    def steps_of(self, *kinds: str) -> list[StepRecord]:
        """Step records of the given kinds, in order."""
        return [step for step in self.steps if step.kind in kinds]


def tau2_steps(steps: Iterable[StepRecord]) -> int:
    """Steps as tau2's Orchestrator counts them toward ``max_steps`` (see ``prour.config``):
    one per agent or user message, text or tool calls, and one per batch of tool results that
    answers such a message; the greeting, the task's prior history and agent notes (never sent
    to tau2) do not count."""
    count, previous = 0, None
    for step in steps:
        if step.initial or step.kind == "agent_note" or step.meta.get("greeting"):
            continue
        if step.kind != "tool_result" or previous != "tool_result":
            count += 1
        previous = step.kind
    return count


class JsonlRecords(list):
    """Records read from a JSONL file; ``skipped`` lists the 1-based numbers of corrupt lines."""

    def __init__(self, records: Iterable[Any] = (), skipped: list[int] | None = None):
        super().__init__(records)
        self.skipped: list[int] = list(skipped or [])


def read_jsonl(path: str | Path, on_error: Literal["raise", "skip"] = "raise") -> JsonlRecords:
    """Read a JSONL file of objects. Corrupt or truncated lines raise a ValueError naming
    ``file:line`` (``on_error="raise"``) or are logged and listed in ``.skipped``."""
    numbered = _read_numbered(path, on_error)
    return JsonlRecords((record for _, record in numbered), numbered.skipped)


def read_numbered(path: str | Path, on_error: Literal["raise", "skip"] = "raise") -> JsonlRecords:
    """``(line number, object)`` pairs of a JSONL file's good lines, for a reader that checks
    each record and names its line; bad lines raise or go to ``.skipped`` (:func:`read_jsonl`)."""
    return _read_numbered(path, on_error)


def _read_numbered(path: str | Path, on_error: str) -> JsonlRecords:
    """``(line number, object)`` pairs of the good lines; bad ones raise or go to ``.skipped``."""
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    path = Path(path)
    out = JsonlRecords()
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            problem = _line_problem(raw)
            if problem is None:
                out.append((number, json.loads(raw)))
            else:
                _refuse_tau2_results(path, number)
                _report(out, f"{path}:{number}: {problem}", number, on_error)
    return out


def _refuse_tau2_results(path: Path, number: int) -> None:
    """A bad first line of a tau2 results file (indented JSON): one line naming the importer."""
    if number <= 2 and is_tau2_results(path):
        raise ValueError(misplaced_message(path))


def is_tau2_results(path: str | Path) -> bool:
    """The file parses as one JSON object with a ``simulations`` key (what ``tau2 run`` writes)."""
    try:
        with open(path, "rb") as handle:
            value = json.load(handle)
    except (OSError, ValueError):
        return False
    return isinstance(value, dict) and "simulations" in value


def misplaced_message(path: str | Path) -> str:
    """The one-line error for a tau2 results file given where prour JSONL is expected."""
    return (f"{path}: it is a tau2 results file (one JSON object with `simulations`), not JSONL; "
            f"convert it with `prour import tau2 {path} --run-dir DIR` and pass "
            "DIR/trajectories.jsonl")


def _report(out: JsonlRecords, message: str, number: int, on_error: str) -> None:
    if on_error == "raise":
        raise ValueError(message)
    logger.warning("skipping corrupt line %s", message)
    out.skipped.append(number)


def _line_problem(raw: bytes) -> str | None:
    """Why a line is not a complete JSON object (None when it is one)."""
    truncated = "" if raw.endswith(b"\n") else " (last line has no newline: torn by a crash?)"
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return f"not valid JSON: {exc}{truncated}"
    if not isinstance(value, dict):
        return f"expected a JSON object, got {type(value).__name__}"
    return None


def read_trajectories(
    path: str | Path, on_error: Literal["raise", "skip"] = "raise"
) -> JsonlRecords:
    """Trajectories from a JSONL file; records of a wrong schema count as corrupt lines."""
    numbered = _read_numbered(path, on_error)
    out = JsonlRecords(skipped=numbered.skipped)
    for number, record in numbered:
        if "simulations" in record and "schema_version" not in record:  # compact tau2 results
            raise ValueError(misplaced_message(path))
        try:
            out.append(Trajectory.from_json(record))
        except (ValueError, ValidationError) as exc:
            first = str(exc).splitlines()[0]
            _report(out, f"{path}:{number}: not a trajectory: {first}", number, on_error)
    out.skipped.sort()
    return out


def _visible(
    messages: list[dict[str, Any]], steps: list[StepRecord], side: str
) -> list[dict[str, Any]]:
    """Messages one side of the dialogue may see; messages without a step (the system prompt)
    belong to the agent."""
    by_index = {step.message_index: step for step in steps}
    out = []
    for index, message in enumerate(messages):
        step = by_index.get(index)
        if step is None:
            if side == "agent":
                out.append(message)
            continue
        if _seen_by(step, side):
            out.append(message)
    return out


def _seen_by(step: StepRecord, side: str) -> bool:
    if step.kind == "tool_result":
        return (step.requestor or "assistant") == ("assistant" if side == "agent" else "user")
    if side == "agent":
        return step.kind in ("agent_message", "agent_tool_call", "agent_note", "user_message")
    return step.kind in ("agent_message", "user_message", "user_tool_call")


def agent_view(messages: list[dict[str, Any]], steps: list[StepRecord]) -> list[dict[str, Any]]:
    """What the task agent sees: system prompt, its own messages and tool results, user text."""
    return _visible(messages, steps, "agent")


def user_view(messages: list[dict[str, Any]], steps: list[StepRecord]) -> list[dict[str, Any]]:
    """What the user sees: agent text, its own messages, its own tool calls and their results."""
    return _visible(messages, steps, "user")
