"""A scripted world in which the task agent replays each task's reference actions, so episodes
that end normally score 1, for the baselines that act on tool calls (saber, sage-agent).

The user opens by naming its task (found from the scenario it plays), so one scripted agent can
replay the right task in every episode of ``eval_world.TASKS``; it answers a confirmation
request with an explicit yes and everything else as ``eval_world.user_reply`` does.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from eval_world import OPENING, TASKS, replay_reply, user_reply

from prour.llm.scripted import ScriptedLLM

Message = dict
Reply = Callable[[list[Message]], str]
CONSENT = "Yes, please go ahead."
_TASK_TAG = re.compile(r"\(case (\w+)/(\w+)\)")


def opening(domain: str, task_id: str) -> str:
    return f"{OPENING} (case {domain}/{task_id})"


def _text(messages: list[Message]) -> str:
    return "\n".join(str(m.get("content") or "") for m in messages)


def task_of(messages: list[Message]) -> tuple[str, str]:
    """The (domain, task) the user named when opening."""
    match = _TASK_TAG.search(_text(messages))
    if match is None:
        raise ValueError("no user opening with a case tag in the prompt")
    return match.group(1), match.group(2)


def user_llm() -> ScriptedLLM:
    """Opens with its task's tag, says yes to a confirmation request, else :func:`user_reply`."""
    from prour.env.domains import get_task

    reasons = {}
    for key in TASKS:
        domain, task_id = key.split(":")
        reason = get_task(domain, task_id).user_scenario.instructions.reason_for_call
        reasons[str(reason)[:40]] = (domain, task_id)

    def reply(messages: list[Message]) -> str:
        said = messages[-1].get("content", "") if messages else ""
        if "(yes/no)" in said:
            return CONSENT
        answer = user_reply(messages)
        if answer != OPENING:
            return answer
        [case] = [case for reason, case in reasons.items() if reason in _text(messages)]
        return opening(*case)

    return ScriptedLLM(rules=[(r".", reply)])


def replay_for_task() -> Reply:
    """The replay agent (``eval_world.replay_reply``) of whichever task the user named."""
    replies: dict[tuple[str, str], Reply] = {}

    def reply(messages: list[Message]) -> str:
        case = task_of(messages)
        if case not in replies:
            replies[case] = replay_reply(*case)
        return replies[case](messages)

    return reply
