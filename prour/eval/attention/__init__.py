"""Attention protocol (ask-less paper): who may interrupt the user, how often, and at what cost.

Every agent message to the user is classified (:mod:`classifier`); discretionary requests spend
an interruption budget (:mod:`budget`) under a named policy (:mod:`policies`, self-review in
:mod:`mgr`); delivered requests are scored by an LLM judge (:mod:`prour.rewards.judge`, which
the training reward shares) and priced (:mod:`cost`). :mod:`agent` runs the protocol in an
episode (its ``AttentiveAgent`` wraps the task agent and is imported from there, not
re-exported: it depends on the eval agents);
:mod:`components` builds the classifier and the attentive agent from a recipe's builder;
:mod:`analysis` builds tables, equal-cost comparisons and plots.

Names load on first use (``from prour.eval.attention import conversation_cost``), so that the
``eval.attention`` recipe section (:mod:`prour.config.attention`) loads alone.
"""

from prour.registry import lazy_exports

_EXPORTS = {
    "prour.eval.attention.budget": ("FALLBACK_MESSAGE", "AttentionGate", "BudgetExceeded", "ConversationState",
               "DeliveredRequest", "GateAction", "GateDecision", "GateOutcome",
               "InterruptionBudget"),
    "prour.eval.attention.classifier": ("LABELS", "RequestClass", "RequestClassifier", "count_atomic_questions",
                   "heuristic_classify"),
    "prour.config.attention": ("POLICIES", "CostWeights"),
    "prour.eval.attention.cost": ("ACCOUNTINGS", "asking_efficiency", "conversation_cost", "judged_value", "utility"),
    "prour.rewards.judge": ("Judgment", "RequestJudge", "reading_effort_from_ratings"),
    "prour.eval.attention.mgr": ("SelfReviewer",),
    "prour.eval.attention.policies": ("AttentionPolicy", "build_policy"),
    "prour.llm.strict_json": ("JsonCache",),
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
