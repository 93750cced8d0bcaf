"""Warm start of the tiny model: a short supervised pass so that the CPU pipeline sees valid outputs.

A random tiny Qwen3 writes noise, so every parser downstream would see only invalid outputs and
every reward would be flat. This module builds a small supervised corpus from *train-split* tau2
tasks (never the test split, where evaluation runs) and fine-tunes the tiny model on it for a few
hundred steps on CPU. Every prompt is rendered by the function the pipeline itself uses (agent and
user prompts, decomposer prompts, query-generator prompts, belief prompts, strict user, verifier,
goal normalizer, annotator), so the formats match exactly; only the targets are synthetic:

* oracle transcripts: each task's reference actions replayed through the episode runner; the agent
  turns (``<tool_call>`` blocks and replies) and the user turns are targets;
* the decomposer: first-person goal readings derived from the task instruction (a stand-in for
  pretraining, allowed here and nowhere else) and candidate actions as canonical JSON: the next
  reference action or another tool of the domain with arguments built from its schema;
* the query generator: ``NO`` or ``YES [QUESTION]…[/QUESTION]`` naming a value of the dialogue,
  some after a short think block. Verify says YES before a READ lookup, clarify says YES before a
  WRITE call (the user confirms consequential changes), so the answers carry some signal;
* strict-user replies, verifier tool calls and grounded final answers, normalized goals, belief
  targets and annotator labels.

Training computes the loss on target tokens only, from left-truncated sequences. The result is a
standard Hugging Face folder with ``prour_warmstart.json`` (arguments, corpus stats, loss curve);
a folder built with the same arguments is reused, like :func:`prour.llm.tiny.build_tiny_model`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import random
import re
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prour.llm.base import Message

if TYPE_CHECKING:  # pragma: no cover
    from tau2.data_model.tasks import Task

    from prour.env.trajectory import Trajectory

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
MARKER_FILE = "prour_warmstart.json"
TINY_MARKER_FILE = "prour_tiny.json"  # the base model's marker; not copied into the warm folder

DEFAULT_STEPS = 300
DEFAULT_TASKS_PER_DOMAIN = 12

# Share of training sequences drawn from each kind of example (renormalized over the kinds the
# corpus has). The query generator and the decomposer's actions get the most: the pipeline parses
# them strictly.
KIND_WEIGHTS: dict[str, float] = {
    "action": 0.45,
    "goal": 0.07,
    "score": 0.03,
    "query_clarify": 0.10,
    "query_verify": 0.10,
    "strict_user": 0.05,
    "normalize": 0.03,
    "belief_clarify": 0.02,
    "belief_verify": 0.02,
    "annotate": 0.03,
    "agent": 0.03,
    "user": 0.02,
    "verifier": 0.03,
}

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


def _sentences(text: str) -> list[str]:
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
    request = " ".join(_sentences(first_person(f"{reason} {known}")))
    goal_sentences = [_clip(s) for s in _sentences(first_person(reason))] or [request]
    normalized = " ".join(_sentences(first_person(" ".join((reason, known, unknown, extra)))))
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
    from prour.env.agents import OracleAgent
    from prour.env.runner import run_episode
    from prour.env.users import OracleUser

    criteria = task.evaluation_criteria
    actions = list(criteria.actions or []) if criteria else []
    communicate = list(criteria.communicate_info or []) if criteria else []
    unscored = task.model_copy(update={"evaluation_criteria": None})
    traj = run_episode(
        domain, unscored, OracleAgent(actions, communicate), OracleUser(actions), split="train"
    )
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
    from prour.data.extract import is_agent_decision
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


def corpus_task_ids(
    domain: str, split: str = "train", seed: int = 0, tasks_per_domain: int | None = None
) -> list[str]:
    """The (seeded) subset of a split's tasks the corpus is built from, in tau2's order."""
    from prour.env.domains import split_task_ids

    _check_split(split)
    ids = split_task_ids(domain, split)
    if tasks_per_domain is None or tasks_per_domain >= len(ids):
        return ids
    chosen = set(random.Random(f"warmstart-tasks:{seed}:{domain}").sample(ids, tasks_per_domain))
    return [task_id for task_id in ids if task_id in chosen]


def _check_split(split: str) -> None:
    if split != "train":
        raise ValueError(
            f"the warm-start corpus reads only the train split (got {split!r}); the test split is "
            "where evaluation runs"
        )


# ---------------------------------------------------------------- synthetic targets

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
_VAGUE_QUESTIONS = ("Anything else?", "Can you tell me more?", "Is there anything else I should know?")
_DEFLECTIONS = ("No, that's all.", "Just do what I asked.")
_THINK = {
    ("clarify", True): ("This change needs the user's consent.", "The user must confirm first."),
    ("clarify", False): ("Nothing is left for the user to decide.", "The user's wish is clear."),
    ("verify", True): ("A lookup is needed first.", "I should check the record."),
    ("verify", False): ("The facts are already known.", "No lookup is needed now."),
}
ANNOTATION_LABELS = {"read": "epistemic", "write": "aleatoric", "reply": "no_uncertainty"}


def _words(key: str) -> str:
    return key.replace("_", " ")


def _scalars(value: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """(key, value) for every string or number leaf of a JSON value (list items keep their key)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _scalars(v, str(k))
    elif isinstance(value, list):
        for item in value:
            yield from _scalars(item, key)
    elif isinstance(value, (str, int, float)) and not isinstance(value, bool):
        yield key, value


