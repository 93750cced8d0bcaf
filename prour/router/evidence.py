"""The router's evidence (paper Table 6 and Figure 7), saved by the held-out evaluation as one
JSON file, :func:`prour.router.pipeline.router_evidence_path`, for the report to read:

- ``dev``: the stored thresholds on the dev states the search fitted on, recomputed from the
  cached AU/EU (no model call);
- ``heldout.decomposer`` and ``heldout.llm_router``: the thresholds and the prompted router on the
  held-out states;
- ``dev_mix``: the dev label mix the search used (target, used, short, ``short_mix`` policy).

Each score is ``{"states", "macro_f1", "per_class_f1", "confusion", "notes"}`` (the LLM router's
adds ``invalid``), or ``{"lacking": "<why there is no score>"}``. A class no label holds has
``null`` per-class F1 (not a measured 0) and a note that macro-F1 averages the others only.
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prour.files import write_atomic
from prour.router.routing import ROUTES

if TYPE_CHECKING:  # pragma: no cover
    from prour.router.calibration import RoutingScores
    from prour.router.pipeline import CalibrationParts, Joined
    from prour.router.thresholds import Thresholds

SCHEMA = "prour.router-evidence/1"
Scored = tuple["RoutingScores | None", "Joined"]


def scores_record(scores: RoutingScores, notes: list[str],
                  invalid: int | None = None) -> dict[str, Any]:
    """One SCORES object; the states and the classes present are read off the confusion rows
    (label x predicted route, in :data:`ROUTES` order)."""
    present = [sum(row) > 0 for row in scores.confusion]
    record: dict[str, Any] = {
        "states": int(sum(map(sum, scores.confusion))),
        "macro_f1": float(scores.macro_f1),
        "per_class_f1": {name: float(scores.per_class_f1[name]) if there else None
                         for name, there in zip(ROUTES, present)},
        "confusion": [[int(x) for x in row] for row in scores.confusion],
    }
    if invalid is not None:
        record["invalid"] = int(invalid)
    record["notes"] = notes
    return record


def _notes(recipe: Any, split: str, joined: Joined) -> list[str]:
    """What the split lacked (:meth:`Joined.lacking`) and its decisions without a candidate."""
    from prour.router.pipeline import labels_path

    notes = joined.lacking(split, labels_path(recipe, split))
    if joined.empty:
        notes.append(f"{len(joined.empty)} {split} decisions had no valid candidate action (no "
                     f"AU/EU): routed to router.empty_route ({recipe.router.empty_route})")
    return notes


def _split_scores(recipe: Any, split: str, scored: Scored | None, why: str) -> dict[str, Any]:
    if scored is None or scored[0] is None:
        return {"lacking": why}
    scores, joined = scored
    return scores_record(scores, _notes(recipe, split, joined))


def _dev(builder: CalibrationParts) -> dict[str, Any]:
    """The stored thresholds on the dev states (the cached AU/EU; no model call)."""
    from prour.router.pipeline import evaluate_split

    if not builder.recipe.router.calibration.dev_states:
        return {"lacking": "router.calibration.dev_states is not set: the thresholds were not "
                           "fitted on dev states here"}
    try:
        scores, _, joined = evaluate_split(builder, "dev")
    except ValueError as exc:
        return {"lacking": f"the dev states cannot be scored: {exc}"}
    return _split_scores(builder.recipe, "dev", (scores, joined),
                         "no dev state has a usable label")


def _llm_router(builder: CalibrationParts, heldout: Scored,
                llm: tuple[RoutingScores | None, int] | None) -> dict[str, Any]:
    if "router" not in builder.recipe.models:
        return {"lacking": "the recipe has no models.router (the prompted LLM router)"}
    if llm is None or llm[0] is None:
        return {"lacking": "no held-out state has a usable label"}
    from prour.router.pipeline import labels_path

    # the same labelled held-out states as the decomposer's: the same lacking sentences
    notes = heldout[1].lacking("test", labels_path(builder.recipe, "test"))
    return scores_record(llm[0], notes, invalid=llm[1])


def mix_record(recipe: Any) -> dict[str, Any] | None:
    """The dev mix the search used (None: no ``dev_mix`` quotas or no dev states)."""
    from prour.router.pipeline import dev_mix, labels_path

    cfg = recipe.router.calibration
    if cfg.dev_mix is None or not cfg.dev_states or not labels_path(recipe, "dev").is_file():
        return None
    mix = dev_mix(recipe)
    return {"target": dict(mix.quotas), "used": dict(mix.counts), "short": mix.short(),
            "policy": cfg.short_mix, "complete": mix.pending is None}


def router_evidence(builder: CalibrationParts, stored: Thresholds, heldout: Scored,
                    llm: tuple[RoutingScores | None, int] | None) -> dict[str, Any]:
    """The evidence record: ``heldout`` is the thresholds' held-out scores with their joined
    states, ``llm`` the prompted router's scores and invalid count (None: not run)."""
    recipe = builder.recipe
    return {
        "schema": SCHEMA,
        "decomposer_model": stored.model_id,
        "thresholds": {"tau_au": float(stored.tau_au), "tau_eu": float(stored.tau_eu)},
        "labels": list(ROUTES),
        "dev": _dev(builder),
        "heldout": {"decomposer": _split_scores(recipe, "test", heldout,
                                                "no held-out state has a usable label"),
                    "llm_router": _llm_router(builder, heldout, llm)},
        "dev_mix": mix_record(recipe),
        "written_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }


def save_evidence(recipe: Any, record: dict[str, Any]) -> Path:
    """Write the record atomically to :func:`~prour.router.pipeline.router_evidence_path`."""
    from prour.router.pipeline import router_evidence_path

    return write_atomic(router_evidence_path(recipe), json.dumps(record, indent=2) + "\n")
