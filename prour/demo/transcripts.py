"""Oracle transcripts of train-split tau2 tasks: what the warm-start corpus is built from.

Each task's reference actions are replayed by the oracle agent and user through the episode
runner; every agent decision of the replay becomes a :class:`DecisionPoint` (the agent's view,
its decision, the observation). The task's instruction, rewritten in the first person, gives the
user's opening, the decomposer's goal reading and the normalized goal. Only the train split is
read: the test split is where evaluation runs.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prour.llm.base import Message

if TYPE_CHECKING:  # pragma: no cover
    from tau2.data_model.tasks import Task

    from prour.env.trajectory import Trajectory

# ---------------------------------------------------------------- first-person rewriting

_FIXED_PRONOUNS = (
    (r"you are", "I am"),
    (r"you're", "I'm"),
    (r"you were", "I was"),
    (r"you've", "I've"),
    (r"you'd", "I'd"),
    (r"you'll", "I'll"),
    (r"yourself", "myself"),
    (r"yours", "mine"),
    (r"your", "my"),
)
_CLAUSE_START = re.compile(
    r"(^|[.!?;:]\s+|\n\s*|,\s+|\b(?:and|but|or|if|that|because|when|so|since|unless|as|then|"
    r"while|which|though|although)\s+)$",
    re.IGNORECASE,
)


def _keep_case(original: str, replacement: str) -> str:
    return replacement[0].upper() + replacement[1:] if original[0].isupper() else replacement


def first_person(text: str) -> str:
    """Rewrite second-person instructions ("You want …, your order …") in the first person."""
    for pattern, replacement in _FIXED_PRONOUNS:
        text = re.sub(
            rf"\b{pattern}\b",
            lambda m, r=replacement: _keep_case(m.group(0), r),
            text,
            flags=re.IGNORECASE,
        )

    def you(match: re.Match[str]) -> str:
        subject = _CLAUSE_START.search(text[: match.start()]) is not None
        return "I" if subject else "me"

    return re.sub(r"\byou\b", you, text, flags=re.IGNORECASE)


def _clip(sentence: str, max_words: int = 16) -> str:
    """The sentence, cut after ``max_words`` words (a goal reading is one short sentence)."""
    words = sentence.split()
    if len(words) <= max_words:
        return sentence
    return " ".join(words[:max_words]).rstrip(",;:") + "."


def sentences(text: str) -> list[str]:
    """Sentences of a short text, whitespace collapsed."""
    flat = " ".join(text.split())
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", flat) if s.strip()]


# ---------------------------------------------------------------- transcripts


@dataclass(frozen=True)
class TaskText:
    """What the corpus takes from a task's instruction (never shown to the policy's prompts)."""

    domain: str
    task_id: str
    request: str  # the user's opening message, first person
    goal: str  # one first-person sentence: the decomposer's goal reading
    normalized_goal: str  # first-person rewrite of the instruction (G*)
    scenario: str  # what the user simulator is told
    instruction: str  # the goal normalizer's input


@dataclass
class DecisionPoint:
    """One agent decision of an oracle transcript: what the agent saw, what it did, what came back."""

    domain: str
    task_id: str
    history: list[Message]  # the agent's view before the decision, system prompt left out
    system: Message  # the agent's system prompt
    message: Message  # the decision: a tool-calling or a text message
    observation: str | None  # the result of the decision's tool call, if it is one
    index: int  # position among the transcript's decisions
    user_action: tuple[str, dict[str, Any]] | None = None  # a user-side tool the agent asks for

    @property
    def call(self) -> tuple[str, dict[str, Any]] | None:
        """(tool, arguments) of the decision's first tool call, or None for a text reply."""
        calls = self.message.get("tool_calls") or []
        if not calls:
            return None
        fn = calls[0]["function"]
        return fn["name"], json.loads(fn["arguments"])


