"""Attention protocol (ask-less paper): who may interrupt the user, how often, and at what cost.

Every agent message to the user is classified (:mod:`classifier`); discretionary requests spend
an interruption budget (:mod:`budget`) under a named policy (:mod:`policies`, self-review in
:mod:`mgr`); delivered requests are scored by an LLM judge (:mod:`judge`) and priced
(:mod:`cost`). :mod:`agent` runs the protocol in an episode (its ``AttentiveAgent`` wraps the
task agent and is imported from there, not re-exported: it depends on the eval agents);
:mod:`analysis` builds tables, equal-cost comparisons and plots.
"""

from prour.eval.attention.budget import (
    FALLBACK_MESSAGE,
    AttentionGate,
    BudgetExceeded,
    ConversationState,
    DeliveredRequest,
    GateAction,
    GateDecision,
    GateOutcome,
    InterruptionBudget,
)
from prour.eval.attention.classifier import (
    LABELS,
    RequestClass,
    RequestClassifier,
    count_atomic_questions,
    heuristic_classify,
)
from prour.eval.attention.cost import (
    ACCOUNTINGS,
    CostWeights,
    asking_efficiency,
    conversation_cost,
    judged_value,
    utility,
)
from prour.eval.attention.judge import Judgment, RequestJudge, reading_effort_from_ratings
from prour.eval.attention.mgr import SelfReviewer
from prour.eval.attention.policies import POLICIES, AttentionPolicy, build_policy
from prour.eval.attention.strict_json import JsonCache

__all__ = [
    "ACCOUNTINGS", "FALLBACK_MESSAGE", "LABELS", "POLICIES",
    "AttentionGate", "AttentionPolicy", "BudgetExceeded", "ConversationState", "CostWeights",
    "DeliveredRequest", "GateAction", "GateDecision", "GateOutcome", "InterruptionBudget",
    "JsonCache", "Judgment", "RequestClass", "RequestClassifier", "RequestJudge", "SelfReviewer",
    "asking_efficiency", "build_policy", "conversation_cost", "count_atomic_questions",
    "heuristic_classify", "judged_value", "reading_effort_from_ratings", "utility",
]
