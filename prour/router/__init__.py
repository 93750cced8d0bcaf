"""Uncertainty routing: the decomposer (AU/EU), AU-first routing, calibration, the LLM router."""

from prour.router.calibration import Calibration, RoutingScores, calibrate, evaluate_thresholds
from prour.router.config import CalibrationConfig, RouterConfig
from prour.router.decomposer import Decision, Decomposer, build_decomposer
from prour.router.llm_router import LLMRouter, RouterDecision
from prour.router.routing import ROUTES, DecomposerBudget, route
from prour.router.thresholds import Thresholds, ThresholdsNotFound, load_thresholds, save_thresholds
from prour.router.uncertainty import Uncertainty, decompose, softmax_over_candidates

__all__ = [
    "ROUTES",
    "Calibration",
    "CalibrationConfig",
    "Decision",
    "Decomposer",
    "DecomposerBudget",
    "LLMRouter",
    "RouterConfig",
    "RouterDecision",
    "RoutingScores",
    "Thresholds",
    "ThresholdsNotFound",
    "Uncertainty",
    "build_decomposer",
    "calibrate",
    "decompose",
    "evaluate_thresholds",
    "load_thresholds",
    "route",
    "save_thresholds",
    "softmax_over_candidates",
]
