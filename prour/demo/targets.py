"""Synthetic targets of the warm-start corpus: the replies the tiny model learns to write.

Query-generator answers (``NO`` or ``YES [QUESTION]…[/QUESTION]``) that carry some signal: verify
asks before a READ lookup, clarify before a WRITE call or a request that the user act on their
own device. Strict-user replies quote the goal sentence a question asks about; verifier answers
cite a value the tool returned.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

from prour.demo.actions import scalar_leaves
from prour.demo.transcripts import DecisionPoint, sentences

_CLARIFY_QUESTIONS = (
    "Should I use {value} as the {key}?",
    "Can you confirm that {value} is the {key} you want?",
    "Do you want me to go ahead with {key} {value}?",
    "Is {value} the right {key} for this change?",
)
_VERIFY_QUESTIONS = (
    "What does {tool} return for {key} {value}?",
    "Which details does {tool} show for {value}?",
    "What is the current record for {key} {value}?",
    "What does the database hold for {value}?",
)
_DEVICE_QUESTIONS = (
    "Could you run {tool} on your phone and tell me what it shows?",
    "What do you see after you run {tool} on your device?",
)
VAGUE_QUESTIONS = (
    "Anything else?",
    "Can you tell me more?",
    "Is there anything else I should know?",
)
_DEFLECTIONS = ("No, that's all.", "Just do what I asked.")
_THINK = {
    ("clarify", True): ("This change needs the user's consent.", "The user must confirm first."),
    ("clarify", False): ("Nothing is left for the user to decide.", "The user's wish is clear."),
    ("verify", True): ("A lookup is needed first.", "I should check the record."),
    ("verify", False): ("The facts are already known.", "No lookup is needed now."),
}
ANNOTATION_LABELS = {"read": "epistemic", "write": "aleatoric", "reply": "no_uncertainty"}


def _words(key: str) -> str:
    """An argument name as words (``order_id`` → ``order id``)."""
    return key.replace("_", " ")


def _nameable(arguments: dict[str, Any]) -> list[tuple[str, Any]]:
    """Short argument values a question can name (ids, names, amounts)."""
    return [
        (k, v)
        for k, v in scalar_leaves(arguments)
        if k and (isinstance(v, (int, float)) or 2 <= len(str(v)) <= 40)
    ]


def query_question(mode: str, tool: str, arguments: dict[str, Any], rng: random.Random) -> str:
    """A clarify or verify question that names a value of the next call (or its tool)."""
    pairs = _nameable(arguments)
    if not pairs:
        if mode == "verify":
            return f"What does {tool} return right now?"
        return f"Do you want me to go ahead with {_words(tool)}?"
    key, value = rng.choice(pairs)
    template = rng.choice(_CLARIFY_QUESTIONS if mode == "clarify" else _VERIFY_QUESTIONS)
    return template.format(tool=tool, key=_words(key), value=value)


def query_target(
    mode: str, point: DecisionPoint, kinds: dict[str, str], rng: random.Random, think: bool
) -> str:
    """``NO`` or ``YES [QUESTION]…[/QUESTION]`` for one state, after a short think block if asked.

    Verify asks before a READ lookup. Clarify asks before a WRITE call (the user confirms a
    consequential change) and where the agent next needs the user to act on their own device.
    Otherwise the answer is NO.
    """
    call = point.call
    wanted = "read" if mode == "verify" else "write"
    question = None
    if call is not None and kinds.get(call[0]) == wanted:
        question = query_question(mode, call[0], call[1], rng)
    elif mode == "clarify" and point.user_action is not None:
        question = rng.choice(_DEVICE_QUESTIONS).format(tool=point.user_action[0])
    ask = question is not None
    answer = f"YES [QUESTION]{question}[/QUESTION]" if ask else "NO"
    if not think:
        return answer
    return f"<think>\n{rng.choice(_THINK[(mode, ask)])}\n</think>\n\n{answer}"


def strict_user_reply(goal: str, question: str) -> str:
    """The goal sentence sharing the most words with a specific question, else a deflection."""
    if question in VAGUE_QUESTIONS:
        return _DEFLECTIONS[len(question) % len(_DEFLECTIONS)]
    asked = set(re.findall(r"[\w#@.-]+", question.lower()))
    candidates = sentences(goal) or [goal]
    scored = [
        (len(asked & set(re.findall(r"[\w#@.-]+", s.lower()))), -i)
        for i, s in enumerate(candidates)
    ]
    best = max(range(len(candidates)), key=lambda i: scored[i])
    return candidates[best] if scored[best][0] else _DEFLECTIONS[0]


def verifier_answer(tool: str, arguments: dict[str, Any], observation: str) -> str | None:
    """A final verifier answer citing one value the tool returned (None when nothing is citable)."""
    try:
        parsed = json.loads(observation)
    except json.JSONDecodeError:
        parsed = None
    call = f"{tool}({', '.join(f'{k}={json.dumps(v)}' for k, v in arguments.items())})"
    if parsed is None or isinstance(parsed, str):
        text = observation.strip().splitlines()[0] if observation.strip() else ""
        return f"{call} returned: {text}" if 3 <= len(text) <= 160 else None
    asked = {json.dumps(v) for _, v in scalar_leaves(arguments)}
    for key, value in scalar_leaves(parsed):
        citable = isinstance(value, (int, float)) or 3 <= len(str(value)) <= 60
        if key and citable and json.dumps(value) not in asked:
            return f'{call} returned {_words(key)} "{value}".'
    return None