def _nameable(arguments: dict[str, Any]) -> list[tuple[str, Any]]:
    """Short argument values a question can name (ids, names, amounts)."""
    return [
        (k, v)
        for k, v in _scalars(arguments)
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
    question = None
    if mode == "verify" and call is not None and kinds.get(call[0]) == "read":
        question = query_question(mode, call[0], call[1], rng)
    elif mode == "clarify" and call is not None and kinds.get(call[0]) == "write":
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
    if question in _VAGUE_QUESTIONS:
        return _DEFLECTIONS[len(question) % len(_DEFLECTIONS)]
    asked = set(re.findall(r"[\w#@.-]+", question.lower()))
    sentences = _sentences(goal) or [goal]
    scored = [(len(asked & set(re.findall(r"[\w#@.-]+", s.lower()))), -i) for i, s in
              enumerate(sentences)]
    best = max(range(len(sentences)), key=lambda i: scored[i])
    return sentences[best] if scored[best][0] else _DEFLECTIONS[0]


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
    asked = {json.dumps(v) for _, v in _scalars(arguments)}
    for key, value in _scalars(parsed):
        citable = isinstance(value, (int, float)) or 3 <= len(str(value)) <= 60
        if key and citable and json.dumps(value) not in asked:
            return f'{call} returned {_words(key)} "{value}".'
    return None


# ---------------------------------------------------------------- candidate actions


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Follow a local ``$ref`` and take the first non-null option of ``anyOf``."""
    ref = schema.get("$ref")
    if isinstance(ref, str):
        schema = defs.get(ref.rsplit("/", 1)[-1], {})
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        typed = [o for o in options if o.get("type") != "null"]
        schema = _resolve(typed[0] if typed else options[0], defs)
    return schema


def schema_value(
    schema: dict[str, Any], key: str, pool: dict[str, list[Any]], rng: random.Random,
    defs: dict[str, Any], depth: int = 0,
) -> Any:
    """A plausible value for an argument: one seen under the same key, else one of its type."""
    schema = _resolve(schema, defs)
    if "enum" in schema:
        return rng.choice(schema["enum"])
    kind = schema.get("type")
    if kind == "array":
        item = schema_value(schema.get("items") or {}, key.rstrip("s"), pool, rng, defs, depth + 1)
        return [item]
    if kind == "object" or "properties" in schema:
        return schema_arguments(schema, pool, rng, defs, depth + 1)
    seen = next((found for found in (_pooled(pool, k, kind) for k in _key_suffixes(key)) if found),
                [])
    if seen:
        return rng.choice(seen)
    if kind in ("integer", "number"):
        return rng.randint(1, 3)
    if kind == "boolean":
        return rng.random() < 0.5
    return f"{key}_{rng.randint(1, 9)}" if key else "value"


def _key_suffixes(key: str) -> list[str]:
    """``new_item_id`` → ``new_item_id``, ``item_id``, ``id``: where to look for seen values."""
    parts = key.split("_")
    return ["_".join(parts[i:]) for i in range(len(parts))]


def _pooled(pool: dict[str, list[Any]], key: str, kind: Any) -> list[Any]:
    return [v for v in pool.get(key, []) if _fits(v, kind)]


def _fits(value: Any, kind: Any) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, str) if kind in (None, "string") else False


def schema_arguments(
    schema: dict[str, Any], pool: dict[str, list[Any]], rng: random.Random,
    defs: dict[str, Any] | None = None, depth: int = 0, optional_rate: float = 0.0,
) -> dict[str, Any]:
    """Arguments for a JSON-schema object: every required property (optional ones at a rate)."""
    defs = {**(defs or {}), **(schema.get("$defs") or {})}
    if depth > 4:
        return {}
    required = set(schema.get("required") or [])
    return {
        key: schema_value(spec, key, pool, rng, defs, depth)
        for key, spec in (schema.get("properties") or {}).items()
        if key in required or rng.random() < optional_rate
    }


def value_pool(points: Sequence[DecisionPoint], per_key: int = 3) -> dict[str, list[Any]]:
    """The first ``per_key`` values seen under each key in tool calls and results.

    Few values per key on purpose: variants then reuse a small set the tiny model can learn to
    write, so its sampled variants stay well-formed (ids it cannot copy yet would not).
    """
    pool: dict[str, list[Any]] = {}
    for point in points:
        call = point.call
        leaves = list(_scalars(call[1])) if call else []
        with contextlib.suppress(json.JSONDecodeError):
            leaves += list(_scalars(json.loads(point.observation or "")))
        for key, value in leaves:
            seen = pool.setdefault(key, [])
            if key and value not in seen and len(seen) < per_key:
                seen.append(value)
    return pool


def variant_action(
    catalog: Any, pool: dict[str, list[Any]], rng: random.Random,
    names: Sequence[str] | None = None, tries: int = 6,
) -> str | None:
    """Canonical JSON of a valid call of a random tool (of ``names``, default all of the domain)
    with schema-built arguments."""
    from prour.router.candidates import canonical_json, parse_action

    for _ in range(tries):
        name = rng.choice(list(names or catalog.names))
        params = catalog.schemas[name].get("function", catalog.schemas[name]).get("parameters")
        arguments = schema_arguments(params or {}, pool, rng)
        parsed = parse_action(canonical_json({"tool": name, "arguments": arguments}), catalog)
        if parsed.valid:
            return parsed.canonical
    return None


def is_simple(canonical: str, max_arguments: int = 3) -> bool:
    """An action with at most ``max_arguments`` scalar arguments of modest length."""
    arguments = json.loads(canonical)["arguments"]
    return len(arguments) <= max_arguments and all(
        isinstance(v, (int, float, bool)) or (isinstance(v, str) and len(v) <= 40)
        for v in arguments.values()
    )


def as_sampled(canonical: str) -> str:
    """An action in the shape the action prompt shows: ``{"tool": …, "arguments": …}``.

    The tool comes first so that the arguments are written knowing the tool; the parser accepts
    any key order and canonicalizes.
    """
    action = json.loads(canonical)
    return json.dumps({"tool": action["tool"], "arguments": action["arguments"]}, ensure_ascii=False)


def respond_action() -> str:
    """Canonical JSON of the decomposer's "answer the user" action."""
    from prour.router.candidates import RESPOND, canonical_json

    return canonical_json({"tool": RESPOND, "arguments": {}})


def next_action(point: DecisionPoint) -> str:
    """Canonical JSON of the decision: its first tool call, or ``respond`` for a text reply."""
    from prour.router.candidates import canonical_json

    call = point.call
    if call is None:
        return respond_action()
    return canonical_json({"tool": call[0], "arguments": call[1]})


# ---------------------------------------------------------------- examples


@dataclass(frozen=True)
class SFTExample:
    """One supervised pair: chat prompt (rendered by the pipeline's own prompt function) → reply."""

    kind: str
    messages: list[Message]
    reply: Message  # the assistant message to learn (content, think block, tool calls)
    tools: list[dict[str, Any]] | None = None
    enable_thinking: bool = False


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
        pool=value_pool(points),
        # Only the prompt builders of the two responders are used; no model is attached.
        verifier=Verifier(None, domain),  # type: ignore[arg-type]
        strict_user=StrictUserSimulator(None),  # type: ignore[arg-type]
        user_tools=user_tool_schemas(domain),
    )


