"""The ``reward`` recipe section: information-gain reward and responder settings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from prour.section import Section


class AttentionRewardConfig(Section):
    """The attention-aware reward R = IG − λ·cost(question), beyond both papers (issue 16).

    It prices what a clarify question costs the user with the ask-less paper's attention cost
    (:mod:`prour.rewards.attention`); verify questions go to the verifier, not the user, and cost
    nothing. ``lambda`` 0 turns the term off (the papers' reward).
    """

    model_config = Section.model_config | {"populate_by_name": True}

    lam: float = Field(0.0, ge=0, allow_inf_nan=False, alias="lambda")  # λ; 0 = off
    # "proxy": the question's atomic asks (the ask-less `atomic` accounting, rule-counted, free);
    # "judge": the ask-less `full` cost 1 + r/20 + (1 − v/10) from the LLM judge on models.judge.
    cost: Literal["proxy", "judge"] = "proxy"
    # The judge's strict-JSON attempts per question: eval.attention.judge_attempts (one value).


class RewardConfig(Section):
    """How queries are rewarded (paper 3.3, A.3) and how the frozen responders are called.

    The responder settings also drive the verifier when ``prour eval`` runs the verify route.
    """

    invalid_penalty: float = -1.0  # reward of an output that breaks the NO / YES [QUESTION] format
    # log p(Y) from Y's token log-probs: their "sum", or their "mean" (Deng et al.'s estimator,
    # which the paper generalizes; recipes/paper.yaml sets it). Either way R = ℓ_post − ℓ_prior.
    aggregation: Literal["sum", "mean"] = "sum"
    responder_retries: int = Field(2, ge=0)  # retries after a failed responder call, then `failed`
    responder_timeout_s: float | None = Field(300.0, gt=0)  # wall-clock limit per responder call
    # responder calls in flight at once: in the local trainer a call is one state's batch of
    # questions (a step's states are answered side by side), in verl's agent loop one session's
    # question; each model's own HTTP limit (models.<role>.max_concurrency) still applies
    responder_concurrency: int = Field(16, ge=1)
    retry_backoff_s: float = Field(0.5, ge=0)  # sleep before retry k: backoff * 2**(k-1)
    prior_cache_size: int = Field(4096, ge=1)  # states whose ℓ_prior is kept (per policy version)
    verifier_max_steps: int = Field(4, ge=0)  # tool rounds of the verifier's ReAct loop
    responder_max_tokens: int = Field(256, ge=1)  # reply length of strict user and verifier turns
    responder_temperature: float = Field(0.0, ge=0)  # frozen responders decode greedily by default
    attention: AttentionRewardConfig = Field(default_factory=AttentionRewardConfig)
