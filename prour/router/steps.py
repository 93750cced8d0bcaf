"""The calibrate stage's rows of the chain: the dev and held-out decision states, the
annotator's labels, the review gate, the threshold search and the held-out evaluation; where
each reads and writes (:mod:`prour.router.pipeline`), how "done" is read, the roles each calls,
the recipe keys its outputs depend on. The thresholds file and the decomposer's keys are shared
with the stages that route (extract, eval).

Nothing heavy is imported here: what a row needs it imports inside its functions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from prour.step import RECIPE_OPTION as _R
from prour.step import File, Stage, Step, airline_file, dev_file, line_count

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe


# ---- paths the steps read and write --------------------------------------------------------------


def _states(recipe: Recipe, split: str) -> tuple[File, ...]:
    """The split's calibration states where the calibrate stage reads them (none when unset)."""
    from prour.router.pipeline import states_path

    if not getattr(recipe.router.calibration, f"{split}_states"):
        return ()
    return (File(f"router.calibration.{split}_states", states_path(recipe, split)),)


def _sampled_from(recipe: Recipe, split: str) -> tuple[File, ...]:
    """The trajectories a split's states are sampled from: the retail collection of the
    calibration reserve (dev), the airline collection (test); none when the split has no states
    file."""
    if not _states(recipe, split):
        return ()
    return (dev_file(recipe),) if split == "dev" else (airline_file(recipe),)


def _no_states(recipe: Recipe, split: str) -> str | None:
    if getattr(recipe.router.calibration, f"{split}_states"):
        return None
    return f"router.calibration.{split}_states is not set"


def _calibration(recipe: Recipe, kind: str, split: str) -> File:
    from prour.router.pipeline import cache_path, labels_path

    path = labels_path(recipe, split) if kind == "labels" else cache_path(recipe, split)
    return File(f"router.calibration.out_dir ({path.name})", path)


def _labels(recipe: Recipe, split: str) -> File:
    return _calibration(recipe, "labels", split)


def _measured(recipe: Recipe, split: str) -> File:
    return _calibration(recipe, "cache", split)


def _mix_file(recipe: Recipe) -> File:
    from prour.router.pipeline import mix_path

    return File("router.calibration.out_dir (dev_mix.json)", mix_path(recipe))


def _evidence_file(recipe: Recipe) -> File:
    from prour.router.pipeline import router_evidence_path

    return File("router.calibration.out_dir (router_evidence.json)",
                router_evidence_path(recipe))


def thresholds_file(recipe: Recipe) -> File:
    from prour.router.thresholds import thresholds_path

    return File("router.thresholds_file", thresholds_path(recipe), checked=False)


# ---- how "done" is read --------------------------------------------------------------------------


def _covers(outputs: Callable[[Recipe, str], File], splits: tuple[str, ...]) -> Callable:
    """Done when, for each split, the output has a line per calibration state."""
    def done(recipe: Recipe) -> bool:
        states = {split: _states(recipe, split) for split in splits}
        return all(files and files[0].path.exists()
                   and line_count(outputs(recipe, split).path) >= line_count(files[0].path)
                   for split, files in states.items())
    return done


def _annotated(recipe: Recipe) -> bool:
    """Every test state has a label line, and the dev labels' walk ended (its mix file is
    there and the walk needs no further label, or a review reopened it and
    ``router.calibration.short_mix: continue`` goes on short); without dev_mix, every dev state
    labelled."""
    from prour.router.pipeline import dev_mix, goes_on_short, mix_path

    if recipe.router.calibration.dev_mix is None or not _states(recipe, "dev"):
        return _covers(_labels, ("dev", "test"))(recipe)
    if _states(recipe, "test") and not _covers(_labels, ("test",))(recipe):
        return False
    try:
        mix = dev_mix(recipe)
    except ValueError:  # no candidates file yet
        return False
    return mix_path(recipe).is_file() and (mix.pending is None or goes_on_short(recipe, mix))


def _heldout_done(recipe: Recipe) -> bool:
    """A decomposer decision per held-out state, and the router evidence written."""
    return _covers(_measured, ("test",))(recipe) and _evidence_file(recipe).path.is_file()


def _thresholds_stored(recipe: Recipe) -> bool:
    """The thresholds file holds a pair for this recipe's decomposer model, fitted on the dev
    labels as they are now (a review that changed them makes the search due again; a pair
    stored without the labels' digest is taken as fitted on them)."""
    from prour.router.thresholds import decomposer_model_id

    if "decomposer" not in recipe.models:
        return False
    return thresholds_fitted(recipe, decomposer_model_id(recipe.models["decomposer"]))


