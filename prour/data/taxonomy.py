"""The uncertainty taxonomy of the paper's Appendix A.1 (Table 5, Figure 2): every decision step of
the collected retail and airline trajectories (each agent response or tool call the task agent
made itself) is shown to the annotator (``models.annotator``) with the task's instruction, the
recent dialogue, the decision, the task's reference actions and outputs, and the tool results
that followed it. The annotator answers one strict-JSON object: whether uncertainty is present,
its kind (epistemic, aleatoric or none), its source (a world-side or user-side source of
:mod:`prour.data.taxonomy_labels`), the uncertain object, the evidence, the outcome and an open
label. A reply that fails validation is asked again with the error shown
(``taxonomy.annotator_attempts``); one that never validates is kept with its replies and errors,
for the reviewer to label.

The labels file (``<run_dir>/taxonomy/labels.jsonl``) holds one line per decision step, appended
as each chunk is annotated, so a rerun asks only for the steps not there yet. A person reviews it
and sets ``corrected`` (a source name, ``none``, or the seven fields) where the annotator was
wrong or gave nothing usable; the ``taxonomy-review`` gate then approves it.

The reference actions and outputs reach this annotator only: no agent, policy or router prompt
sees them.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from prour.data.taxonomy_labels import (
    FIELDS,
    NO_UNCERTAINTY,
    USER_SOURCES,
    WORLD_SOURCES,
    labels_path,
    taxonomy_dir,
    validate_annotation,
)
from prour.env.trajectory import Trajectory, agent_view, read_jsonl
from prour.files import append_jsonl, repair_torn_tail
from prour.llm.base import LLM, Message, SamplingParams
from prour.llm.history import render_history, render_message

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe
    from prour.config.taxonomy import TaxonomyConfig

logger = logging.getLogger(__name__)

PROMPT_VERSION = "taxonomy-1"
RESPONSE, TOOL_CALL = "response", "tool_call"
EXCERPT_CHARS = 1500  # the tail of the context a reviewer reads in the labels line


@dataclass(frozen=True)
class Decision:
    """One decision step: the agent's response or tool call, what it saw just before, and the
    tool results that followed it."""

    decision_id: str
    trajectory_id: str
    domain: str
    task_id: str
    split: str | None
    index: int  # among the agent's own decisions of the trajectory, from 0
    message_index: int
    type: str  # response or tool_call
    tools: tuple[str, ...]  # the tools it calls (a response: none)
    context: tuple[Message, ...]  # the dialogue's last messages before it, as the agent saw it
    decision: Message
    observations: tuple[Message, ...]  # the tool results right after it


def decision_steps(traj: Trajectory, context_messages: int) -> list[Decision]:
    """Every decision step of a trajectory: each agent message or tool call the task agent made
    during the episode (the task's prior history, the greeting and the teacher's questions are
    not the agent's decisions)."""
    from prour.data.collect import trajectory_id
    from prour.data.decision_states import is_agent_decision
    from prour.data.schema import decision_id_of

    tid = trajectory_id(traj)
    steps = []
    for index, step in enumerate(s for s in traj.steps if is_agent_decision(s)):
        at = step.message_index
        seen = agent_view(traj.messages[:at], [s for s in traj.steps if s.message_index < at])
        context = [m for m in seen if m.get("role") != "system"][-context_messages:]
        message = traj.messages[at]
        observations = []
        for following in traj.messages[at + 1:]:
            if following.get("role") != "tool":
                break
            observations.append(following)
        calls = message.get("tool_calls") or []
        tools = tuple(str((c.get("function") or {}).get("name") or "?") for c in calls)
        steps.append(Decision(decision_id_of(tid, index), tid, traj.domain, traj.task_id,
                              traj.split, index, at, TOOL_CALL if calls else RESPONSE, tools,
                              tuple(context), message, tuple(observations)))
    return steps


def decisions_of(paths: Iterable[Path], on_bad_line: str,
                 context_messages: int) -> list[Decision]:
    """The decision steps of every trajectory in the files (one per resume key, the last record
    of a key winning), in file and trajectory order."""
    from prour.data.collect import load_trajectories

    found = []
    for path in paths:
        for traj in load_trajectories(path, on_bad_line):
            found += decision_steps(traj, context_messages)
    return found


# ---- what the annotator reads ---------------------------------------------------------------------


@dataclass(frozen=True)
class Reference:
    """What the task's instruction asks and what a correct run does: its reference actions (the
    agent's) and the outputs it must tell the user."""

    instruction: str
    actions: tuple[str, ...]
    outputs: tuple[str, ...]


@functools.cache
def reference_of(domain: str, task_id: str, split: str | None) -> Reference:
    """The task's instruction, reference actions (``name({arguments})``) and outputs."""
    from prour.data.decision_states import reference_actions
    from prour.data.normalize import task_instruction
    from prour.env.domains import get_task

    task = get_task(domain, task_id, split)
    actions = tuple(f"{a.name}({json.dumps(a.arguments, sort_keys=True, ensure_ascii=False)})"
                    for a in reference_actions(domain, task_id))
    criteria = task.evaluation_criteria
    outputs = tuple(str(x) for x in (criteria.communicate_info or [])) if criteria else ()
    return Reference(task_instruction(task), actions, outputs)


def _listed(items: Sequence[str], empty: str) -> str:
    return "\n".join(f"- {item}" for item in items) if items else empty


def _sources(sources: dict[str, str]) -> str:
    return "\n".join(f"  - {name}: {what}" for name, what in sources.items())


PROMPT = """\
You study one decision of a customer-service agent that serves a customer with tools and under \
a domain policy. Say whether the agent lacked information it needed at this decision, what kind \
of uncertainty that was, and where the missing information could have been found.

Kinds:
- epistemic: the missing information is about the world; the agent could get it without the \
customer, from one of these sources:
{world}
- aleatoric: only the customer can supply it, from one of these sources:
{user}
- none: the agent had what it needed for this decision.

Rules:
- Judge what the agent knew at the decision, not how the episode ended: uncertainty that the \
agent handled well still counts, and a decision that differs from the reference actions is not \
uncertain for that reason alone.
- The reference actions and outputs show what a correct run does; they help you understand the \
task, they are not an answer key.
- A fact that the records or tools hold is epistemic even when the customer could also tell it \
(an order number, the flights of a reservation).

The customer's task:
{instruction}

Reference actions of a correct run:
{actions}

Reference outputs the agent must tell the customer:
{outputs}

The dialogue just before the decision:
{context}

The decision:
{decision}

Tool results right after it:
{observations}

Answer with one JSON object and nothing else, with exactly these fields:
{{"present": true or false, "kind": "epistemic", "aleatoric" or "none", "source": one of \
{names}, or null when kind is none, "object": what was uncertain (a few words; "" when none), \
"evidence": what the agent had or lacked to settle it, "outcome": how it was resolved (or that \
it was not), "label": a short name for this kind of case}}"""


def annotation_prompt(decision: Decision, reference: Reference) -> list[Message]:
    """The annotator's one user message for a decision step."""
    names = ", ".join(f'"{name}"' for name in (*WORLD_SOURCES, *USER_SOURCES))
    text = PROMPT.format(
        world=_sources(WORLD_SOURCES), user=_sources(USER_SOURCES),
        instruction=reference.instruction.strip() or "(none recorded)",
        actions=_listed(reference.actions, "(none: the task needs no tool action)"),
        outputs=_listed(reference.outputs, "(none)"),
        context=render_history(decision.context) or "(the dialogue starts here)",
        decision="\n".join(render_message(decision.decision)) or "(an empty message)",
        observations=render_history(decision.observations) or "(none)",
        names=names)
    return [{"role": "user", "content": text}]


def excerpt(decision: Decision) -> str:
    """What a reviewer reads in the labels line: the context's tail, the decision, the results."""
    context = render_history(decision.context)[-EXCERPT_CHARS:]
    after = render_history(decision.observations)
    return "\n".join(part for part in (context, ">>> " + "\n".join(
        render_message(decision.decision)), after) if part)


def label_record(decision: Decision, outcome: Any) -> dict[str, Any]:
    """One labels line: the decision step, the annotator's validated annotation (None when no
    attempt validated), the attempts, their errors and replies, and ``corrected`` for the
    reviewer."""
    return {
        "decision_id": decision.decision_id, "trajectory_id": decision.trajectory_id,
        "domain": decision.domain, "task_id": decision.task_id, "decision": decision.index,
        "message_index": decision.message_index, "type": decision.type,
        "tools": list(decision.tools), "excerpt": excerpt(decision),
        "annotation": outcome.value, "attempts": outcome.attempts, "errors": outcome.errors,
        "raw": outcome.raw, "prompt_version": PROMPT_VERSION, "corrected": None,
    }


def _existing_ids(path: Path) -> set[str]:
    """Decision ids already in the labels file (a line torn by a crash is cut first)."""
    repair_torn_tail(path, "its decision step is annotated again")
    if not path.is_file():
        return set()
    return {str(record.get("decision_id")) for record in read_jsonl(path)}


def annotate(llm: LLM, decisions: Sequence[Decision], cfg: TaxonomyConfig, out_path: Path,
             chunk_size: int = 32) -> list[dict[str, Any]]:
    """Annotate the decision steps not yet in ``out_path`` (a chunk at a time, each line appended
    as its chunk finishes); returns the new lines."""
    from prour.llm.strict_json import ask_json

    done = _existing_ids(out_path)
    todo = [d for d in decisions if d.decision_id not in done]
    sampling = SamplingParams(n=1, temperature=cfg.temperature, max_tokens=cfg.max_tokens)
    records: list[dict[str, Any]] = []
    for start in range(0, len(todo), chunk_size):
        chunk = todo[start:start + chunk_size]
        prompts = [annotation_prompt(d, reference_of(d.domain, d.task_id, d.split))
                   for d in chunk]
        outcomes = ask_json(llm, prompts, validate_annotation, cfg.annotator_attempts, sampling)
        for decision, outcome in zip(chunk, outcomes):
            record = label_record(decision, outcome)
            append_jsonl(out_path, record)
            records.append(record)
    failed = sum(record["annotation"] is None for record in records)
    if failed:
        logger.warning("%d of %d annotator replies never validated; review them in %s",
                       failed, len(records), out_path)
    return records


# ---- the recipe's files ---------------------------------------------------------------------------


class File(Protocol):
    """A trajectories file the chain's taxonomy step reads (a :class:`prour.step.File`)."""

    key: str
    path: Path


def recipe_decisions(recipe: Recipe, sources: Sequence[File]) -> tuple[list[Decision], list[str]]:
    """The decision steps of the trajectory files ``sources`` (what the chain's taxonomy step
    reads: :func:`prour.data.steps.taxonomy_sources`), and a line per file not there yet."""
    present, lacking = [], []
    for file in sources:
        if file.path.is_file():
            present.append(file.path)
        else:
            lacking.append(f"{file.path} ({file.key}) is not there yet: its decision steps are "
                           "not annotated")
    decisions = decisions_of(present, recipe.data.on_bad_line, recipe.taxonomy.context_messages)
    return decisions, lacking


def annotated(recipe: Recipe, sources: Sequence[File]) -> bool:
    """Done: every file of ``sources`` is there and each of its decision steps has a line."""
    decisions, lacking = recipe_decisions(recipe, sources)
    path = labels_path(taxonomy_dir(recipe))
    if lacking or not path.is_file():
        return False
    have = {str(record.get("decision_id")) for record in read_jsonl(path, on_error="skip")}
    return all(d.decision_id in have for d in decisions)


__all__ = ["FIELDS", "NO_UNCERTAINTY", "Decision", "Reference", "annotate", "annotated",
           "annotation_prompt", "decision_steps", "decisions_of", "label_record",
           "recipe_decisions", "reference_of"]
