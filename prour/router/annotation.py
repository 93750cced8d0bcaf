"""Calibration labels: decision states, the LLM annotator (paper A.4.4 rubric, in our words) and
the reviewable labels JSONL.

Each labels line holds the state id, the tail of the dialogue, the annotator's raw reply, its
label mapped to a route (epistemic -> verify, aleatoric -> clarify, no_uncertainty -> act), and
``corrected``: null until a person sets it (a route or rubric name), which then wins over ``label``.
Annotation is resumable: states already in the file are kept as they are (corrections included).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prour.env.trajectory import read_jsonl
from prour.files import append_jsonl
from prour.llm.base import LLM, ChatRequest, Message, SamplingParams
from prour.llm.history import render_history
from prour.router.candidates import answer_text
from prour.router.routing import ROUTES

if TYPE_CHECKING:  # pragma: no cover
    from prour.config.router import CalibrationConfig

logger = logging.getLogger(__name__)

LABEL_TO_ROUTE = {"epistemic": "verify", "aleatoric": "clarify", "no_uncertainty": "act"}

ANNOTATION_PROMPT = """\
You label where an agent's uncertainty lies in customer-service dialogues. Look at the point \
where the dialogue below stops and classify the assistant's next move with exactly one label:
- epistemic: the next move has to settle a concrete fact, a policy rule or the state of the \
world, by looking it up, reading the policy, or calling a tool.
- aleatoric: the next move has to ask the customer, because what is missing is their \
preference, choice, or pick among options.
- no_uncertainty: the assistant already knows enough to act now.

How to decide:
- Missing facts the assistant should look up or confirm are epistemic: account, order or \
product identifiers, policy checks, other concrete facts.
- Asking the customer for a concrete fact is still epistemic, not aleatoric: an order number, \
an email address, a zip code, an account number, a product id, a tracking number, or the \
details needed to verify identity or recover an account.
- It is aleatoric only when the customer must state a real preference or choose between valid \
alternatives: a color, a size, a shipping speed, where a refund goes, which of several \
acceptable options to take; also when every fact is settled and only their choice is open \
(including "I don't mind", "whichever is cheaper", "surprise me"), or when the assistant would \
have to ask "yes or no", "which one" or "what should I do" because the choice itself is open.
- It is no_uncertainty when the assistant can call a tool or finish the request without asking \
anything more, including when the customer has already stated the preference.

Reply with one line holding only the label (epistemic, aleatoric or no_uncertainty), with no \
explanation and no punctuation.

Dialogue up to the decision point:
{history}

Label:"""


@dataclass(frozen=True)
class DecisionState:
    """One decision point: an id, the dialogue before the agent's next move, and its domain."""

    state_id: str
    messages: list[Message]
    domain: str | None = None


def read_states(path: str | Path) -> list[DecisionState]:
    """Decision states from a JSONL file with ``id`` (or ``state_id``) and ``messages`` per line."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"decision states file not found: {path}")
    states, seen = [], set()
    for number, obj in enumerate(read_jsonl(path), start=1):
        state_id = obj.get("state_id", obj.get("id"))
        if state_id is None or not isinstance(obj.get("messages"), list):
            raise ValueError(f"{path}: record {number} needs `id` (or `state_id`) and `messages`")
        if str(state_id) in seen:
            raise ValueError(f"{path}: record {number} repeats state id {state_id!r}")
        seen.add(str(state_id))
        states.append(DecisionState(str(state_id), obj["messages"], obj.get("domain")))
    return states


def parse_label(text: str) -> str | None:
    """The annotator's label from its reply (after any think block), or None if it is not one."""
    answer = answer_text(text).strip().lower()
    return answer if answer in LABEL_TO_ROUTE else None


def annotation_record(state: DecisionState, raw: str, excerpt_chars: int) -> dict[str, Any]:
    """One reviewable labels line for a state and the annotator's reply."""
    label = parse_label(raw)
    history = render_history(state.messages)
    return {
        "state_id": state.state_id,
        "history_excerpt": history[-excerpt_chars:],
        "annotator_label": label,
        "label": LABEL_TO_ROUTE.get(label) if label else None,
        "raw": raw,
        "corrected": None,
    }


def _existing_ids(path: Path) -> set[str]:
    return {str(obj.get("state_id")) for obj in read_jsonl(path)} if path.is_file() else set()


def _label_requests(states: Sequence[DecisionState], sampling: SamplingParams) -> list[ChatRequest]:
    return [
        ChatRequest(
            messages=[
                {
                    "role": "user",
                    "content": ANNOTATION_PROMPT.format(history=render_history(s.messages)),
                }
            ],
            sampling=sampling,
        )
        for s in states
    ]


def annotate(
    llm: LLM,
    states: Sequence[DecisionState],
    cfg: CalibrationConfig,
    out_path: str | Path | None = None,
    chunk_size: int = 64,
) -> list[dict[str, Any]]:
    """Label the states not yet in ``out_path`` (batched chunks, appended as each finishes); the
    ``router.calibration`` section sets the annotator's decoding and the history excerpt."""
    done = _existing_ids(Path(out_path)) if out_path else set()
    todo = [state for state in states if state.state_id not in done]
    sampling = SamplingParams(n=1, temperature=cfg.annotator_temperature,
                              max_tokens=cfg.annotator_max_tokens)
    excerpt_chars = cfg.excerpt_chars
    records: list[dict[str, Any]] = []
    for start in range(0, len(todo), chunk_size):
        chunk = todo[start : start + chunk_size]
        replies = llm.chat(_label_requests(chunk, sampling))
        new = [annotation_record(s, r[0].text, excerpt_chars) for s, r in zip(chunk, replies)]
        for record in new if out_path else []:
            append_jsonl(out_path, record)
        records.extend(new)
    unlabeled = sum(record["label"] is None for record in records)
    if unlabeled:
        logger.warning(
            "%d of %d annotator replies were not a label; review them", unlabeled, len(records)
        )
    return records


def read_labels(path: str | Path, unusable: list[str] | None = None) -> dict[str, str]:
    """state id -> route, ``corrected`` winning over ``label``. A state with no usable label
    (the annotator's reply was not one and nobody corrected it) raises, or, given the list
    ``unusable``, is left out and its id appended there."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"labels file not found: {path} (run `prour calibrate --stage label`)")
    labels: dict[str, str] = {}
    for obj in read_jsonl(path):
        value = obj.get("corrected") or obj.get("label")
        value = LABEL_TO_ROUTE.get(value, value)  # reviewers may write the rubric's names
        if value not in ROUTES:
            if unusable is not None:
                unusable.append(str(obj.get("state_id")))
                continue
            raise ValueError(
                f"{path}: state {obj.get('state_id')!r} has no usable label "
                f"(label={obj.get('label')!r}, corrected={obj.get('corrected')!r}); set "
                f"`corrected` to one of {', '.join(ROUTES)}"
            )
        labels[str(obj["state_id"])] = value
    return labels
