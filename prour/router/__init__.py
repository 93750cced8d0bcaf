"""Uncertainty routing: the decomposer (AU/EU), AU-first routing, calibration, the LLM router."""

from prour._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "prour.router.calibration": (
            "Calibration",
            "RoutingScores",
            "calibrate",
            "evaluate_thresholds",
        ),
        "prour.router.config": (
            "CalibrationConfig",
            "RouterConfig",
        ),
        "prour.router.decomposer": (
            "Decision",
            "Decomposer",
        ),
        "prour.router.llm_router": (
            "LLMRouter",
            "RouterDecision",
        ),
        "prour.router.routing": (
            "ROUTES",
            "DecomposerBudget",
            "route",
        ),
        "prour.router.thresholds": (
            "Thresholds",
            "ThresholdsNotFound",
            "load_thresholds",
            "save_thresholds",
        ),
        "prour.router.uncertainty": (
            "Uncertainty",
            "decompose",
            "softmax_over_candidates",
        ),
    },
)
