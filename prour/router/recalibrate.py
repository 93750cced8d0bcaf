"""A second decomposer's own thresholds, fitted on the reviewed dev states of the run (the Prour
paper's A.2.2 and Table 7: "we repeat the same calibration procedure for GLM-4-32B"): a study
cell that routes with a decomposer of its own gets its AU/EU of the same dev states (a cache of
its own, :func:`prour.router.pipeline.decomposer_tag`) and the same grid search, stored under
its model id beside the first model's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from prour.router.pipeline import CalibrationParts


def recalibrate(builder: CalibrationParts, say: Callable[[str], None]) -> None:
    """Fit the thresholds of the decomposer of ``builder``'s recipe on the reviewed dev labels
    unless it has them (fitted on these labels) or the recipe pins its thresholds
    (router.tau_au, router.thresholds_model). The caller says whether the recipe routes with the
    decomposer; the builder stays open (its owner closes it)."""
    from prour.router.pipeline import decomposer_tag, measure_split, search_thresholds
    from prour.router.steps import thresholds_fitted
    from prour.router.thresholds import decomposer_model_id

    recipe = builder.recipe
    pinned = recipe.router.tau_au is not None or recipe.router.thresholds_model is not None
    if pinned or "decomposer" not in recipe.models:
        return
    model_id = decomposer_model_id(builder.model_config("decomposer"))
    if thresholds_fitted(recipe, model_id):
        return
    say(f"   recalibrating {model_id}: its own AU/EU on the reviewed dev states")
    measure_split(builder, "dev", tag=decomposer_tag(model_id))
    result, stored, _ = search_thresholds(builder, tag=decomposer_tag(model_id))
    say(f"   τ_AU = {stored.tau_au:.2f}, τ_EU = {stored.tau_eu:.2f} (dev macro-F1 "
        f"{result.macro_f1:.3f} on {result.n_states} states) stored for {model_id}")
