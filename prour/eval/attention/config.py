"""Recipe section of the attention protocol: policy, budget, review windows, cost accounting."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from prour.section import Section
from prour.eval.attention.classifier import RequestClassifier
from prour.eval.attention.cost import DEFAULT_LAMBDA, CostWeights
from prour.eval.attention.mgr import EVIDENCE_WINDOW_TOKENS, MEMORY_WINDOW_TOKENS
from prour.eval.attention.policies import (
    AttentionPolicy,
    build_policy,
    check_policy_options,
    policy_spec,
)
from prour.llm.base import LLM


class CostWeightsConfig(Section):
    """Weights of the cost terms (see :mod:`prour.eval.attention.cost`)."""

    message: float = Field(1.0, ge=0)  # per delivered request
    atomic: float = Field(1.0, ge=0)  # per atomic question (``atomic`` accounting)
    effort: float = Field(1.0, ge=0)  # times r/20
    avoidability: float = Field(1.0, ge=0)  # times 1 − v/10


class AttentionConfig(Section):
    """One attention policy and how its conversations are scored."""

    policy: str = "unrestricted"  # a name from prour.eval.attention.POLICIES
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
    weights: CostWeightsConfig = CostWeightsConfig()
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

    def cost_weights(self) -> CostWeights:
        w = self.weights
        return CostWeights(w.message, w.atomic, w.effort, w.avoidability)

    def build(self, classifier: RequestClassifier, llm: LLM | None = None) -> AttentionPolicy:
        """The configured policy; ``llm`` is the backbone used for reviews (VoI, self-review)."""
        spec = policy_spec(self.policy)
        options: dict[str, int] = {}
        if spec.needs_llm:
            options["max_attempts"] = self.review_attempts
        if spec.self_review:
            options["evidence_tokens"] = self.evidence_window_tokens
            options["memory_tokens"] = self.memory_window_tokens
        return build_policy(self.policy, classifier, llm, self.budget, self.voi_threshold,
                            **options)
