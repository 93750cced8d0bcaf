"""The warm-start examples of one decision state: the task agent's turn, the query generator's
clarify and verify prompts, the decomposer's goal, action and scoring prompts, the belief
contexts, the strict user's and the verifier's replies and the annotator's label. Every prompt
is rendered by the function the pipeline itself uses; the targets are synthetic
(:mod:`prour.demo.targets`, :mod:`prour.demo.actions`)."""

from __future__ import annotations

import random

from prour.demo import actions, targets
from prour.demo.examples import DomainContext, SFTExample, plain_reply, user_turn
from prour.demo.transcripts import DecisionPoint, TaskText


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
                plain_reply(target),
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
        SFTExample("goal", user_turn(goal_prompt(history)), plain_reply(text.goal)),
        SFTExample(
            "action",
            user_turn(action_prompt(history, tools_text, reading)),
            plain_reply(actions.as_sampled(action)),
        ),
        SFTExample(
            "score", user_turn(score_prompt(history, tools_text, text.goal)), plain_reply(scored)
        ),
    ]


def belief_examples(point: DecisionPoint, text: TaskText) -> list[SFTExample]:
    """Prior belief contexts with their reward targets (G*; the next call's canonical JSON)."""
    from prour.rewards.belief import belief_prompt

    out = [
        SFTExample(
            "belief_clarify",
            belief_prompt("clarify", point.history),
            plain_reply(text.normalized_goal),
        )
    ]
    if point.call is not None:
        out.append(
            SFTExample(
                "belief_verify",
                belief_prompt("verify", point.history),
                plain_reply(actions.next_action(point)),
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
            "strict_user",
            strict,
            plain_reply(targets.strict_user_reply(text.normalized_goal, question)),
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
        SFTExample(
            "verifier", [*opening, call, result], plain_reply(answer), tools=ctx.verifier.schemas
        ),
    ]


def annotation_example(point: DecisionPoint, ctx: DomainContext) -> SFTExample:
    """The annotator's label of a state: READ next → epistemic, WRITE → aleatoric, else none."""
    from prour.llm.history import render_history
    from prour.router.annotation import ANNOTATION_PROMPT

    call = point.call
    kind = ctx.kinds.get(call[0], "reply") if call is not None else "reply"
    label = targets.ANNOTATION_LABELS.get(kind, targets.ANNOTATION_LABELS["reply"])
    prompt = ANNOTATION_PROMPT.format(history=render_history(point.history))
    return SFTExample("annotate", user_turn(prompt), plain_reply(label))


def agent_example(point: DecisionPoint, ctx: DomainContext) -> SFTExample:
    """The task agent's own turn: system prompt and tools, the dialogue, its call or reply."""
    reply = {k: v for k, v in point.message.items() if k in ("role", "content", "tool_calls")}
    return SFTExample("agent", [point.system, *point.history], reply, tools=ctx.tools)


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