def _text(content: str) -> Message:
    return {"role": "assistant", "content": content}


def _user_turn(prompt: str) -> list[Message]:
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
        target = query_target(mode, point, ctx.kinds, rng, think)
        out.append(
            SFTExample(f"query_{mode}", query_prompt(mode, point.history), _text(target),
                       enable_thinking=thinking)
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
        return respond_action()
    if draw < 0.3 or not is_simple(reference):
        reads = [name for name in ctx.catalog.names if ctx.kinds.get(name) == "read"]
        variant = variant_action(ctx.catalog, ctx.pool, rng, reads)
        if variant is not None and is_simple(variant):
            return variant
        return reference if is_simple(reference) else respond_action()
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
    from prour.env.history import render_history
    from prour.router.prompts import action_prompt, goal_prompt, score_prompt

    history = render_history(point.history)
    tools_text = ctx.tools_text[rng.choice(("full", "brief"))]
    scored = next_action(point)
    action = candidate_target(scored, ctx, rng)
    reading = garbled(text.goal, history, rng) if rng.random() < 0.4 else text.goal
    return [
        SFTExample("goal", _user_turn(goal_prompt(history)), _text(text.goal)),
        SFTExample("action", _user_turn(action_prompt(history, tools_text, reading)),
                   _text(as_sampled(action))),
        SFTExample("score", _user_turn(score_prompt(history, tools_text, text.goal)),
                   _text(scored)),
    ]


def belief_examples(point: DecisionPoint, text: TaskText) -> list[SFTExample]:
    """Prior belief contexts with their reward targets (G*; the next call's canonical JSON)."""
    from prour.rewards.belief import belief_prompt

    out = [SFTExample("belief_clarify", belief_prompt("clarify", point.history),
                      _text(text.normalized_goal))]
    if point.call is not None:
        out.append(SFTExample("belief_verify", belief_prompt("verify", point.history),
                              _text(next_action(point))))
    return out


def responder_examples(
    point: DecisionPoint, ctx: DomainContext, text: TaskText, rng: random.Random
) -> list[SFTExample]:
    """A strict-user reply and, before a READ lookup, the verifier's call and grounded answer."""
    call = point.call
    question = (
        query_question("clarify", call[0], call[1], rng)
        if call is not None and rng.random() < 0.7
        else rng.choice(_VAGUE_QUESTIONS)
    )
    strict = ctx.strict_user.messages(text.normalized_goal, question)
    out = [SFTExample("strict_user", strict,
                      _text(strict_user_reply(text.normalized_goal, question)))]
    if call is not None and ctx.kinds.get(call[0]) == "read" and point.observation:
        out += verifier_examples(point, ctx, rng)
    return out


def verifier_examples(
    point: DecisionPoint, ctx: DomainContext, rng: random.Random
) -> list[SFTExample]:
    """The verifier's READ call for a verify question, then its answer citing the result."""
    from prour.rollout.grounding import ToolEvidence, grounding

    tool, arguments = point.call or ("", {})
    answer = verifier_answer(tool, arguments, point.observation or "")
    evidence = [ToolEvidence(tool, point.observation or "")]
    if answer is None or grounding(answer, evidence, "") is None:
        return []
    question = query_question("verify", tool, arguments, rng)
    opening = ctx.verifier.messages(question, point.history)
    call = {**point.message, "content": ""}
    result = {"role": "tool", "tool_call_id": call["tool_calls"][0]["id"], "name": tool,
              "content": point.observation}
    return [
        SFTExample("verifier", opening, call, tools=ctx.verifier.schemas),
        SFTExample("verifier", [*opening, call, result], _text(answer), tools=ctx.verifier.schemas),
    ]


def annotation_example(point: DecisionPoint, ctx: DomainContext) -> SFTExample:
    """The annotator's label of a state: READ next → epistemic, WRITE → aleatoric, else none."""
    from prour.env.history import render_history
    from prour.router.annotation import ANNOTATION_PROMPT

    call = point.call
    kind = ctx.kinds.get(call[0], "reply") if call is not None else "reply"
    label = ANNOTATION_LABELS.get(kind, ANNOTATION_LABELS["reply"])
    prompt = ANNOTATION_PROMPT.format(history=render_history(point.history))
    return SFTExample("annotate", _user_turn(prompt), _text(label))


def agent_example(point: DecisionPoint, ctx: DomainContext) -> SFTExample:
    """The task agent's own turn: system prompt and tools, the dialogue, its call or reply."""
    reply = {k: v for k, v in point.message.items() if k in ("role", "content", "tool_calls")}
    return SFTExample("agent", [point.system, *point.history], reply, tools=ctx.tools)


def transcript_examples(
    traj: Trajectory, ctx: DomainContext, text: TaskText
) -> list[SFTExample]:
    """Per task: the user simulator's turns (opening rewritten) and the normalized goal."""
    from prour.data.normalize import goal_prompt
    from prour.env.prompts import user_system_prompt
    from prour.env.trajectory import user_view
    from prour.env.users import flip_roles

    view = user_view(traj.messages, traj.steps)
    system = {"role": "system",
              "content": user_system_prompt(text.scenario, bool(ctx.user_tools))}
    out = []
    for j, message in enumerate(view):
        if message.get("role") == "user":
            reply = flip_roles([message])[0]
            out.append(SFTExample("user", [system, *flip_roles(view[:j])], reply,
                                  tools=ctx.user_tools or None))
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

    def add(self, items: Sequence[SFTExample]) -> None:
        for item in items:
            self.examples.setdefault(item.kind, []).append(item)

    def stats(self) -> dict[str, Any]:
        return {
            "tasks": {d: len(ids) for d, ids in self.tasks.items()},
            "task_ids": self.tasks,
            "examples": {k: len(v) for k, v in sorted(self.examples.items())},
            "build_seconds": round(self.seconds, 2),
        }


def build_corpus(
    domains: Sequence[str] = ("retail", "airline", "telecom"),
    split: str = "train",
    seed: int = 0,
    tasks_per_domain: int | None = DEFAULT_TASKS_PER_DOMAIN,
) -> Corpus:
    """The synthetic supervised corpus from oracle replays of (a seeded subset of) train tasks."""
    from prour.env.domains import get_task

    start = time.perf_counter()
    corpus = Corpus()
    for domain in domains:
        ids = corpus_task_ids(domain, split, seed, tasks_per_domain)
        corpus.tasks[domain] = ids
        texts, trajs = {}, {}
        for task_id in ids:
            task = get_task(domain, task_id)
            texts[task_id] = task_text(domain, task)
            trajs[task_id] = oracle_transcript(domain, task, texts[task_id].request)
        points = {t: decision_points(traj, get_task(domain, t)) for t, traj in trajs.items()}
        ctx = domain_context(domain, [p for ps in points.values() for p in ps])
        for task_id in ids:
            rng = random.Random(f"warmstart-corpus:{seed}:{domain}:{task_id}")
            corpus.add(transcript_examples(trajs[task_id], ctx, texts[task_id]))
            for point in points[task_id]:
                corpus.add(point_examples(point, ctx, texts[task_id], rng))
        logger.info("warm-start corpus: %s, %d tasks", domain, len(ids))
    corpus.seconds = time.perf_counter() - start
    return corpus


# ---------------------------------------------------------------- tokenization


def reply_text(tokenizer: Any, reply: Message) -> str:
    """The reply as the chat template writes an assistant turn, up to its end-of-turn token."""
    stub = [{"role": "user", "content": "."}]
    bare = tokenizer.apply_chat_template(stub, tokenize=False)
    opener = tokenizer.apply_chat_template(stub, tokenize=False, add_generation_prompt=True)
    opener = opener[len(bare):]
    text = tokenizer.apply_chat_template([*stub, reply], tokenize=False)
    return text[text.rindex(opener) + len(opener):].rstrip("\n")


def encode_example(tokenizer: Any, example: SFTExample, max_tokens: int) -> tuple[list[int], int]:
    """Token ids of prompt + reply (prompt left-truncated to fit ``max_tokens``), reply length.

    Prompt and reply are tokenized separately, as the backends do when they score a target.
    """
    prompt = tokenizer.apply_chat_template(
        example.messages,
        tools=example.tools or None,
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=example.enable_thinking,
    )
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    target = encode(reply_text(tokenizer, example.reply))[: max_tokens // 2]
    budget = max_tokens - len(target)
    # Only the prompt's tail survives truncation: tokenize a generous slice of characters.
    context = encode(prompt[-budget * 8 :])[-budget:]
    return list(context) + list(target), len(target)


Row = list[tuple[list[int], int]]
"""One packed training row: (token ids, reply length) of each example, in order."""


class RowPacker:
    """Packs examples, drawn by :data:`KIND_WEIGHTS`, into rows of up to ``row_tokens`` tokens.

    Each example keeps only its prompt's tail (``example_tokens`` with its reply), but a row holds
    several of them back to back, so every reply is written with a long stretch of earlier text in
    view, as at inference, where prompts run to thousands of tokens. Training on short sequences
    alone teaches attention that breaks down on long prompts.
    """

    def __init__(self, corpus: Corpus, tokenizer: Any, example_tokens: int, row_tokens: int,
                 seed: int):
        self.corpus, self.tokenizer = corpus, tokenizer
        self.example_tokens, self.row_tokens = example_tokens, row_tokens
        self.kinds = [k for k in KIND_WEIGHTS if corpus.examples.get(k)]
        if not self.kinds:
            raise ValueError("the warm-start corpus is empty: no task gave any example")
        self.weights = [KIND_WEIGHTS[k] for k in self.kinds]
        self.rng = random.Random(f"warmstart-rows:{seed}")
        self.encoded: dict[tuple[str, int], tuple[list[int], int]] = {}
        self.used: Counter[str] = Counter()

    def _encode(self, pick: tuple[str, int]) -> tuple[list[int], int]:
        if pick not in self.encoded:
            example = self.corpus.examples[pick[0]][pick[1]]
            self.encoded[pick] = encode_example(self.tokenizer, example, self.example_tokens)
        return self.encoded[pick]

    def row(self) -> Row:
        """Examples until the next one would not fit (at least one)."""
        items: Row = []
        size = 0
        while True:
            kind = self.rng.choices(self.kinds, weights=self.weights)[0]
            item = self._encode((kind, self.rng.randrange(len(self.corpus.examples[kind]))))
            if items and size + len(item[0]) > self.row_tokens:
                return items
            items.append(item)
            self.used[kind] += 1
            size += len(item[0])

    def batches(self, steps: int, rows_per_step: int) -> list[list[Row]]:
        return [[self.row() for _ in range(rows_per_step)] for _ in range(steps)]


# ---------------------------------------------------------------- training


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run with ``n`` torch threads (None: leave the setting alone), restored afterwards."""
    import torch

    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def batch_tensors(rows: Sequence[Row], pad_id: int) -> tuple[Any, Any]:
    """Right-padded ids [B, L] and labels [B, L] (-100 except on reply tokens).

    Padding sits after every real token, so causal attention never lets a real token see it and
    no attention mask is needed (the fast causal kernel runs).
    """
    import torch

    flat = [[t for ids, _ in row for t in ids] for row in rows]
    width = max(len(ids) for ids in flat)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, : len(flat[b])] = torch.tensor(flat[b])
        end = 0
        for seq, n_target in row:
            end += len(seq)
            labels[b, end - n_target : end] = torch.tensor(seq[len(seq) - n_target :])
    return ids, labels


def reply_loss(model: Any, ids: Any, labels: Any) -> Any:
    """Mean cross-entropy over reply tokens; the LM head runs only where a reply token is next."""
    import torch.nn.functional as F

    hidden = model.get_decoder()(input_ids=ids).last_hidden_state
    targets = labels[:, 1:]
    scored = targets != -100
    logits = model.get_output_embeddings()(hidden[:, :-1][scored])
    return F.cross_entropy(logits.float(), targets[scored])


def _lr_factor(step: int, steps: int) -> float:
    """Linear warm-up over 5% of the steps, then cosine decay to 10% of the peak."""
    import math

    warmup = max(1, steps // 20)
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def train_replies(
    model: Any, batches: Sequence[Sequence[Row]], pad_id: int, lr: float, seed: int
) -> list[float]:
    """AdamW over the planned batches (loss on reply tokens only); the loss of every step."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: _lr_factor(s, len(batches))
    )
    losses = []
    model.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for step, batch in enumerate(batches):
            loss = reply_loss(model, *batch_tensors(batch, pad_id))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
            if step % 50 == 0 or step == len(batches) - 1:
                logger.info("warm start step %d/%d: loss %.3f", step + 1, len(batches), losses[-1])
    model.eval()
    return losses


# ---------------------------------------------------------------- the warm-started folder


def prompt_fingerprint() -> str:
    """Hash of every pipeline prompt the corpus renders (on fixed inputs): new wording, new build."""
    from prour.data.normalize import goal_prompt as normalize_prompt
    from prour.env.prompts import agent_system_prompt, user_system_prompt
    from prour.rewards.belief import belief_prompt
    from prour.rollout.query import query_prompt
    from prour.rollout.strict_user import STRICT_USER_SYSTEM
    from prour.rollout.verifier import VERIFIER_SYSTEM, VERIFIER_USER
    from prour.router.annotation import ANNOTATION_PROMPT
    from prour.router.prompts import action_prompt, goal_prompt, score_prompt

    parts = [
        json.dumps(query_prompt("clarify", "H")), json.dumps(query_prompt("verify", "H")),
        goal_prompt("H"), action_prompt("H", "T", "G"), score_prompt("H", "T", "G"),
        json.dumps(belief_prompt("clarify", "H")), json.dumps(belief_prompt("verify", "H")),
        json.dumps(normalize_prompt("I")), agent_system_prompt("P"), user_system_prompt("S", True),
        STRICT_USER_SYSTEM, VERIFIER_SYSTEM, VERIFIER_USER, ANNOTATION_PROMPT,
    ]
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:16]


