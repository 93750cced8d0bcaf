"""Recipe section of the attention protocol: policy, budget, review windows, cost accounting.

A leaf: the policy table below says which options each policy takes, so a recipe is checked
when it loads; :mod:`prour.eval.attention.policies` builds the policy classes it names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from prour.registry import Registry
from prour.section import Section

DEFAULT_LAMBDA = 0.03  # λ in U = R − λ·A (ask-less paper)
EVIDENCE_WINDOW_TOKENS = 6000  # self-review: most recent dialogue shown
MEMORY_WINDOW_TOKENS = 3072  # self-review: the user's earlier answers shown


@dataclass(frozen=True)
class PolicySpec:
    """A policy: the class in :mod:`prour.eval.attention.policies` and the options it takes."""

    factory: str
    needs_llm: bool = False
    needs_budget: bool = False
    takes_budget: bool = False
    needs_threshold: bool = False
    self_review: bool = False  # takes evidence / memory windows
    reviews: bool = False  # a model call reviews each discretionary draft (VoI estimate, self-review)


_REVIEWED = {"needs_llm": True, "needs_budget": True, "takes_budget": True, "self_review": True,
             "reviews": True}
POLICIES: Registry[PolicySpec] = Registry("attention policy", {
    "no-ask": PolicySpec("NoAsk"),
    "unrestricted": PolicySpec("Unrestricted"),
    "frugal": PolicySpec("Frugal"),
    # the ask-less paper's VoI gate as its main evaluation ran it: the agent's own prompt holds the
    # threshold c and the agent decides; no review call, no veto (its Table 7 "as run" row)
    "voi-gate-as-run": PolicySpec("VoIGateAsRun", needs_threshold=True),
    "voi-gate": PolicySpec("VoIGate", needs_llm=True, takes_budget=True, needs_threshold=True,
                           reviews=True),
    "budgeted": PolicySpec("Budgeted", needs_budget=True, takes_budget=True),
    "budgeted+review": PolicySpec("ReviewedBudget", **_REVIEWED),
    "budgeted+review+summary": PolicySpec("ReviewSummary", **_REVIEWED),
    "budgeted+mgr": PolicySpec("MemoryGuidedReview", **_REVIEWED),
})


def policy_spec(name: str) -> PolicySpec:
    """The registry entry for ``name``; unknown names list the valid ones and the closest."""
    return POLICIES.get(name)


def check_policy_options(name: str, budget: int | None, threshold: float | None,
                         has_llm: bool = True) -> None:
    """Raise when ``name`` is given options it needs not, or lacks ones it needs."""
    spec = policy_spec(name)
    if spec.needs_budget and budget is None:
        raise ValueError(f"policy {name!r} needs a budget N (an integer >= 0)")
    if budget is not None and not spec.takes_budget:
        raise ValueError(f"policy {name!r} takes no budget (got {budget}); use 'budgeted'")
    if budget is not None and budget < 0:
        raise ValueError(f"budget N must be >= 0, got {budget}")
    if spec.needs_threshold and threshold is None:
        raise ValueError(f"policy {name!r} needs a threshold c in [0, 1]")
    if spec.needs_llm and not has_llm:
        raise ValueError(f"policy {name!r} reviews drafts with a model; pass llm=")


# ---- attention variants: a policy, its budget and its own options, in one label ----------------

# Options a variant label may carry in parentheses, and the AttentionConfig field each sets.
VARIANT_OPTIONS: dict[str, tuple[str, type]] = {
    "c": ("voi_threshold", float),  # the VoI threshold (voi-gate, voi-gate-as-run)
    "evidence": ("evidence_window_tokens", int),  # self-review evidence window
    "memory": ("memory_window_tokens", int),  # self-review memory window
}
_VARIANT = re.compile(r"^(?P<policy>[a-z][a-z+\-]*)(?:@(?P<budget>[^()]*))?"
                      r"(?:\((?P<options>[^()]*)\))?$")


@dataclass(frozen=True)
class Variant:
    """An attention variant: ``policy[@N][(key=value,...)]``, e.g. ``budgeted+mgr@2``,
    ``voi-gate(c=0.5)``, ``voi-gate@1(c=0.27)``, ``budgeted+review@2(evidence=9072)``.

    The options (:data:`VARIANT_OPTIONS`) set the VoI threshold ``c`` and the self-review
    windows for this variant alone; its :attr:`label` is canonical (options in table order,
    numbers as ``%g`` writes them), so two spellings of one variant share their episodes."""

    policy: str
    budget: int | None = None
    options: tuple[tuple[str, float | int], ...] = ()

    @property
    def label(self) -> str:
        text = self.policy if self.budget is None else f"{self.policy}@{self.budget}"
        if self.options:
            text += "(" + ",".join(f"{k}={v:g}" for k, v in self.options) + ")"
        return text

    def option(self, key: str) -> float | int | None:
        return dict(self.options).get(key)

    def settings(self) -> dict[str, Any]:
        """The ``eval.attention`` fields this variant sets (policy, budget and its options)."""
        out: dict[str, Any] = {"policy": self.policy, "budget": self.budget}
        for key, value in self.options:
            out[VARIANT_OPTIONS[key][0]] = value
        return out


def variant_of(text: str) -> Variant:
    """Parse a variant label; a ValueError says what is wrong with it and what is allowed."""
    match = _VARIANT.match(text.strip())
    if match is None:
        raise ValueError(f"attention variant {text!r} is not policy[@N][(key=value,...)] "
                         f"(e.g. budgeted@2, voi-gate(c=0.5))")
    policy, budget_text = match["policy"], match["budget"]
    spec = policy_spec(policy)
    budget = None
    if budget_text is not None:
        try:
            budget = int(budget_text)
        except ValueError:
            raise ValueError(f"attention variant {text!r}: the budget after '@' must be an "
                             "integer") from None
        if budget < 0:
            raise ValueError(f"attention variant {text!r}: the budget must be >= 0")
    options: dict[str, float | int] = {}
    for part in filter(None, (p.strip() for p in (match["options"] or "").split(","))):
        key, sep, raw = part.partition("=")
        key = key.strip()
        if not sep or key not in VARIANT_OPTIONS:
            raise ValueError(f"attention variant {text!r}: option {part!r} is not key=value with "
                             f"a key of {', '.join(VARIANT_OPTIONS)}")
        kind = VARIANT_OPTIONS[key][1]
        try:
            value = kind(raw.strip())
        except ValueError:
            raise ValueError(f"attention variant {text!r}: {key}={raw.strip()!r} is not "
                             f"{'a number' if kind is float else 'an integer'}") from None
        if key == "c" and not (spec.needs_threshold and 0 <= value <= 1):
            raise ValueError(f"attention variant {text!r}: c is a VoI threshold in [0, 1] of "
                             "voi-gate or voi-gate-as-run")
        if key != "c" and not (spec.self_review and value >= 1):
            raise ValueError(f"attention variant {text!r}: {key} is a self-review window (>= 1 "
                             "token) of the budgeted+review policies")
        options[key] = value
    order = list(VARIANT_OPTIONS)
    return Variant(policy, budget, tuple(sorted(options.items(), key=lambda kv: order.index(kv[0]))))


class CostWeights(Section):
    """Weights of the cost terms (see :mod:`prour.eval.attention.cost`)."""

    message: float = Field(1.0, ge=0, allow_inf_nan=False)  # per delivered request
    atomic: float = Field(1.0, ge=0, allow_inf_nan=False)  # per atomic question (``atomic``)
    effort: float = Field(1.0, ge=0, allow_inf_nan=False)  # times r/20
    avoidability: float = Field(1.0, ge=0, allow_inf_nan=False)  # times 1 − v/10


class AttentionConfig(Section):
    """One attention policy and how its conversations are scored."""

    policy: str = "unrestricted"  # a name from POLICIES above
    budget: int | None = Field(None, ge=0)  # N for budgeted policies (optional for voi-gate)
    voi_threshold: float | None = Field(None, ge=0, le=1)  # c for voi-gate
    evidence_window_tokens: int = Field(EVIDENCE_WINDOW_TOKENS, ge=1)  # self-review evidence
    memory_window_tokens: int = Field(MEMORY_WINDOW_TOKENS, ge=1)  # self-review memory
    max_redrafts: int = Field(1, ge=0)  # blocked drafts retried before the fallback message
    classifier_attempts: int = Field(3, ge=1)  # strict-JSON attempts per classification
    review_attempts: int = Field(3, ge=1)  # strict-JSON attempts per self-review / VoI call
    judge_attempts: int = Field(3, ge=1)  # strict-JSON attempts per judged request
    accounting: Literal["messages", "atomic", "effort", "full", "full+exempt"] = "full"
    lam: float = Field(DEFAULT_LAMBDA, ge=0)  # λ in U = R − λ·A
    weights: CostWeights = CostWeights()
    cache_dir: str | None = None  # JSONL caches of classifier and judge results

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        policy_spec(value)
        return value

    @model_validator(mode="after")
    def _options_fit_policy(self) -> AttentionConfig:
        check_policy_options(self.policy, self.budget, self.voi_threshold)
        return self
