"""Every model-backed component of a recipe, built in one place: one backend per distinct model.

A :class:`Builder` owns the backends of one process. Roles whose ``models.<role>`` configs load
the same weights the same way (backend, path or served name, dtype, device, ...) share ONE
instance, so the smoke recipe's nine roles on one tiny model load it once. Components (decomposer,
verifier, strict user, task agent, user simulator, judge, prompted router) are built on top of
those shared backends, with the settings of the recipe section that owns them. Evaluation's own
components (query generator, proactive and attentive agents, request classifier) are built on a
builder by :mod:`prour.eval.components`.

Whether the roles a stage, a method or a component needs are in the recipe is decided by
:func:`missing_roles` alone; preflight, the CLI commands, evaluation and the builder itself ask it.

Counting model calls per role (evaluation) must not share counters between episodes:
:meth:`Builder.metered` returns a view that builds the same components on the same shared
backends, each seen through a per-role wrapper (e.g. a call counter) made by the caller.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prour.config import ModelConfig, Recipe

if TYPE_CHECKING:  # pragma: no cover
    from prour.env.agents import LLMAgent
    from prour.env.users import LLMUser
    from prour.llm.base import LLM
    from prour.llm.strict_json import JsonCache
    from prour.rewards.judge import RequestJudge
    from prour.rollout.strict_user import StrictUserSimulator
    from prour.rollout.verifier import Verifier
    from prour.router.decomposer import Decomposer
    from prour.router.llm_router import LLMRouter

Wrap = Callable[[str, "LLM"], "LLM"]
"""``wrap(role, shared_llm)``: how a metered view sees a role's backend (e.g. a call counter)."""


def missing_roles(available: Collection[str], needed_by: Mapping[str, Iterable[str]]) -> list[str]:
    """One line per role that a user in ``needed_by`` (a stage command, a method, a component:
    user -> the roles it calls) needs and ``available`` lacks, naming the ``models.<role>`` key and
    every user that needs it; empty when nothing is missing."""
    users: dict[str, list[str]] = {}
    for user, roles in needed_by.items():
        for role in roles:
            if role not in available and user not in users.get(role, []):
                users.setdefault(role, []).append(user)
    return [f"models.{role} is not in the recipe; {', '.join(names)} "
            f"need{'s' if len(names) == 1 else ''} it" for role, names in users.items()]


def instance_key(cfg: ModelConfig) -> str:
    """What identifies one loaded backend: its whole model config (decoding lives elsewhere)."""
    return cfg.model_dump_json()


@dataclass
class _Instances:
    """Backends of one process, shared by a builder and all its metered views."""

    given: dict[str, LLM]  # role -> instance made elsewhere (the trainer's live policy, tests)
    built: dict[str, LLM] = field(default_factory=dict)  # instance_key -> backend
    lanes: dict[int, str] = field(default_factory=dict)  # id(backend) -> its lane (eval queue)
    lock: threading.Lock = field(default_factory=threading.Lock)
    thresholds: tuple[float, float] | None = None  # (τ_AU, τ_EU), read once


