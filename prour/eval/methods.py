"""Evaluation methods by name (a flat registry) and the per-episode agents and users they build.

======================  ===========================================================================
``base``                the task agent alone (no proactive module)
``prour``               AU/EU decomposer routes act / clarify / verify; generator; verifier
``clarify-only``        as ``prour`` with the verify branch disabled (verify routes act)
``verify-only``         as ``prour`` with the clarify branch disabled (clarify routes act)
``llm-router``          a prompted router picks the mode instead of the decomposer
``oracle``              replays the reference actions with the oracle user (a harness check)
``ig-clarifier``        baseline: the clarifier itself decides at every step whether to ask
``ask-before-plan``     baseline: a clarification-need predictor, then a question, before acting
``verifiagent``         baseline: meta- and tool-based verification of each drafted step
``saber``               baseline: user confirmation before tau2 WRITE calls, reflection, cleaning
``sage-agent``          baseline: asks the highest-EVPI question about its candidate calls' params
======================  ===========================================================================

Baselines (:mod:`prour.eval.baselines`, one module each) run on the recipe's agent backbone
(``models.agent``; their own modules are counted under their own role names). None writes its
questions with ``models.generator``, prour's query generator (``prour eval --checkpoint`` sets
it to prour's trained checkpoint): ``ask-before-plan`` writes them on the backbone (the paper:
the baselines "are all reimplemented on the Qwen3-8B backbone"), ``ig-clarifier`` with its own
trained clarifier, ``models.ig_clarifier`` (the chain trains it: ``train-ig-clarifier``), and
``saber`` and ``sage-agent`` word their confirmations and questions from templates.
:attr:`MethodSpec.writer` names the role whose model writes a method's questions; every result
line records that model (``question_writer``) and the report names it per method.

The query generator is whatever ``models.generator`` names (any backend: a prompted model, a
served checkpoint) or a training checkpoint given with ``--checkpoint`` (:mod:`prour.eval.arms`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from prour.config import ModelConfig
from prour.config.eval import EvalConfig
from prour.eval.components import attentive_agent, generator_rollout, proactive_agent
from prour.registry import Registry
from prour.router.routing import ROUTES

if TYPE_CHECKING:  # pragma: no cover
    from prour.build import Builder
    from prour.config.attention import AttentionConfig
    from prour.config.router import RouterConfig
    from prour.env.agents import Agent
    from prour.env.users import UserSimulator
    from prour.eval.agent import CallCounts
    from prour.llm.strict_json import JsonCache


@dataclass(frozen=True)
class MethodSpec:
    """A method: the model roles it needs, its routes and router (none: no proactive module)."""

    name: str
    summary: str
    roles: tuple[str, ...]
    routes: tuple[str, ...] = ()
    router: str | None = None  # "decomposer" or "llm"
    oracle: bool = False
    baseline: str | None = None  # module of prour.eval.baselines whose build() makes the agent
    writer: str | None = None  # the role whose model writes its questions (None: no model does)

    @property
    def proactive(self) -> bool:
        return bool(self.routes)


def _baseline(name: str, summary: str, module: str, *roles: str,
              writer: str | None = None) -> MethodSpec:
    """A baseline on the agent backbone (agent, user and the roles it adds); ``writer``: the
    role whose model writes its questions."""
    return MethodSpec(name, summary, tuple(dict.fromkeys(("agent", "user", *roles))),
                      baseline=module, writer=writer)


_PROACTIVE = ("agent", "user", "generator")
_G = "generator"
METHODS: Registry[MethodSpec] = Registry("method", {
    "base": MethodSpec("base", "task agent alone", ("agent", "user")),
    "prour": MethodSpec("prour", "decomposer routing, generator, verifier",
                        (*_PROACTIVE, "decomposer", "verifier"), ROUTES, "decomposer", writer=_G),
    "clarify-only": MethodSpec("clarify-only", "prour without the verify branch",
                               (*_PROACTIVE, "decomposer"), ("act", "clarify"), "decomposer",
                               writer=_G),
    "verify-only": MethodSpec("verify-only", "prour without the clarify branch",
                              (*_PROACTIVE, "decomposer", "verifier"), ("act", "verify"),
                              "decomposer", writer=_G),
    "llm-router": MethodSpec("llm-router", "prompted router instead of the decomposer",
                             (*_PROACTIVE, "router", "verifier"), ROUTES, "llm", writer=_G),
    "oracle": MethodSpec("oracle", "reference-action replay (harness check)", (), oracle=True),
    "ig-clarifier": _baseline("ig-clarifier", "its trained clarifier decides to ask at every step",
                              "ig_clarifier", "ig_clarifier", writer="ig_clarifier"),
    "ask-before-plan": _baseline("ask-before-plan", "clarification-need predictor, then a question",
                                 "ask_before_plan", writer="agent"),
    "verifiagent": _baseline("verifiagent", "meta- and tool-based verification of each step",
                             "verifiagent"),
    "saber": _baseline("saber", "confirmation before mutating calls, reflection", "saber"),
    "sage-agent": _baseline("sage-agent", "EVPI question over call parameters", "sage_agent"),
})


IG_STEP_HINT = ("the train-ig-clarifier and export-ig-clarifier steps, or `prour train --recipe "
                "recipes/ig-clarifier.yaml` and `prour train export` with it")


def question_writer(method: str, models: Mapping[str, ModelConfig]) -> str | None:
    """The model that writes ``method``'s questions: the local folder (``path``, resolved) or the
    served model id of its writer role in ``models`` (None: the method writes none, or the
    role has no model)."""
    role = check_method(method).writer
    cfg = models.get(role) if role is not None else None
    if cfg is None:
        return None
    if cfg.backend == "hf" and cfg.path:
        folder = Path(cfg.path)
        return str(folder.resolve()) if folder.exists() else cfg.path
    return cfg.model or cfg.path or cfg.script or cfg.backend


def check_method(name: str) -> MethodSpec:
    """The registry entry of ``name``; unknown names list the valid ones."""
    return METHODS.get(name)


# ---- per-episode builders ------------------------------------------------------------------


def method_roles(cfg: EvalConfig, method: str,
                 attention: AttentionConfig | None) -> tuple[str, ...]:
    """The ``models.<role>`` an evaluation arm calls: its method's roles, and ``judge`` under an
    attention setting whose requests ``models.judge`` labels (``eval.classifier: judge``) or
    judges (``eval.judge``)."""
    roles = list(check_method(method).roles)
    if attention is not None and (cfg.classifier == "judge" or cfg.judge):
        roles.append("judge")
    return tuple(dict.fromkeys(roles))


def eval_roles(cfg: EvalConfig) -> tuple[str, ...]:
    """Every role an evaluation of ``eval.methods`` under ``eval``'s attention variants calls."""
    return tuple(dict.fromkeys(role for method in cfg.methods for attention in cfg.variants()
                               for role in method_roles(cfg, method, attention)))


def attention_caches(folder: Path) -> dict[str, JsonCache]:
    """The verdict caches of the request classifier and the judge, kept in ``folder`` and
    shared by every episode of a kit (:class:`MethodKit`'s ``caches``)."""
    from prour.llm.strict_json import JsonCache

    return {"classifier": JsonCache(folder / "classifier_cache.jsonl"),
            "judge": JsonCache(folder / "judge_cache.jsonl")}


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
        from prour.config.attention import policy_spec

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
        if attention is not None and policy_spec(attention.policy).needs_llm and spec.oracle:
            raise ValueError(f"attention policy {attention.policy!r} reviews drafts with the "
                             "agent's model; the oracle has none")
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
