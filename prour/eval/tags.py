"""Inferred turn tags of an unrouted trajectory (an imported tau2 run, or any agent that records
no route).

prour's routed methods tag their own turns when they take them (:data:`prour.eval.agent.TURN_TAGS`:
act / clarify / confirm / verify). An episode that no router took, such as one converted by
``prour import tau2``, carries no such record, so :func:`turn_tags` infers one tag per agent turn
(:func:`prour.eval.agent.is_agent_turn`: not prior history, not the greeting) from what the turn
did, by this rule, first match wins:

1. ``write``: the turn calls at least one tool that tau2 marks ``ToolType.WRITE`` in the agent
   toolkit of the trajectory's domain (it may change the database);
2. ``lookup``: otherwise, the turn calls at least one tool tau2 marks ``ToolType.READ``;
3. ``question``: otherwise, the turn is a text message to the user that asks something: a ``?``
   ends one of its sentences (followed by a space, a closing quote or bracket, or the end);
4. ``reply``: everything else: a statement to the user, the stop token, calls only to tools that
   read and write nothing (tau2's ``GENERIC``/``THINK``: ``calculate``,
   ``transfer_to_human_agents``) or to tools the domain does not have.

These tags describe observed behaviour and are not the Act/Clarify/Verify split of the routed
methods (there a base agent's own lookup is Act): reports show them in separate columns.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from prour.env.trajectory import Trajectory

INFERRED_TAGS = ("question", "lookup", "write", "reply")
_ASKS = re.compile(r"\?(?=[\s\"'\u201d)\]]|$)")


def asks_something(text: str | None) -> bool:
    """A ``?`` ends a sentence of ``text`` (not one inside a URL's query string)."""
    return bool(_ASKS.search(text or ""))


def turn_tags(trajectory: Trajectory, types: Mapping[str, str] | None = None) -> list[str]:
    """The inferred tag (:data:`INFERRED_TAGS`) of each agent turn of ``trajectory``, in order,
    by the rule of the module docstring. ``types``: tool name → tau2 ToolType value; the agent
    toolkit of the trajectory's domain when None."""
    from prour.env.environment import tool_types
    from prour.eval.agent import is_agent_turn

    if types is None:
        types = tool_types(trajectory.domain)
    tags = []
    for step in trajectory.steps:
        if not is_agent_turn(step):
            continue
        message = trajectory.messages[step.message_index]
        called = {types.get(call.get("function", {}).get("name", ""))
                  for call in message.get("tool_calls") or []}
        if "write" in called:
            tags.append("write")
        elif "read" in called:
            tags.append("lookup")
        elif not message.get("tool_calls") and asks_something(message.get("content")):
            tags.append("question")
        else:
            tags.append("reply")
    return tags


def tag_counts(tags: list[str]) -> dict[str, int]:
    """How many turns carry each inferred tag (every tag of :data:`INFERRED_TAGS` listed)."""
    return {tag: tags.count(tag) for tag in INFERRED_TAGS}
