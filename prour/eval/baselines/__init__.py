"""The paper's baselines (Table 1), re-implemented as evaluation methods on prour's agent backbone.

One module per baseline. Each module's docstring names its source (paper and public code, if
any), says what it does here and what prour simplified; each defines ``build(context) -> Agent``.

How a baseline plugs in:

1. a module ``prour/eval/baselines/<name>.py`` with ``build(context: BaselineContext) -> Agent``;
2. one line in :data:`prour.eval.methods.METHODS`:
   ``"name": _baseline("name", "summary", "<module>", *extra_roles, writer=...)`` (agent and
   user are implied; ``writer`` names the role whose model writes its questions: ``agent``, the
   backbone, for a baseline that writes them with the query generator's prompts
   (:meth:`BaselineContext.new_generator`), or a role of its own such as ``ig_clarifier``;
   never ``generator``, which ``prour eval --checkpoint`` sets to prour's trained generator);
3. its agent tags every step it returns: ``meta["turn"]`` is one of
   :data:`prour.eval.agent.TURN_TAGS` (``clarify`` a question to the user, ``confirm`` a request
   for consent before a mutating action, ``act`` the task agent's step), ``meta["verify"]`` (a
   dict without ``failed: true``) marks a step that added verification evidence, and
   ``meta["decision"]`` records what the baseline decided (``{"router": name, "route": ...}``).
   The harness writes the tags to ``results.jsonl`` (``turns``, ``steps``) and the report counts
   them, with the model calls of each role.

Modules of a baseline that run on the agent backbone get it from :meth:`BaselineContext.backbone`
under their own role name (``clarification_predictor``, ``meta_verifier``…), so their calls are
counted apart from the task agent's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prour.env.agents import AgentTurn
from prour.llm.base import Message
from prour.registry import load_target

if TYPE_CHECKING:  # pragma: no cover
    from prour.build import Builder
    from prour.env.agents import Agent
    from prour.eval.agent import QueryGenerator
    from prour.llm.base import LLM, SamplingParams
    from prour.llm.strict_json import JsonOutcome
    from prour.rollout.verifier import Verifier
    from prour.router.routing import DecomposerBudget


QUESTION_WRITER = "question_writer"
"""The role name the backbone's question-writing calls are counted under."""


@dataclass
class BaselineContext:
    """What a baseline's ``build`` gets for one episode: the domain, the task agent and the
    episode's metered builder (every model call counted by role), which builds its parts."""

    domain: str
    task_agent: Agent
    episode: Builder

    def backbone(self, module: str) -> LLM:
        """``models.agent``'s backend for one of the baseline's own modules (counted as
        ``module``)."""
        return self.episode.backbone(module)

    def new_generator(self, role: str = "agent") -> QueryGenerator:
        """A question writer with the query generator's prompts and decoding on ``role``'s
        model: ``agent`` (the backbone, counted as ``question_writer``; the default, so that no
        baseline writes with ``models.generator``, which ``--checkpoint`` sets to prour's
        trained generator) or a baseline's own role (``ig_clarifier``)."""
        llm = self.episode.backbone(QUESTION_WRITER) if role == "agent" else self.episode.llm(role)
        from prour.eval.components import query_generator

        return query_generator(self.episode, llm)

    def budget(self) -> DecomposerBudget:
        """A fresh per-episode budget of ``router.budget`` / ``router.every_n``."""
        from prour.router.routing import episode_budget

        return episode_budget(self.episode.recipe.router)

    def decision_sampling(self) -> SamplingParams:
        """How the baseline's decision modules on the backbone decode: as the prompted router
        (``router.llm_router_temperature``, ``router.llm_router_max_tokens``)."""
        from prour.router.llm_router import router_sampling

        return router_sampling(self.episode.recipe.router)

    def verifier(self, module: str) -> Verifier:
        """The read-only ReAct verifier on the agent backbone (counted as ``module``), built as
        the other verifiers (:meth:`prour.build.Builder.verifier`)."""
        return self.episode.verifier(self.domain, module)


def build_baseline(module: str, context: BaselineContext) -> Agent:
    """The agent of the baseline in ``prour.eval.baselines.<module>`` for one episode (its
    ``build``); the method registry names the module, and this package never imports it."""
    return load_target(f"{__name__}.{module}:build")(context)


def tagged(turn: AgentTurn, tag: str, **meta: Any) -> AgentTurn:
    """``turn`` with its turn tag and the baseline's records added to the step meta."""
    turn.meta = {**turn.meta, **meta, "turn": tag}
    return turn


def write_tools(domain: str) -> set[str]:
    """Tools tau2 marks ``write`` in ``domain`` (they change the database: mutating actions)."""
    from prour.env.environment import tool_types

    return {name for name, kind in tool_types(domain).items() if kind == "write"}


def history_mutated(domain: str, messages: list[Message]) -> bool:
    """Whether the agent already called a write tool in ``messages``."""
    writes = write_tools(domain)
    return any((call.get("function") or call).get("name") in writes
               for m in messages if m.get("role") == "assistant"
               for call in m.get("tool_calls") or [])


def ask_strict_json(llm: LLM, prompt: str, validate: Callable[[dict[str, Any]], Any],
                    sampling: SamplingParams) -> JsonOutcome[Any]:
    """One strict-JSON answer to ``prompt`` (one attempt: an invalid reply is the caller's
    fallback, recorded, never retried)."""
    from prour.llm.strict_json import ask_json

    return ask_json(llm, [[{"role": "user", "content": prompt}]], validate, max_attempts=1,
                    sampling=sampling)[0]


def text_fields(data: dict[str, Any], names: tuple[str, ...]) -> dict[str, str]:
    """The stripped text of optional string fields of a strict-JSON reply (absent: empty);
    ValueError naming a field that is not a string."""
    out = {}
    for name in names:
        value = data.get(name, "")
        if not isinstance(value, str):
            raise ValueError(  # noqa: TRY004 - ask_json rejects a reply on ValueError
                f"{name} must be a string, got {type(value).__name__}")
        out[name] = value.strip()
    return out
