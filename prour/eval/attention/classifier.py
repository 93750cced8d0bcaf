"""Request classifier: is an agent message an interruption, and how many things does it ask?

Every message the agent sends to the user gets one label:

- ``answer``: it informs or answers and asks nothing of the user;
- ``required``: it asks for something the domain policy obliges the agent to obtain
  (identity details for authentication, or the explicit yes that tau2's retail and airline
  policies demand before an action that updates the database);
- ``discretionary``: any other request; the agent chose to ask, so it is an interruption. A
  choice between options or a question about what the user wants stays discretionary even when
  it is worded as a confirmation ("would you like to proceed with the first option or the
  second?"): the policy demands a yes to a listed action, not a preference.

Only discretionary requests spend the interruption budget and cost attention (except under the
``full+exempt`` accounting). ``atomic_questions`` counts the separate things the user must
answer or do; a message with more than one is *bundled*.

The LLM classifier answers in strict JSON (validated, retried); when it fails, or when no model
is given, a deterministic heuristic labels the message and estimates the count, and the result
says so in ``source``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from prour.core.asks import REQUEST_VERB, count_atomic_questions, is_request, segments
from prour.llm.base import LLM, Message
from prour.llm.strict_json import JsonCache, ask_json_cached, cache_key, require_keys

log = logging.getLogger(__name__)

LABELS = ("answer", "required", "discretionary")
PROMPT_VERSION = "classifier-v2"
POLICY_CHARS = 6000
CONTEXT_CHARS = 3000

CLASSIFIER_SYSTEM = """\
You sort the messages a customer-service agent sends to its customer. Pick exactly one label:

- "answer": the message gives information, reports what was done, or replies to the customer, and
  asks the customer for nothing (a polite closing such as "anything else?" is still an answer).
- "required": the message asks for something the agent's policy obliges it to obtain before it
  may act, for example identity details needed to authenticate the customer, or an explicit yes
  to one specific change the agent has described and is about to make (the confirmation the
  policy demands before an action that updates the database).
- "discretionary": the message asks the customer for any other information, choice or action.
  The agent decided to ask; the policy did not make it. A question that offers options or asks
  what the customer wants or prefers is discretionary even when it says "confirm", "proceed"
  or "go ahead" (for example "would you like to proceed with the first option or the second?").

Also count "atomic_questions": the number of separate things the customer must answer or do.
A yes/no question counts 1, a choice between listed options counts 1, "your name and zip code"
counts 2, a list of three requested details counts 3. An "answer" message counts 0; a
"required" or "discretionary" message counts at least 1.

Reply with one JSON object and nothing else:
{"label": "answer" | "required" | "discretionary", "atomic_questions": <integer>}"""

CLASSIFIER_USER = """\
[Agent policy (excerpt)]
{policy}

[Conversation so far]
{context}

[Message to label]
{message}"""


@dataclass(frozen=True)
class RequestClass:
    """The label of one agent message, its atomic-question count, and where they came from."""

    label: str
    atomic_questions: int
    source: str = "llm"  # "llm" or "heuristic"
    error: str | None = None  # why the LLM result was not used, when source is "heuristic"

    @property
    def discretionary(self) -> bool:
        return self.label == "discretionary"

    @property
    def exempt(self) -> bool:
        """Answers and policy-required requests: no budget, no cost (except full+exempt)."""
        return not self.discretionary

    @property
    def bundled(self) -> bool:
        return self.atomic_questions > 1


def validate_classification(data: dict[str, Any]) -> RequestClass:
    """Check the classifier's JSON: known label, integer count consistent with the label."""
    require_keys(data, ("label", "atomic_questions"))
    label, count = data["label"], data["atomic_questions"]
    if label not in LABELS:
        raise ValueError(f"label {label!r} is not one of {list(LABELS)}")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"atomic_questions={count!r} must be an integer >= 0")
    if label == "answer" and count != 0:
        raise ValueError(f"an 'answer' message asks nothing, so atomic_questions must be 0, "
                         f"got {count}")
    if label != "answer" and count < 1:
        raise ValueError(f"a {label!r} request asks something, so atomic_questions must be >= 1")
    return RequestClass(label, count)


# --- deterministic heuristic ------------------------------------------------------------------

