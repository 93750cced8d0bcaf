"""LLM judge of delivered requests: reading effort r ∈ [0, 20] and question value v ∈ [0, 10].

Reading effort. The judge rates five dimensions from 1 to 5, where 5 is the *easiest* for the
user: goal clarity (clear what is needed and why), single ask (one answerable thing), answer
effort (answerable without decoding jargon), actionability (a requested action is concrete; 5
when no action is asked) and conciseness. prour turns them into effort with

    r = Σ_i (5 − s_i) = 25 − Σ_i s_i,      so r = 0 for five 5s and r = 20 for five 1s.

Question value. The judge checks four criteria and gives v from 0 to 10; a high value
(v ≥ 7) is allowed only when all four hold, and a reply breaking that rule is rejected:

- needed: the task cannot be finished correctly without the answer;
- not_in_context: the answer is not already in the conversation (earlier user replies included);
- not_lookup: the agent could not get it from its tools or its policy;
- precise: it is specific enough that one reply settles it.

Replies are strict JSON, validated (missing or extra fields, wrong types, out-of-range values)
and retried a bounded number of times; a request that never validates is returned with
``failed=True`` and no scores. Results are cached by sha256 of (prompt version, request,
context); failures are not cached, so a later run asks again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from prour.llm.base import LLM, Message
from prour.llm.strict_json import JsonCache, ask_json_cached, cache_key, require_keys

if TYPE_CHECKING:  # pragma: no cover
    from prour.llm.strict_json import JsonOutcome

log = logging.getLogger(__name__)

PROMPT_VERSION = "judge-v1"
RATINGS = ("goal_clarity", "single_ask", "answer_effort", "actionability", "conciseness")
CRITERIA = ("needed", "not_in_context", "not_lookup", "precise")
HIGH_VALUE = 7
CONTEXT_CHARS = 6000

JUDGE_SYSTEM = """\
You review one message in which a customer-service agent asks its customer for something.
Judge it from the customer's side, using the conversation before it.

Rate each of these from 1 (worst for the customer) to 5 (best for the customer):
- goal_clarity: is it clear what the agent needs and why?
- single_ask: does it ask for one answerable thing rather than several bundled together?
- answer_effort: can the customer answer without decoding jargon or looking things up?
- actionability: if it asks the customer to do something, is that concrete? (5 if it asks no
  action)
- conciseness: is it as short as it can be while staying clear?

Then decide whether each of these holds (true or false):
- needed: the task cannot be finished correctly without this answer.
- not_in_context: the answer is not already in the conversation, earlier replies included.
- not_lookup: the agent could not get the answer from its own tools or its policy.
- precise: the request is specific enough that one reply settles it.

Finally give "value", an integer from 0 (a pointless question) to 10 (an essential one).
A value of 7 or more is allowed only when all four checks hold.

Reply with one JSON object and nothing else:
{"goal_clarity": 1-5, "single_ask": 1-5, "answer_effort": 1-5, "actionability": 1-5,
 "conciseness": 1-5, "needed": true|false, "not_in_context": true|false,
 "not_lookup": true|false, "precise": true|false, "value": 0-10}"""

JUDGE_USER = """\
[Conversation before the request]
{context}

[Request to judge]
{request}"""


@dataclass(frozen=True)
class Judgment:
    """Scores of one request, or ``failed=True`` with the reason (then no score is set)."""

    reading_effort: float | None
    value: float | None
    ratings: dict[str, int] = field(default_factory=dict)
    criteria: dict[str, bool] = field(default_factory=dict)
    failed: bool = False
    error: str | None = None
    attempts: int = 0
    cached: bool = False


def reading_effort_from_ratings(ratings: dict[str, int]) -> float:
    """r = Σ (5 − s_i) over the five 1–5 ratings (5 = easiest), so r ∈ [0, 20]."""
    return float(sum(5 - ratings[name] for name in RATINGS))


def _int_in(data: dict[str, Any], name: str, low: int, high: int) -> int:
    value = data[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise ValueError(f"{name}={value!r} must be an integer")
    if not low <= value <= high:
        raise ValueError(f"{name}={value!r} is outside [{low}, {high}]")
    return int(value)


def validate_judgment(data: dict[str, Any]) -> Judgment:
    """Check the judge's JSON and turn it into scores (module docstring for the rules)."""
    require_keys(data, RATINGS + CRITERIA + ("value",))
    ratings = {name: _int_in(data, name, 1, 5) for name in RATINGS}
    criteria = {}
    for name in CRITERIA:
        if not isinstance(data[name], bool):
            raise ValueError(f"{name}={data[name]!r} must be true or false")  # noqa: TRY004
        criteria[name] = data[name]
    value = _int_in(data, "value", 0, 10)
    if value >= HIGH_VALUE and not all(criteria.values()):
        failing = [name for name, ok in criteria.items() if not ok]
        raise ValueError(f"value={value} is high but {failing} do not hold; a value of "
                         f"{HIGH_VALUE} or more needs all four checks")
    return Judgment(reading_effort_from_ratings(ratings), float(value), ratings, criteria)


def _judged(outcome: JsonOutcome[Judgment]) -> Judgment:
    """The validated scores with their attempt count, or a failed judgment saying why."""
    if outcome.failed:
        error = f"judge failed after {outcome.attempts} attempts: {outcome.errors[-1]}"
        return Judgment(None, None, failed=True, error=error, attempts=outcome.attempts)
    return Judgment(**{**asdict(outcome.value), "attempts": outcome.attempts})


class RequestJudge:
    """Score delivered requests with an LLM judge: batched, validated, retried and cached."""

    def __init__(self, llm: LLM, max_attempts: int, cache: JsonCache | None = None):
        self.llm = llm
        self.max_attempts = max_attempts
        self.cache = cache if cache is not None else JsonCache()

    @staticmethod
    def prompt(request: str, context: str) -> list[Message]:
        user = JUDGE_USER.format(context=context[-CONTEXT_CHARS:] or "(start)", request=request)
        return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]

    @staticmethod
    def key(request: str, context: str) -> str:
        return cache_key(PROMPT_VERSION, request, context[-CONTEXT_CHARS:])

    def judge(self, items: Sequence[tuple[str, str]]) -> list[Judgment]:
        """Judge each (request, context) pair; failures come back with ``failed=True``."""
        answers = ask_json_cached(self.llm, items, lambda item: self.prompt(*item),
                                  lambda item: self.key(*item), validate_judgment, self.cache,
                                  lambda outcome: asdict(_judged(outcome)), self.max_attempts)
        return [Judgment(**{**a, "cached": True}) if isinstance(a, dict) else _judged(a)
                for a in answers]

    def judge_one(self, request: str, context: str = "") -> Judgment:
        return self.judge([(request, context)])[0]
