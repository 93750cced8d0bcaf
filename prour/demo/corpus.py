"""The warm-start corpus: supervised examples built from oracle transcripts of train tasks.

Every prompt is rendered by the function the pipeline itself uses (agent and user prompts,
decomposer prompts, query-generator prompts, belief prompts, strict user, verifier, goal
normalizer, annotator), so the formats match exactly; only the targets are synthetic
(:mod:`prour.demo.targets`, :mod:`prour.demo.actions`).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prour.demo import actions, targets
from prour.demo.transcripts import DecisionPoint, TaskText, corpus_task_ids, replay
from prour.env.domains import DOMAINS
from prour.llm.base import Message

if TYPE_CHECKING:  # pragma: no cover
    from prour.env.trajectory import Trajectory

logger = logging.getLogger(__name__)

DEFAULT_TASKS_PER_DOMAIN = 12


@dataclass(frozen=True)
class SFTExample:
    """One supervised pair: chat prompt (rendered by the pipeline's own prompt function) → reply."""

    kind: str
    messages: list[Message]
    reply: Message  # the assistant message to learn (content, think block, tool calls)
    tools: list[dict[str, Any]] | None = None
    enable_thinking: bool = False
    domain: str = ""  # the task it comes from (set by Corpus.add)
    task_id: str = ""


@dataclass
class DomainContext:
    """Per-domain material shared by every example: tools, tool kinds, values, prompt helpers."""

    domain: str
    catalog: Any
    tools: list[dict[str, Any]]
    tools_text: dict[str, str]
    kinds: dict[str, str]
    pool: dict[str, list[Any]]
    verifier: Any
    strict_user: Any
    user_tools: list[dict[str, Any]]


def domain_context(domain: str, points: Sequence[DecisionPoint]) -> DomainContext:
    """Tools, their tau2 types, rendered tool lists and the value pool of a domain's transcripts."""
    from prour.config.rewards import RewardConfig
    from prour.env.environment import tool_schemas, tool_types, user_tool_schemas
    from prour.rollout.strict_user import StrictUserSimulator
    from prour.rollout.verifier import Verifier
    from prour.router.candidates import ToolCatalog, render_tools

    tools = tool_schemas(domain)
    catalog = ToolCatalog(tools)
    return DomainContext(
        domain=domain,
        catalog=catalog,
        tools=tools,
        tools_text={d: render_tools(catalog, d) for d in ("full", "brief")},
        kinds=tool_types(domain),
        pool=actions.value_pool(points),
        # Only the prompt builders of the two responders are used; no model is attached. The
        # verifier's prompt states its tool rounds: the default ``reward`` section's.
        verifier=Verifier(None, domain, RewardConfig()),  # type: ignore[arg-type]
        strict_user=StrictUserSimulator(None, RewardConfig()),  # type: ignore[arg-type]
        user_tools=user_tool_schemas(domain),
    )


def _text(content: str) -> Message:
    """An assistant reply of plain text."""
    return {"role": "assistant", "content": content}


def _user_turn(prompt: str) -> list[Message]:
    """A one-message chat: the prompt as the user's turn."""
    return [{"role": "user", "content": prompt}]


def query_examples(
    point: DecisionPoint, ctx: DomainContext, rng: random.Random
) -> list[SFTExample]:
    """The clarify and verify prompts of a state with a NO / YES [QUESTION] target."""
    from prour.rollout.query import query_prompt

    out = []
    for mode in ("clarify", "verify"):
        thinking = rng.random() < 0.5
        think = thinking and rng.random() < 0.4
        target = targets.query_target(mode, point, ctx.kinds, rng, think)
        out.append(
            SFTExample(
                f"query_{mode}",
                query_prompt(mode, point.history),
                _text(target),
                enable_thinking=thinking,
            )
        )
    return out


def candidate_target(reference: str, ctx: DomainContext, rng: random.Random) -> str:
    """What the action prompt learns to write: ``respond``, the reference action when it is
    simple, otherwise (and sometimes anyway) a READ call with schema-built arguments.

    Long write calls with nested arguments are hard for a 1M-parameter model to reproduce token
    by token at temperature 1; simple calls keep its samples valid, and still varied.
    """
    draw = rng.random()
    if draw < 0.08:
        return actions.respond_action()
    if draw < 0.3 or not actions.is_simple(reference):
        reads = [name for name in ctx.catalog.names if ctx.kinds.get(name) == "read"]
        variant = actions.variant_action(ctx.catalog, ctx.pool, rng, reads)
        if variant is not None and actions.is_simple(variant):
            return variant
        return reference if actions.is_simple(reference) else actions.respond_action()
    return reference


def garbled(goal: str, history: str, rng: random.Random) -> str:
    """A scrambled goal reading (shuffled, partly dropped, mixed with words of the dialogue).

    At temperature 1 a tiny model's own goal readings are often word salad; actions learned under
    such readings too stay well-formed whatever reading they are conditioned on.
    """
    words = [w for w in goal.split() if rng.random() < 0.7]
    pool = history.split()[-60:]
    words += [rng.choice(pool) for _ in range(rng.randint(0, 6))] if pool else []
    rng.shuffle(words)
    return " ".join(words) or goal


def decomposer_examples(
    point: DecisionPoint, ctx: DomainContext, text: TaskText, rng: random.Random
) -> list[SFTExample]:
    """A goal reading, a candidate action (the next one or a valid variant) and a scoring pair."""
    from prour.llm.history import render_history
    from prour.router.prompts import action_prompt, goal_prompt, score_prompt

    history = render_history(point.history)
    tools_text = ctx.tools_text[rng.choice(("full", "brief"))]
    scored = actions.next_action(point)
    action = candidate_target(scored, ctx, rng)
    reading = garbled(text.goal, history, rng) if rng.random() < 0.4 else text.goal
    return [
        SFTExample("goal", _user_turn(goal_prompt(history)), _text(text.goal)),
        SFTExample(
            "action",
            _user_turn(action_prompt(history, tools_text, reading)),
            _text(actions.as_sampled(action)),
        ),
        SFTExample(
            "score", _user_turn(score_prompt(history, tools_text, text.goal)), _text(scored)
        ),
    ]


def belief_examples(point: DecisionPoint, text: TaskText) -> list[SFTExample]:
    """Prior belief contexts with their reward targets (G*; the next call's canonical JSON)."""
    from prour.rewards.belief import belief_prompt

    out = [
        SFTExample(
            "belief_clarify", belief_prompt("clarify", point.history), _text(text.normalized_goal)
        )
    ]
    if point.call is not None:
        out.append(
            SFTExample(
                "belief_verify",
                belief_prompt("verify", point.history),
                _text(actions.next_action(point)),
            )
        )
    return out


def responder_examples(
    point: DecisionPoint, ctx: DomainContext, text: TaskText, rng: random.Random
) -> list[SFTExample]:
    """A strict-user reply and, before a READ lookup, the verifier's call and grounded answer."""
    call = point.call
    question = (
        targets.query_question("clarify", call[0], call[1], rng)
        if call is not None and rng.random() < 0.7
        else rng.choice(targets.VAGUE_QUESTIONS)
    )
    strict = ctx.strict_user.messages(text.normalized_goal, question)
    out = [
        SFTExample(
            "strict_user", strict, _text(targets.strict_user_reply(text.normalized_goal, question))
        )
    ]
    if call is not None and ctx.kinds.get(call[0]) == "read" and point.observation:
        out += verifier_examples(point, ctx, rng)
    return out


def verifier_examples(
    point: DecisionPoint, ctx: DomainContext, rng: random.Random
) -> list[SFTExample]:
    """The verifier's READ call for a verify question, then its answer citing the result."""
    from prour.rollout.grounding import ToolEvidence, grounding

    tool, arguments = point.call or ("", {})
    answer = targets.verifier_answer(tool, arguments, point.observation or "")
    evidence = [ToolEvidence(tool, point.observation or "")]
    if answer is None or grounding(answer, evidence, "") is None:
        return []
    question = targets.query_question("verify", tool, arguments, rng)
    opening = ctx.verifier.messages(question, point.history)
    call = {**point.message, "content": ""}
    result = {
        "role": "tool",
        "tool_call_id": call["tool_calls"][0]["id"],
        "name": tool,
        "content": point.observation,
    }
    return [
        SFTExample("verifier", opening, call, tools=ctx.verifier.schemas),
        SFTExample("verifier", [*opening, call, result], _text(answer), tools=ctx.verifier.schemas),
    ]


def annotation_example(point: DecisionPoint, ctx: DomainContext) -> SFTExample:
    """The annotator's label of a state: READ next → epistemic, WRITE → aleatoric, else none."""
    from prour.llm.history import render_history
    from prour.router.annotation import ANNOTATION_PROMPT

    call = point.call
    kind = ctx.kinds.get(call[0], "reply") if call is not None else "reply"
    label = targets.ANNOTATION_LABELS.get(kind, targets.ANNOTATION_LABELS["reply"])
    prompt = ANNOTATION_PROMPT.format(history=render_history(point.history))
    return SFTExample("annotate", _user_turn(prompt), _text(label))


def agent_example(point: DecisionPoint, ctx: DomainContext) -> SFTExample:
    """The task agent's own turn: system prompt and tools, the dialogue, its call or reply."""
    reply = {k: v for k, v in point.message.items() if k in ("role", "content", "tool_calls")}
    return SFTExample("agent", [point.system, *point.history], reply, tools=ctx.tools)


def transcript_examples(traj: Trajectory, ctx: DomainContext, text: TaskText) -> list[SFTExample]:
    """Per task: the user simulator's turns (opening rewritten) and the normalized goal."""
    from prour.data.normalize import goal_prompt
    from prour.env.prompts import user_system_prompt
    from prour.env.trajectory import user_view
    from prour.env.users import flip_roles

    view = user_view(traj.messages, traj.steps)
    system = {"role": "system", "content": user_system_prompt(text.scenario, bool(ctx.user_tools))}
    out = []
    for j, message in enumerate(view):
        if message.get("role") == "user":
            reply = flip_roles([message])[0]
            out.append(
                SFTExample(
                    "user", [system, *flip_roles(view[:j])], reply, tools=ctx.user_tools or None
                )
            )
    out.append(SFTExample("normalize", goal_prompt(text.instruction), _text(text.normalized_goal)))
    return out


def point_examples(
    point: DecisionPoint, ctx: DomainContext, text: TaskText, rng: random.Random
) -> list[SFTExample]:
    """Every example one decision state gives."""
    return [
        agent_example(point, ctx),
        *query_examples(point, ctx, rng),
        *decomposer_examples(point, ctx, text, rng),
        *belief_examples(point, text),
        *responder_examples(point, ctx, text, rng),
        annotation_example(point, ctx),
    ]


@dataclass
class Corpus:
    """Examples by kind, plus what they were built from."""

    examples: dict[str, list[SFTExample]] = field(default_factory=dict)
    tasks: dict[str, list[str]] = field(default_factory=dict)
    seconds: float = 0.0

    def add(self, items: Sequence[SFTExample], domain: str, task_id: str) -> None:
        """File examples under their kind, labelled with the task they come from."""
        for item in items:
            labelled = dataclasses.replace(item, domain=domain, task_id=task_id)
            self.examples.setdefault(item.kind, []).append(labelled)

    def stats(self) -> dict[str, Any]:
        """Tasks and example counts, as the warm-started folder records them."""
        return {
            "tasks": {d: len(ids) for d, ids in self.tasks.items()},
            "task_ids": self.tasks,
            "examples": {k: len(v) for k, v in sorted(self.examples.items())},
            "build_seconds": round(self.seconds, 2),
        }


def build_corpus(
    domains: Sequence[str] = DOMAINS,
    split: str = "train",
    seed: int = 0,
    tasks_per_domain: int | None = DEFAULT_TASKS_PER_DOMAIN,
) -> Corpus:
    """The synthetic supervised corpus from oracle replays of (a seeded subset of) train tasks."""
    start = time.perf_counter()
    corpus = Corpus()
    for domain in domains:
        ids = corpus_task_ids(domain, split, seed, tasks_per_domain)
        corpus.tasks[domain] = ids
        replays = {task_id: replay(domain, task_id) for task_id in ids}
        ctx = domain_context(domain, [p for _, _, points in replays.values() for p in points])
        for task_id, (text, traj, points) in replays.items():
            rng = random.Random(f"warmstart-corpus:{seed}:{domain}:{task_id}")
            corpus.add(transcript_examples(traj, ctx, text), domain, task_id)
            for point in points:
                corpus.add(point_examples(point, ctx, text, rng), domain, task_id)
        logger.info("warm-start corpus: %s, %d tasks", domain, len(ids))
    corpus.seconds = time.perf_counter() - start
    return corpus