def task_text(domain: str, task: Task) -> TaskText:
    """The first-person texts derived from a task's user instruction."""
    from prour.data.normalize import task_instruction

    instructions = task.user_scenario.instructions
    if isinstance(instructions, str):
        reason, known, unknown, extra = instructions, "", "", ""
    else:
        reason = instructions.reason_for_call or ""
        known = instructions.known_info or ""
        unknown = instructions.unknown_info or ""
        extra = instructions.task_instructions or ""
    request = " ".join(sentences(first_person(f"{reason} {known}")))
    goal_sentences = [_clip(s) for s in sentences(first_person(reason))] or [request]
    normalized = " ".join(sentences(first_person(f"{reason} {known} {unknown} {extra}")))
    return TaskText(
        domain=domain,
        task_id=task.id,
        request=request,
        goal=goal_sentences[0],
        normalized_goal=normalized,
        scenario=str(task.user_scenario),
        instruction=task_instruction(task),
    )


def oracle_transcript(domain: str, task: Task, opening: str | None = None) -> Trajectory:
    """The task's reference actions replayed by the oracle agent and user through the runner.

    The run is not scored (a warm start needs the messages only, and tau2's evaluator rebuilds
    the database three times); ``opening`` replaces the oracle user's bland first message.
    """
    from prour.config import EnvConfig
    from prour.env.agents import OracleAgent
    from prour.env.runner import run_episode
    from prour.env.users import OracleUser

    criteria = task.evaluation_criteria
    actions = list(criteria.actions or []) if criteria else []
    communicate = list(criteria.communicate_info or []) if criteria else []
    unscored = task.model_copy(update={"evaluation_criteria": None})
    traj = run_episode(domain, unscored, OracleAgent(actions, communicate), OracleUser(actions),
                       limits=EnvConfig(), split="train")
    if traj.termination == "error":
        raise RuntimeError(f"oracle replay of {domain}/{task.id} failed: {traj.errors}")
    if opening:
        first_user = next(i for i, m in enumerate(traj.messages) if m.get("role") == "user")
        traj.messages[first_user] = {**traj.messages[first_user], "content": opening}
    return traj


def decision_points(traj: Trajectory, task: Task | None = None) -> list[DecisionPoint]:
    """Every agent decision of a transcript with the agent's view before it.

    With the ``task``, a text message in which the oracle asks the user to run one of the user's
    own tools is marked with that tool (``user_action``).
    """
    from prour.data.decision_states import is_agent_decision
    from prour.env.trajectory import agent_view

    criteria = task.evaluation_criteria if task is not None else None
    user_actions = {
        a.action_id: (a.name, dict(a.arguments))
        for a in (criteria.actions or [] if criteria else [])
        if a.requestor == "user"
    }
    points = []
    for step in traj.steps:
        if not is_agent_decision(step):
            continue
        at = step.message_index
        seen = agent_view(traj.messages[:at], [s for s in traj.steps if s.message_index < at])
        message = traj.messages[at]
        after = traj.messages[at + 1] if at + 1 < len(traj.messages) else {}
        observation = after.get("content") if after.get("role") == "tool" else None
        points.append(
            DecisionPoint(
                domain=traj.domain,
                task_id=traj.task_id,
                history=[m for m in seen if m.get("role") != "system"],
                system=traj.messages[0],
                message=message,
                observation=observation if message.get("tool_calls") else None,
                index=len(points),
                user_action=user_actions.get(step.meta.get("oracle_action")),
            )
        )
    return points


def replay(domain: str, task_id: str) -> tuple[TaskText, Trajectory, list[DecisionPoint]]:
    """A task's texts, its oracle transcript (opened with the first-person request) and the
    transcript's decision points."""
    from prour.env.domains import get_task

    task = get_task(domain, task_id)
    text = task_text(domain, task)
    traj = oracle_transcript(domain, task, text.request)
    return text, traj, decision_points(traj, task)


def corpus_task_ids(
    domain: str, split: str = "train", seed: int = 0, tasks_per_domain: int | None = None
) -> list[str]:
    """The (seeded) subset of a split's tasks the corpus is built from, in tau2's order."""
    from prour.env.domains import split_task_ids

    check_split(split)
    ids = split_task_ids(domain, split)
    if tasks_per_domain is None or tasks_per_domain >= len(ids):
        return ids
    chosen = set(random.Random(f"warmstart-tasks:{seed}:{domain}").sample(ids, tasks_per_domain))
    return [task_id for task_id in ids if task_id in chosen]


def check_split(split: str) -> None:
    """Refuse every split but train: the test split is where evaluation runs."""
    if split != "train":
        raise ValueError(
            f"the warm-start corpus reads only the train split (got {split!r}); the test split is "
            "where evaluation runs"
        )