class Builder:
    """Builds the components of ``recipe``; ``llms`` gives ready instances for some roles."""

    def __init__(self, recipe: Recipe, llms: dict[str, LLM] | None = None):
        self.recipe = recipe
        self._instances = _Instances(dict(llms or {}))
        self._wrap: Wrap | None = None

    def sibling(self, recipe: Recipe) -> Builder:
        """A builder of another recipe on this one's backends: equal model configs share one
        instance (a study's cells load a model once); thresholds are read from its own recipe.
        Closing the original closes them all."""
        view = Builder.__new__(Builder)
        ours = self._instances
        view.recipe, view._wrap = recipe, None
        view._instances = _Instances(dict(ours.given), ours.built, ours.lanes, ours.lock)
        return view

    def metered(self, wrap: Wrap) -> Builder:
        """A view on the same backends whose components see a role's LLM as ``wrap(role, llm)``."""
        view = Builder.__new__(Builder)
        view.recipe, view._instances, view._wrap = self.recipe, self._instances, wrap
        return view

    # ---- backends --------------------------------------------------------------------------

    def has(self, role: str) -> bool:
        """Whether ``role`` has a model (in the recipe or given)."""
        return role in self._instances.given or role in self.recipe.models

    def require(self, user: str, roles: Iterable[str]) -> None:
        """A ValueError (:func:`missing_roles`' lines) when ``user`` needs a role that has no
        model, neither in the recipe nor given."""
        lines = missing_roles({*self._instances.given, *self.recipe.models}, {user: roles})
        if lines:
            raise ValueError("; ".join(lines))

    def model_config(self, role: str) -> ModelConfig:
        """``models.<role>``, or a ValueError naming the missing key."""
        lines = missing_roles(self.recipe.models, {f"the {role} of recipe {self.recipe.name!r}":
                                                   [role]})
        if lines:
            raise ValueError(lines[0])
        return self.recipe.models[role]

    def shared_llm(self, role: str) -> LLM:
        """The one backend of a role's model (built on first use, shared by equal models)."""
        instances = self._instances
        if role in instances.given:
            return instances.given[role]
        cfg = self.model_config(role)
        key = instance_key(cfg)
        with instances.lock:
            if key not in instances.built:
                from prour.llm.registry import build_llm, lane_name

                built = build_llm(cfg, self.recipe.models_dir, f"models.{role}.path")
                instances.built[key] = built
                instances.lanes[id(built)] = lane_name(cfg)
            return instances.built[key]

    def lane_of(self, llm: LLM) -> str | None:
        """The lane (:func:`prour.llm.registry.lane_name`) of a backend this builder built;
        None for a given instance or another object."""
        return self._instances.lanes.get(id(llm))

    def llm(self, role: str) -> LLM:
        """A role's backend as this builder's components see it (wrapped in a metered view)."""
        shared = self.shared_llm(role)
        return self._wrap(role, shared) if self._wrap is not None else shared

    def backbone(self, module: str) -> LLM:
        """The agent's backend (``models.agent``) for a module of a baseline method built on the
        agent backbone; this builder's components see it as role ``module`` (calls are
        counted under that name)."""
        shared = self.shared_llm("agent")
        return self._wrap(module, shared) if self._wrap is not None else shared

    def close(self) -> None:
        """Release every backend this builder loaded (given instances belong to their owner)."""
        with self._instances.lock:
            for llm in self._instances.built.values():
                llm.close()
            self._instances.built.clear()
            self._instances.lanes.clear()

    # ---- router ----------------------------------------------------------------------------

    def thresholds_model_id(self) -> str:
        """The key of the calibrated thresholds this recipe routes with: ``router.thresholds_model``
        when set, else the decomposer's own (:meth:`decomposer_model_id`)."""
        return self.recipe.router.thresholds_model or self.decomposer_model_id()

    def decomposer_model_id(self) -> str:
        """The key calibrated thresholds are stored under (``decomposer`` for a given instance)."""
        from prour.router.thresholds import decomposer_model_id

        if "decomposer" not in self.recipe.models:
            return "decomposer"
        return decomposer_model_id(self.recipe.models["decomposer"])

    def thresholds(self) -> tuple[float, float]:
        """(τ_AU, τ_EU) of the decomposer model: explicit in the recipe, or calibrated."""
        instances = self._instances
        if instances.thresholds is None:
            from prour.router.thresholds import router_thresholds, thresholds_path

            instances.thresholds = router_thresholds(
                self.recipe.router, self.thresholds_model_id(), thresholds_path(self.recipe)
            )
        return instances.thresholds

    def decomposer(self, domain: str, need_thresholds: bool = True) -> Decomposer:
        """The uncertainty decomposer on ``models.decomposer`` for a domain's tools; without
        ``need_thresholds`` (calibration) it measures AU/EU but routes nothing."""
        from prour.env.environment import tool_schemas
        from prour.router.decomposer import Decomposer

        thresholds = self.thresholds() if need_thresholds else None
        return Decomposer(self.llm("decomposer"), tool_schemas(domain), self.recipe.router,
                          thresholds=thresholds)

    def llm_router(self, domain: str) -> LLMRouter:
        """The prompted router ablation on ``models.router``, decoding as ``router`` says."""
        from prour.env.environment import tool_schemas
        from prour.router.llm_router import LLMRouter

        names = [schema["function"]["name"] for schema in tool_schemas(domain)]
        return LLMRouter(self.llm("router"), names, self.recipe.router)

    # ---- responders (``reward`` decoding, in training and in evaluation alike) ----------------

    def verifier(self, domain: str, module: str | None = None) -> Verifier:
        """The read-only ReAct verifier for a domain: on ``models.verifier``, or, for a
        baseline's own ``module``, on the agent backbone (:meth:`backbone`)."""
        from prour.rollout.verifier import Verifier

        llm = self.llm("verifier") if module is None else self.backbone(module)
        return Verifier(llm, domain, self.recipe.reward)

    def strict_user(self) -> StrictUserSimulator:
        """The strict user simulator on ``models.strict_user`` (the training responder)."""
        from prour.rollout.strict_user import StrictUserSimulator

        return StrictUserSimulator(self.llm("strict_user"), self.recipe.reward)

    # ---- episodes (``env`` decoding, in collection and in evaluation alike) -------------------

    def task_agent(self) -> LLMAgent:
        """The tool-calling task agent on ``models.agent``."""
        from prour.env.agents import LLMAgent

        return LLMAgent(self.llm("agent"), self.recipe.env)

    def user_simulator(self) -> LLMUser:
        """The user simulator on ``models.user``."""
        from prour.env.users import LLMUser

        return LLMUser(self.llm("user"), self.recipe.env)

    def judge(self, attempts: int, cache: JsonCache | None = None) -> RequestJudge:
        """The attention-cost judge on ``models.judge``."""
        from prour.rewards.judge import RequestJudge

        return RequestJudge(self.llm("judge"), attempts, cache=cache)

    def judge_attempts(self) -> int:
        """The judge's strict-JSON attempts per request: ``eval.attention.judge_attempts``, that
        section's own value when the recipe sets no ``eval.attention`` (paper-attention's training
        prices questions with the judge without evaluating under the attention protocol)."""
        from prour.config.attention import AttentionConfig

        return (self.recipe.eval.attention or AttentionConfig()).judge_attempts


def recipe_reward(recipe: Recipe) -> Callable[[LLM], Callable]:
    """The recipe's information-gain reward for the local trainer, around the belief scorer it is
    given (the trainer's live policy, or its sampler); a builder on the recipe makes the
    responders. What ``prour train`` hands :class:`prour.train.local.LocalTrainer`."""

    def build(policy_llm: LLM) -> Callable:
        from prour.train.reward import info_gain_reward

        return info_gain_reward(Builder(recipe, {"generator": policy_llm}))

    return build
