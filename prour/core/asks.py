"""How many separate things a message asks of the user, by rule: the count behind the attention
cost of a question (the proxy cost of the reward, the fallback of the request classifier).

Sentences are split on end punctuation and list bullets; a sentence is a request when it ends in
'?' or opens with a request verb ("please provide", "could you confirm", "let me know"), and a
closing pleasantry ("anything else?") is none. Coordinated items in one request count separately
("your name, email and zip code" is three asks), except in yes/no questions and either/or choices.
A request ending in ':' that introduces a list counts its items instead. Deterministic, stdlib only.
"""

from __future__ import annotations

import re

_SENTENCE = re.compile(r"(?<=[.?!])\s+")
_BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+")
_VERBS = r"(?:provide|confirm|share|tell|send|specify|choose|select|enter|give)"
REQUEST_VERB = re.compile(
    rf"^{_VERBS}\b|\b(?:please|kindly)\s+{_VERBS}\b|\blet me know\b|"
    rf"\b(?:could|can|would) you (?:please )?{_VERBS}\b", re.IGNORECASE)
_YES_NO_START = re.compile(
    r"^(?:do|does|did|is|are|was|were|shall|should|would|will|may|can|could|have|has|"
    r"had|am)\b", re.IGNORECASE)
_INFO_VERB = re.compile(r"\b(?:provide|share|tell|give|send|specify|let me know|what|which|"
                        r"when|where|who|how)\b", re.IGNORECASE)
_SPLIT_ITEMS = re.compile(r",\s*(?:and\s+)?|\s+and\s+", re.IGNORECASE)  # "a, b and c"
_SPLIT_AND = re.compile(r"\s+and\s+", re.IGNORECASE)  # a comma alone does not list asks
_CLOSING = re.compile(r"^(?:is there )?anything else\b|\bhelp (?:you )?with anything else\b|"
                      r"^how else can i help\b", re.IGNORECASE)


def segments(text: str) -> list[tuple[str, bool]]:
    """Sentences of the message, each with whether it is a bullet / numbered list item."""
    out: list[tuple[str, bool]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        is_item = bool(_BULLET.match(line))
        body = _BULLET.sub("", line).strip()
        out.extend((s.strip(), is_item) for s in _SENTENCE.split(body) if s.strip())
    return out


def is_request(sentence: str) -> bool:
    """Whether one sentence asks the user for something (a question or a request verb)."""
    if _CLOSING.search(sentence):
        return False
    return sentence.endswith("?") or bool(REQUEST_VERB.search(sentence))


def _items_in(sentence: str) -> int:
    """Asks in one request sentence: coordinated items count separately, except in yes/no
    questions and either/or choices, which are one ask."""
    if _YES_NO_START.match(sentence) and not _INFO_VERB.search(sentence):
        return 1
    body = sentence.rstrip("?.! ")
    splitter = _SPLIT_ITEMS if re.search(r"\band\b", body, re.IGNORECASE) else _SPLIT_AND
    return max(1, len([p for p in splitter.split(body) if p.strip()]))


def count_atomic_questions(text: str) -> int:
    """Estimate how many separate things a message asks for (deterministic; see module doc).

    A request sentence ending in ':' that introduces a list counts its list items instead.
    """
    total = 0
    header_open = False
    for sentence, is_item in segments(text):
        if is_item and header_open:
            total += 1
            continue
        header_open = sentence.endswith(":") and bool(REQUEST_VERB.search(sentence))
        if header_open:
            continue
        if is_request(sentence):
            total += _items_in(sentence)
    return total
