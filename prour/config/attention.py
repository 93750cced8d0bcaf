"""Recipe section of the attention protocol: policy, budget, review windows, cost accounting.

A leaf: the policy table below says which options each policy takes, so a recipe is checked
when it loads; :mod:`prour.eval.attention.policies` builds the policy classes it names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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


_REVIEWED = {"needs_llm": True, "needs_budget": True, "takes_budget": True, "self_review": True}
POLICIES: Registry[PolicySpec] = Registry("attention policy", {
    "no-ask": PolicySpec("NoAsk"),
    "unrestricted": PolicySpec("Unrestricted"),
    "frugal": PolicySpec("Frugal"),
    "voi-gate": PolicySpec("VoIGate", needs_llm=True, takes_budget=True, needs_threshold=True),
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
