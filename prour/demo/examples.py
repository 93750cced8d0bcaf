"""One supervised example of the warm-start corpus (:mod:`prour.demo.corpus`) and the per-domain
material every example of a domain is built from: its tools, their tau2 kinds, the rendered tool
lists, the value pool of its transcripts and the two responders' prompt builders."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prour.demo import actions
from prour.llm.base import Message

if TYPE_CHECKING:  # pragma: no cover
    from prour.demo.transcripts import DecisionPoint


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


def plain_reply(content: str) -> Message:
    """An assistant reply of plain text."""
    return {"role": "assistant", "content": content}


def user_turn(prompt: str) -> list[Message]:
    """A one-message chat: the prompt as the user's turn."""
    return [{"role": "user", "content": prompt}]
