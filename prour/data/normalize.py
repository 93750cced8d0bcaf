"""Goal normalization: a task's user instruction → the first-person goal G* (paper A.2.1, A.4.4).

G* is the clarify-mode reward target. An LLM rewrites the instruction under fixed rules; results
are cached in a JSONL file keyed by the sha256 of the instruction, so a rerun only normalizes
instructions it has not seen (or saw under another prompt version or model). A deterministic check
pulls the concrete values (ids, numbers, emails, addresses, zip codes, ...) out of the instruction
and flags every one that G* lost; the flags travel with the goal and the CLI prints them.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from prour.llm.base import LLM, ChatRequest, SamplingParams

if TYPE_CHECKING:  # pragma: no cover
    from tau2.data_model.tasks import Task

    from prour.config.data import DataConfig

log = logging.getLogger(__name__)

GOAL_PROMPT_VERSION = "goal-v1"
"""Bumped whenever :data:`GOAL_PROMPT` changes; cached goals of another version are redone."""

GOAL_PROMPT = """\
You turn the hidden instructions of a simulated customer into one plain statement of what that
customer wants, written by the customer. Follow these rules:
1. Speak as the customer, in the first person: "You are Ann" becomes "My name is Ann", "you want"
   becomes "I want".
2. Leave out descriptions of temperament or manner (for example "you are shy and logical", "you
   get impatient quickly"); keep every fact and every wish.
3. No JSON or code syntax in the output: no braces, brackets, quotes or colons around fields.
   Write each field as words, joined with "with", "and" or "set to"; {{"color": "red", "size":
   "M"}} becomes "with color red and size M".
4. Keep references such as "(same as ...)" and make them read naturally: {{"zip": "10001"}}
   (same as #W42) becomes "with zip 10001, which is the same as #W42".
5. Never drop or alter a concrete value: names, ids, order numbers, amounts, quantities, dates,
   street addresses, zip codes, emails and product options stay exactly as written, even when they
   seem minor.
Reply with the rewritten statement only.

Example
Instructions: You are Ben Ortiz, cheerful but impatient. For order #W77, switch the shipping
address to {{"address1": "9 Elm Road", "zip": "30301"}} (same as #W12). Pay with gift card.
Rewritten: My name is Ben Ortiz. For order #W77, I want to switch the shipping address to address1
9 Elm Road and zip 30301, which is the same as #W12. I want to pay with my gift card.

Instructions: {instruction}
Rewritten:"""

ValueKind = Literal[
    "email", "address", "order_id", "user_id", "date", "phone", "code", "item_id", "zip", "number"
]

_ADDRESS_SUFFIX = (
    "Street|St|Avenue|Ave|Drive|Dr|Road|Rd|Lane|Ln|Boulevard|Blvd|Court|Ct|Way|Place|Pl|"
    "Terrace|Parkway|Pkwy|Circle|Cir|Highway|Hwy|Trail|Square|Sq"
)
# Order matters: each match is masked before the next kind runs, so "#W2378156" is not also read
# as a number and "144 Lakeview Drive" is not also read as the number 144.
_VALUE_PATTERNS: tuple[tuple[ValueKind, re.Pattern[str]], ...] = (
    ("email", re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")),
    ("address", re.compile(rf"\b\d{{1,6}}\s+(?:[A-Z][\w'.-]*\s+){{0,4}}(?:{_ADDRESS_SUFFIX})\b")),
    ("address", re.compile(r"\b(?:[Ss]uite|[Aa]pt|[Aa]partment|[Uu]nit)\.?\s+#?\w*\d\w*")),
    ("order_id", re.compile(r"#[A-Z]*\d+\b|\b[A-Z]\d{5,}\b")),
    ("user_id", re.compile(r"\b[a-z]+(?:_[a-z]+)+_\d{2,}\b")),
    ("date", re.compile(r"\b\d{4}-\d{2}-\d{2}\b")),
    ("phone", re.compile(r"\b\d{3}-\d{3}-\d{4}\b")),
    ("code", re.compile(r"\b(?=[A-Z0-9]*\d)(?=[A-Z0-9]*[A-Z])[A-Z0-9]{5,8}\b")),
    ("item_id", re.compile(r"\b\d{10}\b")),
    ("zip", re.compile(r"\b\d{5}\b")),
    ("number", re.compile(r"\$?\b\d+(?:,\d{3})*(?:\.\d+)?\b%?")),
)
_NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?")


@dataclass(frozen=True)
class ConcreteValue:
    """One value the goal must keep: its kind and its text as written in the instruction."""

    kind: ValueKind
    text: str


def concrete_values(text: str) -> list[ConcreteValue]:
    """The concrete values of ``text`` in order of first appearance, each once."""
    found: list[tuple[int, ConcreteValue]] = []
    masked = text
    for kind, pattern in _VALUE_PATTERNS:
        for match in pattern.finditer(masked):
            value = match.group(0).rstrip(".,")
            found.append((match.start(), ConcreteValue(kind, value)))
        masked = pattern.sub(lambda m: " " * len(m.group(0)), masked)
    seen: set[ConcreteValue] = set()
    ordered = []
    for _, value in sorted(found, key=lambda item: item[0]):
        if value not in seen:
            seen.add(value)
            ordered.append(value)
    return ordered


def _squash(text: str) -> str:
    return " ".join(text.casefold().split())


def _numeric(text: str) -> float | None:
    digits = _NUMBER.search(text)
    return float(digits.group(0).replace(",", "")) if digits else None


def value_present(value: ConcreteValue, goal: str) -> bool:
    """True if ``goal`` keeps ``value`` (numbers compare by value, ids ignore a leading '#')."""
    if value.kind == "number":
        wanted = _numeric(value.text)
        return wanted in {float(n.replace(",", "")) for n in _NUMBER.findall(goal)}
    needle = _squash(value.text)
    if value.kind == "order_id":
        needle = needle.lstrip("#")
    return needle in _squash(goal)


def missing_values(instruction: str, goal: str) -> list[ConcreteValue]:
    """Concrete values of ``instruction`` that ``goal`` does not contain."""
    return [v for v in concrete_values(instruction) if not value_present(v, goal)]


def instruction_sha(instruction: str) -> str:
    """Cache key of an instruction: sha256 of its UTF-8 text."""
    return hashlib.sha256(instruction.encode("utf-8")).hexdigest()


def goal_prompt(instruction: str) -> list[dict[str, str]]:
    """Chat messages asking the normalizer model for G*."""
    return [{"role": "user", "content": GOAL_PROMPT.format(instruction=instruction.strip())}]


_LEADING_LABEL = re.compile(r"^(?:rewritten|output|goal|normalized goal)\s*:\s*", re.IGNORECASE)


def clean_goal(text: str) -> str:
    """The statement alone: no leading label, no wrapping quotes, whitespace collapsed."""
    text = _LEADING_LABEL.sub("", text.strip())
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'`":
        text = text[1:-1]
    return " ".join(text.split())


@dataclass
class Goal:
    """A normalized goal G* with the values it lost. One JSONL line of the goals file."""

    domain: str
    task_id: str
    sha256: str
    instruction: str
    goal: str
    missing: list[dict[str, str]] = field(default_factory=list)
    model: str = ""
    prompt_version: str = GOAL_PROMPT_VERSION

    @property
    def flagged(self) -> bool:
        return bool(self.missing) or not self.goal

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Goal:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def make_goal(domain: str, task_id: str, instruction: str, values_text: str, text: str,
              model: str) -> Goal:
    """A :class:`Goal` from the normalizer's reply, with the value check applied to ``values_text``."""
    goal = clean_goal(text)
    missing = [asdict(v) for v in missing_values(values_text, goal)]
    return Goal(domain, task_id, instruction_sha(instruction), instruction, goal, missing, model)


def task_instruction(task: Task) -> str:
    """What the user simulator is told (persona and instructions): the normalizer's input."""
    return str(task.user_scenario)


def task_values_text(task: Task) -> str:
    """The part whose concrete values G* must keep (the persona is manner, not content)."""
    return str(task.user_scenario.instructions)


class Goals(dict):
    """Goals by (domain, task id); ``skipped`` holds the 1-based numbers of the lines left out
    (corrupt, or not a goal) under ``on_bad_line: skip``."""

    def __init__(self, goals: dict[tuple[str, str], Goal] | None = None,
                 skipped: Iterable[int] = ()):
        super().__init__(goals or {})
        self.skipped: list[int] = sorted(skipped)


def goal_problem(row: dict[str, Any]) -> str | None:
    """Why a goals-file record is not a :class:`Goal` (None when it is one)."""
    for key in ("domain", "task_id", "sha256", "instruction", "goal", "model", "prompt_version"):
        if key in row and not isinstance(row[key], str):
            return f"`{key}` must be text, got {type(row[key]).__name__}"
        if key not in row and key not in ("model", "prompt_version"):
            return f"`{key}` is missing"
    missing = row.get("missing", [])
    if not isinstance(missing, list) or not all(isinstance(m, dict) for m in missing):
        return "`missing` must be a list of objects"
    return None


def load_goals(path: str | Path, on_bad_line: Literal["error", "skip"]) -> Goals:
    """Goals by (domain, task id); a later line for the same task replaces an earlier one. A
    line that is corrupt or holds no goal raises a ValueError naming ``file:line``
    (``on_bad_line: error``) or is skipped with a warning and listed in ``.skipped``."""
    from prour.env.trajectory import read_numbered

    path = Path(path)
    if not path.is_file():
        return Goals()
    rows = read_numbered(path, on_error="raise" if on_bad_line == "error" else "skip")
    goals, skipped = Goals(), list(rows.skipped)
    for number, row in rows:
        problem = goal_problem(row)
        if problem is not None:
            if on_bad_line == "error":
                raise ValueError(f"{path}:{number}: not a goal: {problem}")
            log.warning("skipping goals line %s:%d: not a goal: %s", path, number, problem)
            skipped.append(number)
            continue
        goal = Goal.from_dict(row)
        goals[(goal.domain, goal.task_id)] = goal
    goals.skipped = sorted(skipped)
    return goals


def _reusable(cached: Iterable[Goal], model: str) -> dict[str, Goal]:
    """Cached goals by instruction hash, only those of this prompt version and model."""
    return {g.sha256: g for g in cached
            if g.prompt_version == GOAL_PROMPT_VERSION and g.model == model and g.goal}


def normalize_tasks(tasks: Sequence[Task], domain: str, llm: LLM, path: str | Path,
                    model: str, cfg: DataConfig, batch_size: int = 8) -> list[Goal]:
    """G* for every task, reusing cached goals by instruction hash and appending new ones;
    the ``data`` section sets the goal length (``normalizer_max_tokens``) and what a corrupt
    line of the goals file does (``on_bad_line``)."""
    from prour.files import append_jsonl, repair_torn_tail

    max_tokens = cfg.normalizer_max_tokens
    repair_torn_tail(path, "its goal is normalized again")
    stored = load_goals(path, cfg.on_bad_line)
    by_sha = _reusable(stored.values(), model)
    out: list[Goal] = []
    todo: list[Task] = []
    for task in tasks:
        sha = instruction_sha(task_instruction(task))
        known = stored.get((domain, task.id))
        if known is not None and known.sha256 == sha and sha in by_sha:
            out.append(known)
        elif sha in by_sha:  # same instruction under another task id: copy, no model call
            goal = Goal(**{**by_sha[sha].to_dict(), "domain": domain, "task_id": task.id})
            append_jsonl(path, goal.to_dict())
            out.append(goal)
        else:
            todo.append(task)
    for start in range(0, len(todo), batch_size):
        for goal in _normalize_batch(todo[start:start + batch_size], domain, llm, model, max_tokens):
            append_jsonl(path, goal.to_dict())
            by_sha[goal.sha256] = goal
            out.append(goal)
    order = {task.id: i for i, task in enumerate(tasks)}
    return sorted(out, key=lambda g: order[g.task_id])


def _normalize_batch(tasks: Sequence[Task], domain: str, llm: LLM, model: str,
                     max_tokens: int) -> list[Goal]:
    """One batched chat call for a few tasks (greedy, thinking off)."""
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    requests = [ChatRequest(messages=goal_prompt(task_instruction(t)), sampling=sampling)
                for t in tasks]
    replies = llm.chat(requests)
    goals = []
    for task, completions in zip(tasks, replies):
        goal = make_goal(domain, task.id, task_instruction(task), task_values_text(task),
                         completions[0].content, model)
        if goal.flagged:
            log.warning("goal of %s/%s lost values: %s", domain, task.id,
                        ", ".join(m["text"] for m in goal.missing) or "(empty goal)")
        goals.append(goal)
    return goals
