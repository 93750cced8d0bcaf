"""The prompted three-way LLM router (paper A.4.5): the ablation that picks act / clarify / verify
directly from the dialogue, without goal readings or AU/EU. Its output must be strict JSON
``{"mode": ..., "rationale": ...}``; anything else falls back to a configured mode and is counted.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from prour.llm.base import LLM, ChatRequest, Message, SamplingParams
from prour.llm.history import render_history
from prour.router.candidates import answer_text
from prour.router.routing import ROUTES, check_route

if TYPE_CHECKING:  # pragma: no cover
    from prour.config.router import RouterConfig

logger = logging.getLogger(__name__)

ROUTER_PROMPT = """\
You decide the next mode of a customer-service agent that works with tools. Pick exactly one:
- act: the next step is clear; the agent should make its next ordinary tool call or give its \
final answer.
- clarify: the agent is missing something only the customer can tell, such as an intention, a \
preference, or which of several acceptable options they want.
- verify: the agent is missing evidence from the world: a read-only lookup, an earlier tool \
result, a policy rule, or a calculation, before it changes anything or gives a final answer.
Choose act whenever the next step is clear. If the missing information can be found with \
tools, in earlier tool results, in the policy or by calculation, choose verify rather than \
clarify. Choose clarify only when the open question belongs to the customer.

Tools the agent can use: {tools}

Conversation so far:
{history}

Answer with strict JSON only: \
{{"mode": "act" | "clarify" | "verify", "rationale": "<a few words>"}}"""


@dataclass(frozen=True)
class RouterDecision:
    """The mode chosen (the fallback when the reply was invalid), why, and the raw reply."""

    mode: str
    rationale: str
    valid: bool
    raw: str
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_router_reply(text: str) -> tuple[str, str] | str:
    """(mode, rationale) from a strict JSON reply, or an error string saying what is wrong."""
    try:
        obj = json.loads(answer_text(text))
    except json.JSONDecodeError as exc:
        return f"not_json: {exc}"
    if not isinstance(obj, dict) or set(obj) != {"mode", "rationale"}:
        keys = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        return f"wrong_keys: expected mode and rationale, got {keys}"
    if obj["mode"] not in ROUTES:
        return f"bad_mode: {obj['mode']!r}"
    if not isinstance(obj["rationale"], str):
        return "bad_rationale: not a string"
    return obj["mode"], obj["rationale"]


def router_sampling(cfg: RouterConfig) -> SamplingParams:
    """How the prompted router decodes: ``router.llm_router_temperature`` / ``_max_tokens``."""
    return SamplingParams(n=1, temperature=cfg.llm_router_temperature,
                          max_tokens=cfg.llm_router_max_tokens)


class LLMRouter:
    """Prompted router; ``invalid`` counts replies that fell back, by error kind. The ``router``
    section sets its decoding and the mode it falls back to (``llm_router_fallback``)."""

    def __init__(self, llm: LLM, tool_names: Sequence[str], cfg: RouterConfig):
        self.llm = llm
        self.tool_names = list(tool_names)
        self.fallback = check_route(cfg.llm_router_fallback, "router.llm_router_fallback")
        self.sampling = router_sampling(cfg)
        self.invalid: Counter[str] = Counter()
        self.decisions = 0

    def prompt(self, messages: Sequence[Message]) -> str:
        tools = ", ".join([*self.tool_names, "respond"])
        return ROUTER_PROMPT.format(tools=tools, history=render_history(messages) or "(empty)")

    def decide_many(self, histories: Sequence[Sequence[Message]]) -> list[RouterDecision]:
        """Route several dialogues with one batched chat call."""
        requests = [
            ChatRequest(
                messages=[{"role": "user", "content": self.prompt(m)}], sampling=self.sampling
            )
            for m in histories
        ]
        replies = self.llm.chat(requests) if requests else []
        return [self._decision(group[0].text if group else "") for group in replies]

    def decide(self, messages: Sequence[Message]) -> RouterDecision:
        return self.decide_many([messages])[0]

    def _decision(self, raw: str) -> RouterDecision:
        self.decisions += 1
        parsed = parse_router_reply(raw)
        if isinstance(parsed, tuple):
            return RouterDecision(mode=parsed[0], rationale=parsed[1], valid=True, raw=raw)
        self.invalid[parsed.split(":", 1)[0]] += 1
        logger.debug("LLM router reply invalid (%s); falling back to %s", parsed, self.fallback)
        return RouterDecision(mode=self.fallback, rationale="", valid=False, raw=raw, error=parsed)