def _base_digest(model_dir: Path) -> str:
    """Hash of the base model's weights, config and tokenizer files."""
    digest = hashlib.sha256()
    names = ["config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]
    names += sorted(p.name for p in model_dir.glob("*.safetensors"))
    for name in names:
        path = model_dir / name
        if path.is_file():
            digest.update(name.encode() + b"\x00" + path.read_bytes())
    return digest.hexdigest()[:16]


def _read_marker(out_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((out_dir / MARKER_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def read_warmstart_info(model_dir: str | Path) -> dict[str, Any] | None:
    """What ``prour_warmstart.json`` of a warm-started folder records (None for other folders)."""
    return _read_marker(Path(model_dir))


def loss_summary(losses: Sequence[float]) -> dict[str, float]:
    """Mean loss over the first and the last tenth of the steps, and the step count."""
    if not losses:
        return {"steps": 0}
    tenth = max(1, len(losses) // 10)
    return {
        "steps": len(losses),
        "first_mean": round(sum(losses[:tenth]) / tenth, 4),
        "last_mean": round(sum(losses[-tenth:]) / tenth, 4),
        "min": round(min(losses), 4),
    }


def warm_start(
    model_dir: str | Path,
    out_dir: str | Path,
    *,
    steps: int = DEFAULT_STEPS,
    seed: int = 0,
    domains: Sequence[str] = ("retail", "airline", "telecom"),
    split: str = "train",
    tasks_per_domain: int | None = DEFAULT_TASKS_PER_DOMAIN,
    rows_per_step: int = 1,
    row_tokens: int = 2048,
    example_tokens: int = 256,
    lr: float = 1e-2,
    threads: int | None = 1,
) -> Path:
    """Fine-tune the tiny model at ``model_dir`` on the synthetic corpus; returns ``out_dir``.

    A folder already built from the same base model and arguments is returned as it is.
    """
    _check_split(split)
    if steps < 0 or rows_per_step < 1 or not 64 <= example_tokens <= row_tokens:
        raise ValueError(
            "warm start needs steps >= 0, rows_per_step >= 1 and 64 <= example_tokens <= "
            f"row_tokens; got {steps}, {rows_per_step}, {example_tokens}, {row_tokens}"
        )
    model_dir = Path(model_dir).expanduser().resolve()
    out_dir = Path(out_dir).expanduser().resolve()
    args = {
        "format_version": FORMAT_VERSION, "base": _base_digest(model_dir),
        "prompts": prompt_fingerprint(), "steps": steps, "seed": seed, "domains": list(domains),
        "split": split, "tasks_per_domain": tasks_per_domain, "rows_per_step": rows_per_step,
        "row_tokens": row_tokens, "example_tokens": example_tokens, "lr": lr, "threads": threads,
    }
    marker = _read_marker(out_dir)
    if marker is not None and marker.get("args") == args:
        return out_dir
    if out_dir.exists() and any(out_dir.iterdir()) and marker is None:
        raise FileExistsError(
            f"{out_dir} is not empty and holds no warm-started model ({MARKER_FILE} missing); "
            "pick an empty or new folder"
        )
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        _write_warm(model_dir, staging, args)
        _publish(staging, out_dir, args)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def _write_warm(model_dir: Path, folder: Path, args: dict[str, Any]) -> None:
    """Build the corpus, train, and save model, tokenizer and marker into ``folder``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    with torch_threads(args["threads"]):
        corpus = build_corpus(args["domains"], args["split"], args["seed"], args["tasks_per_domain"])
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
        packer = RowPacker(
            corpus, tokenizer, args["example_tokens"], args["row_tokens"], args["seed"]
        )
        batches = packer.batches(args["steps"], args["rows_per_step"])
        train_start = time.perf_counter()
        losses = train_replies(model, batches, tokenizer.pad_token_id, args["lr"], args["seed"])
        train_seconds = time.perf_counter() - train_start
    _save(model_dir, folder, model)
    rows = [row for batch in batches for row in batch]
    stats = {
        "corpus": corpus.stats(),
        "examples_by_kind": dict(sorted(packer.used.items())),
        "distinct_examples": len(packer.encoded),
        "rows": len(rows),
        "reply_tokens": sum(n for row in rows for _, n in row),
        "row_tokens": sum(len(ids) for row in rows for ids, _ in row),
        "loss": loss_summary(losses),
        "loss_curve": [round(x, 4) for x in losses],
        "train_seconds": round(train_seconds, 2),
        "total_seconds": round(time.perf_counter() - start, 2),
    }
    (folder / MARKER_FILE).write_text(json.dumps({"args": args, "stats": stats}, indent=1) + "\n")
    logger.info(
        "warm start: %d steps, loss %.3f -> %.3f, %.0fs (train %.0fs)", len(losses),
        stats["loss"].get("first_mean", float("nan")), stats["loss"].get("last_mean", float("nan")),
        stats["total_seconds"], train_seconds,
    )


def _save(model_dir: Path, folder: Path, model: Any) -> None:
    """Tokenizer and config files from the base folder, then the trained weights."""
    from transformers.utils import logging as hf_logging

    for path in model_dir.iterdir():
        if path.is_file() and path.suffix != ".safetensors" and path.name != TINY_MARKER_FILE:
            shutil.copy2(path, folder / path.name)
    bars_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(folder)
    finally:
        if bars_on:
            hf_logging.enable_progress_bar()


def _publish(staging: Path, out_dir: Path, args: dict[str, Any]) -> None:
    """Move the finished build into place; a concurrent builder that won the race is kept."""
    if out_dir.exists():
        marker = _read_marker(out_dir)
        if marker is not None and marker.get("args") == args:
            return
        shutil.rmtree(out_dir)
    try:
        os.rename(staging, out_dir)
    except OSError:
        marker = _read_marker(out_dir)
        if marker is None or marker.get("args") != args:
            raise


def default_warm_tiny_path(seed: int = 0, steps: int = DEFAULT_STEPS) -> Path:
    """Where the cached warm-started tiny model lives ($PROUR_CACHE or ~/.cache/prour)."""
    from prour.llm.tiny import default_tiny_path

    key = json.dumps({"base": default_tiny_path(seed).name, "seed": seed, "steps": steps})
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return default_tiny_path(seed).parent / f"tiny-warm-{digest}"


def default_warm_tiny_dir(seed: int = 0, steps: int = DEFAULT_STEPS) -> Path:
    """The shared cached warm-started tiny model (base from :func:`default_tiny_dir`), built once."""
    from prour.llm.tiny import default_tiny_dir

    return warm_start(
        default_tiny_dir(seed), default_warm_tiny_path(seed, steps), steps=steps, seed=seed
    )


def probe_points(
    domain: str,
    n_tasks: int = 3,
    seed: int = 0,
    tasks_per_domain: int | None = DEFAULT_TASKS_PER_DOMAIN,
    max_decisions: int = 3,
) -> list[DecisionPoint]:
    """Early decision states of train tasks the corpus did not use, to measure a warm start on."""
    from prour.env.domains import get_task, split_task_ids

    used = set(corpus_task_ids(domain, "train", seed, tasks_per_domain))
    unused = [t for t in split_task_ids(domain, "train") if t not in used][:n_tasks]
    points = []
    for task_id in unused:
        task = get_task(domain, task_id)
        traj = oracle_transcript(domain, task, task_text(domain, task).request)
        points += decision_points(traj, task)[:max_decisions]
    return points
