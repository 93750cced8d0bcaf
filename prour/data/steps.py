"""The data stages' rows of the chain: collect (retail, the calibration reserve's dev
episodes, airline), normalize, extract (and the ig-clarifier baseline's rows), and the
uncertainty taxonomy of the collected trajectories with its review gate; where each reads and
writes, how "done" is read, the roles each calls, the recipe keys its outputs depend on.

Nothing heavy is imported here: what a row needs it imports inside its functions.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from prour.router.steps import DECOMPOSER_OUTPUT_KEYS, thresholds_file, thresholds_set
from prour.step import RECIPE_OPTION as _R
from prour.step import (
    Approval,
    File,
    Stage,
    Step,
    airline_file,
    data_file,
    dev_file,
    ig_sets,
    line_count,
    no_ig,
    of_ig,
)

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe


# ---- paths the steps read and write --------------------------------------------------------------


def _dataset(recipe: Recipe) -> tuple[File, ...]:
    folder = Path(recipe.data.dataset_dir)
    return (File("data.dataset_dir", folder / "train.parquet"),
            File("data.dataset_dir", folder / "validation.parquet"))


# ---- how "done" is read --------------------------------------------------------------------------


def _collected(recipe: Recipe) -> bool:
    return _collection_done(data_file(recipe, "trajectories").path, recipe.data.num_trajectories,
                            recipe)


def _airline_collected(recipe: Recipe) -> bool:
    return _collection_done(airline_file(recipe).path, recipe.router.calibration.test_episodes,
                            recipe)


def _dev_collected(recipe: Recipe) -> bool:
    return _collection_done(dev_file(recipe).path,
                            recipe.router.calibration.dev_episodes, recipe)


def _collection_done(path: Path, wanted: int, recipe: Recipe) -> bool:
    """What ``prour collect`` exits 0 on: ``wanted`` episodes stored, at most
    ``data.max_error_fraction`` of them errored (a failed collection reruns its errored ones)."""
    from prour.data.collect import stored_episodes

    episodes, errored = stored_episodes(path)
    return episodes >= wanted and errored <= recipe.data.max_error_fraction * episodes


def _normalized(recipe: Recipe) -> bool:
    """A goal line for every task of the data split (normalize skips the tasks it has)."""
    from prour.data.reserve import data_tasks

    return line_count(data_file(recipe, "goals").path) >= len(data_tasks(recipe.data))


# ---- roles, weights, skips -----------------------------------------------------------------------


def _collect_roles(recipe: Recipe) -> tuple[str, ...]:
    return ("agent", "user", *(("teacher",) if recipe.data.teacher else ()))


def _extract_tokenizer(recipe: Recipe) -> tuple[str, ...]:
    return () if recipe.data.tokenizer else ("generator",)


def _routed_extract(recipe: Recipe) -> bool:
    """Whether extract routes with the decomposer (``data.states: routed``); ``every`` (the
    ig-clarifier's rows) calls no model and reads no threshold."""
    return recipe.data.states == "routed"


def _extract_roles(recipe: Recipe) -> tuple[str, ...]:
    return ("decomposer",) if _routed_extract(recipe) else ()


def _extract_reads(recipe: Recipe) -> tuple[File, ...]:
    thresholds = (thresholds_file(recipe),) if _routed_extract(recipe) else ()
    return (data_file(recipe, "trajectories"), data_file(recipe, "goals"), *thresholds)


def _tokenizer_weights(recipe: Recipe) -> tuple[tuple[str, str], ...]:
    return ((recipe.data.tokenizer, "data.tokenizer"),) if recipe.data.tokenizer else ()


def _no_calibration(recipe: Recipe) -> str | None:
    """The airline collection only feeds the held-out calibration states."""
    why = thresholds_set(recipe) or (None if recipe.router.calibration.test_states
                                     else "router.calibration.test_states is not set")
    return f"{why} (the airline episodes feed only calibration)" if why else None


def _no_dev_calibration(recipe: Recipe) -> str | None:
    """The reserve's retail collection only feeds the dev calibration states."""
    why = thresholds_set(recipe) or (None if recipe.router.calibration.dev_states
                                     else "router.calibration.dev_states is not set")
    return f"{why} (the reserve's episodes feed only calibration)" if why else None


# ---- the recipe keys each step's outputs depend on (Step.keys) -----------------------------------


# A change of one of them makes the step stale, and with it every later step that reads what it
# wrote. Keys that change how fast, not what, a step writes (concurrency, logging) are left out.
_EPISODES = ("models.agent", "models.user", "models.teacher", "env", "data.teacher*",
             "data.trial_seeds", "data.max_tasks")
_COLLECT_KEYS = (*_EPISODES, "data.domain", "data.split", "data.num_trajectories",
                 "data.calibration_reserve", "data.reserve_seed", "data.tasks")
_AIRLINE_KEYS = (*_EPISODES, "router.calibration.test_episodes")
_DEV_COLLECT_KEYS = (*_EPISODES, "data.domain", "data.split", "data.calibration_reserve",
                     "data.reserve_seed", "router.calibration.dev_episodes")
_NORMALIZE_KEYS = ("models.normalizer", "data.domain", "data.split", "data.max_tasks",
                   "data.calibration_reserve", "data.reserve_seed", "data.tasks",
                   "data.normalizer*")
_DATASET_KEYS = ("data", "-data.concurrency", "-data.teacher*", "-data.normalizer*",
                 "data.tokenizer", "models.generator", "seed")
_EXTRACT_KEYS = (*DECOMPOSER_OUTPUT_KEYS, *_DATASET_KEYS)  # router.tau_au/tau_eu included
_IG_EXTRACT_KEYS = ("-data.decisions", *_DATASET_KEYS)  # no router key: its rows ignore the router


# ---- the stages ----------------------------------------------------------------------------------


COLLECT = Stage("collect", "task agent + teacher + user episodes on tau2", (
    Step("collect-retail", "training trajectories (data.domain, data.split)",
         ("collect", *_R), writes=lambda r: (data_file(r, "trajectories"),),
         roles=_collect_roles, done=_collected, keys=_COLLECT_KEYS),
    Step("collect-dev", "retail trajectories of the calibration reserve for the dev states",
         ("collect", *_R, "--set", "data.tasks=reserve",
          "--set", "data.trajectories={dev_trajectories}",
          "--set", "data.num_trajectories={dev_episodes}"),
         writes=lambda r: (dev_file(r),), roles=_collect_roles,
         done=_dev_collected, keys=_DEV_COLLECT_KEYS, skip=_no_dev_calibration),
    Step("collect-airline", "airline trajectories for the held-out calibration states",
         ("collect", *_R, "--set", "data.domain=airline", "--set", "data.split=train",
          "--set", "data.calibration_reserve=0", "--set", "protocol.on_breach=warn",
          "--set", "data.trajectories={airline_trajectories}",
          "--set", "data.num_trajectories={airline_episodes}"),
         writes=lambda r: (airline_file(r),), roles=_collect_roles, done=_airline_collected,
         keys=_AIRLINE_KEYS, skip=_no_calibration),
), placement="in_process", slurm_command=("collect", *_R, "--no-progress"))


NORMALIZE = Stage("normalize", "each task's instruction as the first-person goal G*", (
    Step("normalize", "goals (G*) of the data split's tasks", ("normalize", *_R),
         writes=lambda r: (data_file(r, "goals"),), roles=lambda r: ("normalizer",),
         done=_normalized, keys=_NORMALIZE_KEYS),
), placement="in_process", slurm_command=("normalize", *_R))


EXTRACT = Stage("extract", "route every state; clarify/verify states as train/validation parquet", (
    Step("extract", "train/validation parquet and the dataset card", ("extract", *_R),
         reads=_extract_reads, writes=_dataset, roles=_extract_roles,
         tokenizers=_extract_tokenizer, keys=_EXTRACT_KEYS),
    # The IG-Clarifier baseline's own rows (prour.config.ig_clarifier): every decision state of
    # the same trajectories, target G*, no decomposer: no router key makes it stale.
    Step("extract-ig-clarifier", "the ig-clarifier baseline's rows: every decision state, "
         "target G*", ("extract", *_R, *ig_sets()), reads=of_ig(_extract_reads),
         writes=of_ig(_dataset), tokenizers=of_ig(_extract_tokenizer), keys=_IG_EXTRACT_KEYS,
         skip=no_ig),
), placement="in_process", slurm_command=("extract", *_R, "--no-progress"),
    weights=_tokenizer_weights, routes=_routed_extract)


# ---- the uncertainty taxonomy (paper A.1: Table 5, Figure 2) -------------------------------------


def taxonomy_sources(recipe: Recipe) -> tuple[File, ...]:
    """The trajectories the taxonomy annotates: the retail training collection, and the airline
    collection when the chain collects it (the taxonomy's own check reads that one: a command
    run before it annotates the retail steps and says what it lacks)."""
    airline = () if _no_calibration(recipe) else (replace(airline_file(recipe), checked=False),)
    return (data_file(recipe, "trajectories"), *airline)


def _taxonomy_folder(recipe: Recipe) -> Path:
    from prour.data.taxonomy_labels import taxonomy_dir

    return taxonomy_dir(recipe)


def taxonomy_labels(recipe: Recipe) -> tuple[File, ...]:
    """The taxonomy's labels file (what its review gate and the report read)."""
    from prour.data.taxonomy_labels import labels_path

    return (File("taxonomy (run_dir/taxonomy)", labels_path(_taxonomy_folder(recipe))),)


def _taxonomy_done(recipe: Recipe) -> bool:
    from prour.data.taxonomy import annotated

    return annotated(recipe, taxonomy_sources(recipe))


def _taxonomy_approved(recipe: Recipe) -> bool:
    from prour.data.taxonomy_labels import is_approved

    return is_approved(_taxonomy_folder(recipe))


def no_taxonomy(recipe: Recipe) -> str | None:
    return None if recipe.taxonomy.run else "taxonomy.run is false (recipes/paper.yaml turns it on)"


def _approve_taxonomy(recipe: Recipe, by: str) -> str:
    from prour.data.taxonomy_labels import APPROVAL_FILE, approve, describe

    counts = approve(_taxonomy_folder(recipe), by)
    return f"{describe(counts)} -> {_taxonomy_folder(recipe) / APPROVAL_FILE}"


def _taxonomy_waiting(recipe: Recipe) -> list[str]:
    """The labels file with its counts; where a line without a usable label says why."""
    from prour.data.taxonomy_labels import count_labels, describe, read_labels

    path = taxonomy_labels(recipe)[0].path
    if not path.is_file():
        return [f"{path}: missing"]
    try:
        counts = count_labels(read_labels(path))
    except ValueError as exc:
        return [f"{exc}"]
    lines = [f"{path}: {describe(counts)}"]
    if counts.unusable:
        lines.append(f"{counts.unusable} line(s) without a usable label: the annotator's replies "
                     "never validated (`annotation` null; its `errors` and `raw` say why)")
    return lines


def _taxonomy_unattended(recipe: Recipe) -> str | None:
    return "taxonomy.approve_labels" if recipe.taxonomy.approve_labels else None


_TAXONOMY_KEYS = ("models.annotator", "taxonomy", "-taxonomy.run", "-taxonomy.approve_labels",
                  "data.on_bad_line")
_TAXONOMY_REVIEW = Approval(
    _approve_taxonomy, _taxonomy_waiting, _taxonomy_unattended,
    correct="a source (profile, tools, policy, computation, history, intent, preference) or none")


TAXONOMY = Stage("taxonomy", "where the missing information lives: every decision step labelled", (
    Step("taxonomy", "the annotator's uncertainty label of every decision step of the retail and "
         "airline trajectories", ("taxonomy", *_R), reads=taxonomy_sources,
         writes=taxonomy_labels, roles=lambda r: ("annotator",), done=_taxonomy_done,
         keys=_TAXONOMY_KEYS),
    Step("taxonomy-review", "review the taxonomy labels by hand (fix a wrong one in its labels "
         "file)", None, reads=taxonomy_labels, by_stage=False, done=_taxonomy_approved,
         approval=_TAXONOMY_REVIEW),
), placement="in_process", slurm_command=("taxonomy", *_R), skip=no_taxonomy)
