"""Evaluation's own components, built on the backends of a :class:`~prour.build.Builder`: the
query generator and prour's proactive agent (the attention protocol's request classifier and
attentive agent: :mod:`prour.eval.attention.components`). The builder gives the shared backends
and the parts other stages use too (decomposer, prompted router, verifier); the settings come
from the recipe section that owns each component (the generator decodes as in training).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from prour.build import Builder
    from prour.config import Recipe
    from prour.config.router import RouterConfig
    from prour.config.train import RolloutSettings
    from prour.env.agents import Agent
    from prour.eval.agent import ProactiveAgent, QueryGenerator
    from prour.llm.base import LLM


def generator_rollout(recipe: Recipe) -> RolloutSettings:
    """The query generator's training decoding (``train.rollout``; its defaults without
    ``train``), which evaluation keeps except for ``eval.generator_temperature``."""
    from prour.config.train import RolloutSettings

    return recipe.train.rollout if recipe.train is not None else RolloutSettings()


def query_generator(builder: Builder, llm: LLM | None = None) -> QueryGenerator:
    """The query generator on ``models.generator`` (an evaluation's clarify/verify writer),
    or the same prompts and decoding on ``llm`` (a baseline's own question writer)."""
    from prour.eval.agent import QueryGenerator

    rollout = generator_rollout(builder.recipe)
    temperature = builder.recipe.eval.generator_temperature
    return QueryGenerator(llm if llm is not None else builder.llm("generator"),
                          temperature=rollout.temperature if temperature is None
                          else temperature,
                          max_tokens=rollout.max_response_tokens,
                          enable_thinking=rollout.enable_thinking)


def proactive_agent(builder: Builder, task_agent: Agent, domain: str, routes: tuple[str, ...],
                    router: str, budget: RouterConfig | None = None) -> ProactiveAgent:
    """``task_agent`` with prour's proactive module: ``router`` ``decomposer`` (AU/EU on
    ``models.decomposer``) or ``llm`` (the prompted router), the query generator, and the
    verifier when ``routes`` has ``verify``; a fresh ``router.budget`` per episode (of
    ``budget``'s budget and every_n when given: an eval.sweep point)."""
    from prour.eval.agent import DecomposerRouter, ProactiveAgent, PromptedRouter
    from prour.router.routing import episode_budget

    chooser = PromptedRouter(builder.llm_router(domain)) if router == "llm" \
        else DecomposerRouter(builder.decomposer(domain))
    verifier = builder.verifier(domain) if "verify" in routes else None
    return ProactiveAgent(task_agent, chooser, query_generator(builder), verifier, routes,
                          lambda: episode_budget(budget or builder.recipe.router))