def thresholds_fitted(recipe: Recipe, model_id: str) -> bool:
    """The thresholds file holds a pair for ``model_id`` fitted on the dev labels as they are
    now (:func:`_thresholds_stored` for the recipe's decomposer; a study's other decomposers)."""
    from prour.router.thresholds import labels_sha256, load_thresholds

    if not thresholds_file(recipe).path.is_file():
        return False
    try:
        stored = load_thresholds(thresholds_file(recipe).path, model_id)
    except (LookupError, ValueError):
        return False
    if stored.labels_sha256 is None or not _states(recipe, "dev"):
        return True
    return stored.labels_sha256 == labels_sha256(_labels(recipe, "dev").path)


def _approved(recipe: Recipe) -> bool:
    from prour.router.review import is_approved

    return is_approved(recipe)


# ---- roles, skips --------------------------------------------------------------------------------


def _heldout_roles(recipe: Recipe) -> tuple[str, ...]:
    """The decomposer, and the prompted router when the recipe has one (its held-out scores)."""
    return ("decomposer", *(("router",) if "router" in recipe.models else ()))


def thresholds_set(recipe: Recipe) -> str | None:
    if recipe.router.tau_au is not None:
        return "router.tau_au/tau_eu are set: nothing to calibrate"
    return None


# ---- the recipe keys each step's outputs depend on (Step.keys) -----------------------------------


# What the decomposer's AU/EU depend on (routing keys left out); extract routes with the
# thresholds too (a left-out key stays out even when listed again, so the routing keys are
# added to the base, not re-listed after a leave-out).
DECOMPOSER_OUTPUT_KEYS = ("models.decomposer", "router", "-router.thresholds_file",
                          "-router.calibration", "-router.llm_router*", "-router.budget",
                          "-router.every_n")
DECOMPOSER_KEYS = (*DECOMPOSER_OUTPUT_KEYS, "-router.tau_au", "-router.tau_eu")
_SEARCH_KEYS = (*DECOMPOSER_KEYS, "router.calibration.lo", "router.calibration.hi",
                "router.calibration.step")
_HELDOUT_KEYS = (*_SEARCH_KEYS, "models.router", "router.llm_router*")


# ---- the stage -----------------------------------------------------------------------------------


CALIBRATE = Stage("calibrate", "labelled decision states, (τ_AU, τ_EU) and their held-out score", (
    Step("states-dev", "dev candidate states from the reserve's trajectories",
         ("calibrate", "states", *_R, "--split", "dev", "--from", "{dev_path}"),
         reads=lambda r: _sampled_from(r, "dev"), writes=lambda r: _states(r, "dev"),
         skip=lambda r: _no_states(r, "dev"),
         keys=("router.calibration.dev_states", "seed", "data.on_bad_line",
               "data.max_decisions", "data.calibration_reserve", "data.reserve_seed")),
    Step("states-test", "held-out decision states from the airline trajectories",
         ("calibrate", "states", *_R, "--split", "test", "--from", "{airline_path}"),
         reads=lambda r: _sampled_from(r, "test"), writes=lambda r: _states(r, "test"),
         skip=lambda r: _no_states(r, "test"),
         keys=("router.calibration.test_states", "router.calibration.n_states", "seed",
               "data.on_bad_line")),
    Step("annotate", "the annotator's reviewable label of every state",
         ("calibrate", *_R, "--stage", "label"),
         reads=lambda r: (*_states(r, "dev"), *_states(r, "test")),
         writes=lambda r: (_labels(r, "dev"), _labels(r, "test"), _mix_file(r)),
         roles=lambda r: ("annotator",), done=_annotated,
         keys=("models.annotator", "router.calibration.annotator*",
               "router.calibration.excerpt_chars", "router.calibration.dev_mix")),
    Step("review", "review the labels by hand (fix a wrong one in its labels file)", None,
         reads=lambda r: (_labels(r, "dev"), _labels(r, "test")), by_stage=False,
         done=_approved),
    Step("search", "grid search of (τ_AU, τ_EU) on the dev states",
         ("calibrate", *_R, "--stage", "search"),
         reads=lambda r: (*_states(r, "dev"), _labels(r, "dev")),
         writes=lambda r: (_measured(r, "dev"), thresholds_file(r)),
         roles=lambda r: ("decomposer",), done=_thresholds_stored, keys=_SEARCH_KEYS),
    Step("heldout", "the thresholds (and the prompted router) on the held-out states",
         ("calibrate", *_R, "--stage", "evaluate"),
         reads=lambda r: (*_states(r, "test"), _labels(r, "test"), thresholds_file(r)),
         writes=lambda r: (_measured(r, "test"), _evidence_file(r)), roles=_heldout_roles,
         done=_heldout_done, keys=_HELDOUT_KEYS),
), placement="in_process", slurm_command=("calibrate", *_R), skip=thresholds_set)
