"""Evaluation methods by name (a flat registry) and the model roles each calls; the per-episode
agents and users a method's episodes run with are built by :class:`prour.eval.kit.MethodKit`.

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

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from prour.config import ModelConfig
from prour.config.eval import EvalConfig
from prour.registry import Registry
from prour.router.routing import ROUTES

if TYPE_CHECKING:  # pragma: no cover
    from prour.config.attention import AttentionConfig


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


# ---- model roles ---------------------------------------------------------------------------


def method_roles(cfg: EvalConfig, method: str,
                 attention: AttentionConfig | None) -> tuple[str, ...]:
    """The ``models.<role>`` an evaluation arm calls: its method's roles, and under an attention
    setting the role that labels its requests (``eval.classifier``: ``judge`` or
    ``classifier``) and ``judge`` when it judges them (``eval.judge``)."""
    roles = list(check_method(method).roles)
    if attention is not None and cfg.classifier != "heuristic":
        roles.append(cfg.classifier)
    if attention is not None and cfg.judge:
        roles.append("judge")
    return tuple(dict.fromkeys(roles))


def eval_roles(cfg: EvalConfig) -> tuple[str, ...]:
    """Every role an evaluation of ``eval.methods`` under ``eval``'s attention variants calls."""
    return tuple(dict.fromkeys(role for method in cfg.methods for attention in cfg.variants()
                               for role in method_roles(cfg, method, attention)))