_YES_NO = re.compile(r"\byes/no\b|\byes or no\b|\(yes\)|\bor not\b", re.IGNORECASE)
_CONFIRM = re.compile(rf"{_YES_NO.pattern}|\b(?:confirm|proceed|go ahead)\b", re.IGNORECASE)
_CHOICE = re.compile(r"\b(?:or|either|prefer\w*|rather|instead)\b", re.IGNORECASE)
_WH_WORD = re.compile(r"\b(?:what|which|when|where|who|whom|whose|how)\b", re.IGNORECASE)
_WRITE_ACTION = re.compile(  # the database-changing actions of tau2's domain policies
    r"\b(?:cancel\w*|modif\w*|chang\w*|updat\w*|book\w*|exchang\w*|return\w*|refund\w*|"
    r"upgrad\w*|downgrad\w*|remov\w*|add(?:s|ed|ing)?|purchas\w*|pay(?:s|ing|ment)?|charg\w*|"
    r"transfer\w*|send\w*|issu\w*|reserv\w*|enabl\w*|activat\w*|resum\w*|suspend\w*)\b",
    re.IGNORECASE)
_IDENTITY = re.compile(r"\b(?:verify your identity|authenticat\w*|user id|locate your account)\b",
                       re.IGNORECASE)


def confirms_write(ask: str, message: str) -> bool:
    """Whether one ask is the policy's explicit yes before a write: it asks to confirm / proceed /
    go ahead (or for a yes/no), offers no alternatives, asks no wh-question, and the message names
    a database-changing action. "Would you like to proceed with the blue one or the red one?"
    is a choice, not a confirmation."""
    if not _CONFIRM.search(ask):
        return False
    body = _YES_NO.sub(" ", ask)
    if _CHOICE.search(body) or _WH_WORD.search(body):
        return False
    return bool(_WRITE_ACTION.search(message))


def _exempt_ask(ask: str, message: str) -> bool:
    """An ask the policy demands: identity details for authentication or a write confirmation."""
    return bool(_IDENTITY.search(ask)) or confirms_write(ask, message)


def heuristic_classify(message: str, error: str | None = None) -> RequestClass:
    """Label by rules: no ask → answer; every ask an identity check or the explicit yes before a
    database-changing action → required; any other ask (a choice, a preference, information) →
    discretionary (the rules err toward counting an interruption)."""
    count = count_atomic_questions(message)
    if count == 0:
        return RequestClass("answer", 0, "heuristic", error)
    asks = [s for s, _ in segments(message)
            if is_request(s) or (s.endswith(":") and REQUEST_VERB.search(s))]
    if asks and all(_exempt_ask(ask, message) for ask in asks):
        return RequestClass("required", count, "heuristic", error)
    return RequestClass("discretionary", count, "heuristic", error)


# --- the classifier ---------------------------------------------------------------------------


def _request_class(message: str, answer: Any) -> RequestClass:
    """A cached label, the model's validated label, or the heuristic (no model, or it failed)."""
    if answer is None:
        return heuristic_classify(message)
    if isinstance(answer, dict):
        return RequestClass(**answer)
    if answer.failed:
        return heuristic_classify(message, f"llm failed: {answer.errors[-1]}")
    return answer.value


class RequestClassifier:
    """Classify agent messages with an LLM (strict JSON, retried, cached) or the heuristic."""

    def __init__(self, llm: LLM | None, policy: str, max_attempts: int,
                 cache: JsonCache | None = None):
        self.llm = llm
        self.policy = policy[:POLICY_CHARS]
        self.max_attempts = max_attempts
        self.cache = cache if cache is not None else JsonCache()

    def prompt(self, message: str, context: str) -> list[Message]:
        """The chat prompt for one message given the dialogue before it."""
        user = CLASSIFIER_USER.format(policy=self.policy or "(not given)",
                                      context=context[-CONTEXT_CHARS:] or "(start)",
                                      message=message)
        return [{"role": "system", "content": CLASSIFIER_SYSTEM}, {"role": "user", "content": user}]

    def _key(self, message: str, context: str) -> str:
        return cache_key(PROMPT_VERSION, self.policy, context[-CONTEXT_CHARS:], message)

    def classify(self, items: Sequence[tuple[str, str]]) -> list[RequestClass]:
        """Label each (message, context) pair; one batched model call per retry round."""
        answers = ask_json_cached(self.llm, items, lambda item: self.prompt(*item),
                                  lambda item: self._key(*item), validate_classification,
                                  self.cache, lambda outcome: asdict(outcome.value),
                                  self.max_attempts)
        return [_request_class(message, answer) for (message, _), answer in zip(items, answers)]

    def classify_one(self, message: str, context: str = "") -> RequestClass:
        return self.classify([(message, context)])[0]
