"""Uncertainty routing: the decomposer (AU/EU), AU-first routing, calibration, the LLM router.

Names load on first use (``from prour.router import decompose, route, calibrate``), so that
:mod:`prour.config` can import the ``router`` section (:mod:`prour.config.router`) alone.
"""

from prour.registry import lazy_exports

_EXPORTS = {
    "prour.router.calibration": ("Calibration", "RoutingScores", "calibrate", "evaluate_thresholds"),
    "prour.config.router": ("CalibrationConfig", "RouterConfig"),
    "prour.router.decomposer": ("Decision", "Decomposer"),
    "prour.router.llm_router": ("LLMRouter", "RouterDecision"),
    "prour.router.routing": ("ROUTES", "DecomposerBudget", "route"),
    "prour.router.thresholds": ("Thresholds", "ThresholdsNotFound", "load_thresholds", "save_thresholds"),
    "prour.router.uncertainty": ("Uncertainty", "decompose", "softmax_over_candidates"),
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
