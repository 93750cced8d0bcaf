"""The attention protocol's components, built on the backends of a :class:`~prour.build.Builder`:
the request classifier and the attentive agent that wraps a task agent. ``eval.attention`` holds
their settings and ``eval.classifier`` picks the classifier; the query generator and the
proactive agent are built in :mod:`prour.eval.components`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from prour.build import Builder
    from prour.config.attention import AttentionConfig
    from prour.env.agents import Agent
    from prour.eval.attention.agent import AttentiveAgent
    from prour.eval.attention.classifier import RequestClassifier
    from prour.llm.strict_json import JsonCache


def request_classifier(builder: Builder, domain: str, attention: AttentionConfig,
                       cache: JsonCache | None = None) -> RequestClassifier:
    """The request classifier of ``eval.attention``: labels from the model of the role
    ``eval.classifier`` names (``judge`` or ``classifier``), else from the heuristic rules."""
    from prour.env.domains import domain_policy
    from prour.eval.attention.classifier import RequestClassifier

    role = builder.recipe.eval.classifier
    labeller = builder.llm(role) if role != "heuristic" else None
    return RequestClassifier(labeller, domain_policy(domain), attention.classifier_attempts,
                             cache=cache)


def attentive_agent(builder: Builder, agent: Agent, domain: str, attention: AttentionConfig,
                    classifier_cache: JsonCache | None = None) -> AttentiveAgent:
    """``agent`` under the attention policy of ``attention``; a policy that reviews drafts
    does so with the agent's model (``models.agent``)."""
    from prour.config.attention import policy_spec
    from prour.eval.attention.agent import AttentiveAgent
    from prour.eval.attention.policies import configured_policy

    classifier = request_classifier(builder, domain, attention, classifier_cache)
    reviewer = builder.llm("agent") if policy_spec(attention.policy).needs_llm else None
    policy = configured_policy(attention, classifier, reviewer)
    return AttentiveAgent(agent, policy, attention.max_redrafts)
