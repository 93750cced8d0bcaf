"""The per-episode kit of an evaluation: for each method of :mod:`prour.eval.methods`, a fresh
agent and user every episode, built on one :class:`~prour.build.Builder` whose model calls are
counted by role, and the verdict caches of the attention protocol that its episodes share.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from prour.config.eval import EvalConfig
from prour.eval.attention.components import attentive_agent
from prour.eval.components import generator_rollout, proactive_agent
from prour.eval.methods import MethodSpec, check_method, method_roles

if TYPE_CHECKING:  # pragma: no cover
    from prour.build import Builder
    from prour.config.attention import AttentionConfig
    from prour.config.router import RouterConfig
    from prour.env.agents import Agent
    from prour.env.users import UserSimulator
    from prour.eval.agent import CallCounts
    from prour.llm.strict_json import JsonCache


IG_STEP_HINT = ("the train-ig-clarifier and export-ig-clarifier steps, or `prour train --recipe "
                "recipes/ig-clarifier.yaml` and `prour train export` with it")


def attention_caches(folder: Path) -> dict[str, JsonCache]:
    """The verdict caches of the request classifier and the judge, kept in ``folder`` and
    shared by every episode of a kit (:class:`MethodKit`'s ``caches``)."""
    from prour.llm.strict_json import JsonCache

    return {"classifier": JsonCache(folder / "classifier_cache.jsonl"),
            "judge": JsonCache(folder / "judge_cache.jsonl")}


def attention_problem(method: str, attention: AttentionConfig | None) -> str | None:
    """Why ``method`` cannot run under ``attention`` (None: it can): a policy that reviews
    drafts with the agent's model, on the oracle, which has none. :meth:`MethodKit.check` raises
    it before any episode; ``prour validate`` names it before eval starts
    (:mod:`prour.recipe_checks`)."""
    from prour.config.attention import policy_spec

    if attention is not None and policy_spec(attention.policy).needs_llm and \
            check_method(method).oracle:
        return (f"attention policy {attention.policy!r} reviews drafts with the agent's model; "
                "the oracle has none")
    return None


class MethodKit:
    """The factories that make a fresh agent and user for every episode of a method, each built
    by a metered view of one :class:`~prour.build.Builder` (roles on equal models share one
    backend; every model call of an episode is counted by role)."""

    def __init__(self, builder: Builder, caches: dict[str, JsonCache] | None = None):
        self.builder = builder
        self.cfg: EvalConfig = builder.recipe.eval
        self.rollout = generator_rollout(builder.recipe)
        self.caches = caches or {}

    def close(self) -> None:
        self.builder.close()

    def check(self, method: str, attention: AttentionConfig | None) -> None:
        """Raise before any episode when a method lacks a model role or thresholds."""
        spec = check_method(method)
        roles = method_roles(self.cfg, method, attention)
        try:
            self.builder.require(f"method {method!r}", roles)
        except ValueError as exc:
            if "generator" in roles and not self.builder.has("generator"):
                raise ValueError(f"{exc} (or give --checkpoint for the generator)") from None
            if "ig_clarifier" in roles and not self.builder.has("ig_clarifier"):
                raise ValueError(f"{exc}: the IG-Clarifier baseline writes with its own trained "
                                 f"clarifier; set --set models.ig_clarifier.path=<its exported "
                                 f"checkpoint> (`prour run` trains it: {IG_STEP_HINT})") from None
            raise
        problem = attention_problem(method, attention)
        if problem:
            raise ValueError(problem)
        if spec.router == "decomposer":
            self.builder.thresholds()

    # -- agents and users --

    def _episode(self, counts: CallCounts, seed: int | None = None) -> Builder:
        """The builder as one episode sees it: every model call counted in ``counts``; with
        ``seed``, unseeded sampled requests seeded from it (:class:`~prour.eval.agent.CountingLLM`);
        each call holds its model's lane in the evaluation queue."""
        from prour.eval.agent import CountingLLM

        lane = self.builder.lane_of
        return self.builder.metered(
            lambda role, llm: CountingLLM(llm, counts, role, seed, lane=lane(llm)))

    def agent_factory(self, method: str, domain: str, attention: AttentionConfig | None,
                      router: RouterConfig | None = None,
                      seed: int | None = None) -> Callable[[], Agent]:
        """A zero-argument builder of a fresh, metered agent for one episode; ``router``: the
        budget and frequency settings of its episodes (None: the recipe's ``router``);
        ``seed``: the episode's seed, which seeds its requests that bring none."""
        spec = check_method(method)

        def build() -> Agent:
            from prour.eval.agent import CallCounts, MeteredAgent

            counts = CallCounts()
            episode = self._episode(counts, seed)
            agent = self._core_agent(spec, domain, episode, router)
            if attention is not None:
                agent = attentive_agent(episode, agent, domain, attention,
                                        self.caches.get("classifier"))
            return MeteredAgent(agent, counts, name=method)

        return build

    def user_factory(self, method: str, seed: int | None = None) -> Callable[[], UserSimulator]:
        spec = check_method(method)

        def build() -> UserSimulator:
            from prour.env.users import OracleUser
            from prour.eval.agent import CallCounts, MeteredUser

            if spec.oracle:
                return OracleUser()
            counts = CallCounts()
            return MeteredUser(self._episode(counts, seed).user_simulator(), counts)

        return build

    @staticmethod
    def _core_agent(spec: MethodSpec, domain: str, episode: Builder,
                    router: RouterConfig | None = None) -> Agent:
        from prour.env.agents import OracleAgent

        if spec.oracle:
            return OracleAgent()
        task_agent = episode.task_agent()
        if spec.baseline is not None:
            from prour.eval.baselines import BaselineContext, build_baseline

            return build_baseline(spec.baseline, BaselineContext(domain, task_agent, episode))
        if not spec.proactive:
            return task_agent
        return proactive_agent(episode, task_agent, domain, spec.routes, spec.router or "",
                               budget=router)
