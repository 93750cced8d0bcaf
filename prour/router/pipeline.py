"""The ``prour calibrate`` stages: label decision states, measure their AU/EU with the decomposer,
grid-search the thresholds on the development set, evaluate them on the held-out set.

Files under ``router.calibration.out_dir`` (default ``<run_dir>/calibration``):
``labels_{dev,test}.jsonl`` (reviewable, see :mod:`prour.router.annotation`),
``uncertainty_{dev,test}.jsonl`` (one decomposer decision per state; resumable cache),
``dev_mix.json`` (the dev labels kept per route, :mod:`prour.router.dev_mix`) and, unless
``router.thresholds_file`` names another place, ``thresholds.json``.

The dev states file holds candidates; the dev states the search uses are those the quota walk
keeps (``router.calibration.dev_mix``); the test states are all used.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from prour.config import Recipe
from prour.env.trajectory import read_jsonl
from prour.files import append_jsonl, repair_torn_tail, write_atomic
from prour.router.annotation import DecisionState, annotate, read_labels, read_states
from prour.router.calibration import Calibration, RoutingScores, calibrate, score_routes
from prour.router.dev_mix import Mix, fill_quotas, mix_path, read_mix, remaining
from prour.router.routing import ROUTES, route_many
from prour.router.thresholds import (
    calibration_dir,
    decomposer_model_id,
    labels_sha256,
    load_thresholds,
    save_thresholds,
    thresholds_path,
)

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import ModelConfig
    from prour.llm.base import LLM
    from prour.router.decomposer import Decomposer
    from prour.router.llm_router import LLMRouter
    from prour.router.thresholds import Thresholds

logger = logging.getLogger(__name__)

SPLITS = ("dev", "test")


class CalibrationParts(Protocol):
    """What the calibrate stages ask of the builder of the recipe's components, which the
    ``prour calibrate`` command makes and hands down."""

    recipe: Recipe

    def llm(self, role: str) -> LLM: ...

    def model_config(self, role: str) -> ModelConfig: ...

    def decomposer(self, domain: str, need_thresholds: bool = True) -> Decomposer: ...

    def llm_router(self, domain: str) -> LLMRouter: ...


def _model_id(builder: CalibrationParts) -> str:
    """The decomposer's threshold key (``models.decomposer`` must be set)."""
    return decomposer_model_id(builder.model_config("decomposer"))


def states_path(recipe: Recipe, split: str) -> Path:
    """``router.calibration.<split>_states`` (a JSONL of decision states), or a ValueError."""
    path = getattr(recipe.router.calibration, f"{split}_states")
    if not path:
        raise ValueError(
            f"router.calibration.{split}_states is not set (a JSONL of decision states)"
        )
    return Path(path)


def labels_path(recipe: Recipe, split: str) -> Path:
    """The split's reviewable labels."""
    return calibration_dir(recipe) / f"labels_{split}.jsonl"


def cache_path(recipe: Recipe, split: str, tag: str | None = None) -> Path:
    """The split's decomposer decisions (resumable cache); ``tag`` names another decomposer's
    (a study recalibrating its own: :func:`decomposer_tag`)."""
    return calibration_dir(recipe) / f"uncertainty_{split}{'.' + tag if tag else ''}.jsonl"


def decomposer_tag(model_id: str) -> str:
    """A file-name-safe tag of a decomposer model id (``openai:THUDM/GLM-4-32B-0414`` ->
    ``openai_THUDM_GLM-4-32B-0414``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", model_id)


def state_seed(recipe_seed: int, state_id: str) -> int:
    """A decision seed that depends only on the recipe seed and the state (order-free resume)."""
    return zlib.crc32(f"{recipe_seed}:{state_id}".encode())


EVIDENCE_NAME = "router_evidence.json"


def router_evidence_path(recipe: Recipe) -> Path:
    """Where the held-out evaluation saves the router's evidence (the paper's Table 6 and
    Figure 7: per-class and macro F1 of the calibrated decomposer on the dev and held-out
    states, and of the prompted LLM router on the held-out ones)."""
    return calibration_dir(recipe) / EVIDENCE_NAME


def _labels_or_none(path: Path) -> dict[str, str | None]:
    """state id -> route, None for an annotated state with no usable label."""
    if not path.is_file():
        return {}
    unusable: list[str] = []
    labels: dict[str, str | None] = dict(read_labels(path, unusable))
    labels.update(dict.fromkeys(unusable))
    return labels


def dev_mix(recipe: Recipe) -> Mix | None:
    """The quota walk over the dev candidates and their current labels (None: no dev_mix)."""
    quotas = recipe.router.calibration.dev_mix
    if quotas is None:
        return None
    order = [s.state_id for s in read_states(states_path(recipe, "dev"))]
    return fill_quotas(order, _labels_or_none(labels_path(recipe, "dev")), quotas.quotas())


def reopened(recipe: Recipe, mix: Mix | None) -> bool:
    """Whether a dev walk that had ended (the annotate step stored its mix) waits for a further
    candidate's label again: a review's correction moved a kept state out of its quota."""
    return mix is not None and mix.pending is not None and mix_path(recipe).is_file()


def goes_on_short(recipe: Recipe, mix: Mix | None) -> bool:
    """A reopened walk that ``router.calibration.short_mix: continue`` leaves short: the search
    fits on the states it kept before the first unlabelled candidate."""
    return reopened(recipe, mix) and recipe.router.calibration.short_mix == "continue"


def store_mix(recipe: Recipe, mix: Mix, after_review: int | None = None) -> dict[str, Any]:
    """Write the mix record: the walk, the ``short_mix`` policy, how many dev candidates carry a
    label line, and how many of them were labelled because a review reopened the walk
    (``after_review``; None keeps the stored count)."""
    if after_review is None:
        after_review = int(read_mix(recipe).get("labelled_after_review", 0))
    record = {**mix.to_dict(), "policy": recipe.router.calibration.short_mix,
              "labelled": len(_labels_or_none(labels_path(recipe, "dev"))),
              "labelled_after_review": after_review}
    write_atomic(mix_path(recipe), json.dumps(record, indent=2) + "\n")
    return record


def split_states(recipe: Recipe, split: str) -> list[DecisionState]:
    """The states a split's search or evaluation uses: every test state; the dev candidates the
    quota walk keeps (a walk that needs more labels is an error naming the command, unless
    ``short_mix: continue`` goes on with a walk a review reopened)."""
    states = read_states(states_path(recipe, split))
    mix = dev_mix(recipe) if split == "dev" else None
    if mix is None:
        return states
    if mix.pending is not None and not goes_on_short(recipe, mix):
        from prour.recipes import prour_command

        if not labels_path(recipe, split).is_file():
            raise ValueError(f"labels file not found: {labels_path(recipe, split)}; run "
                             f"`{prour_command(recipe, 'calibrate', '--stage', 'label')}` first")
        raise ValueError(
            f"the dev labels ({labels_path(recipe, split)}) stop at candidate {mix.pending + 1} "
            f"with quotas still open ({mix.line()}); run "
            f"`{prour_command(recipe, 'calibrate', '--stage', 'label')}` first")
    kept = set(mix.kept)
    return [s for s in states if s.state_id in kept]


def label_split(builder: CalibrationParts, split: str, chunk_size: int = 64) -> list[dict[str, Any]]:
    """Annotate the split's states not yet labelled; returns the new records. Dev with
    ``dev_mix``: candidates in order, a chunk at a time, until every quota is met or they run
    out; the mix reached is written to :func:`mix_path`."""
    recipe = builder.recipe
    states = read_states(states_path(recipe, split))
    cfg, out = recipe.router.calibration, labels_path(recipe, split)
    repair_torn_tail(out, "its state is labelled again")  # before the mix reads the labels
    if split != "dev" or cfg.dev_mix is None:
        return annotate(builder.llm("annotator"), states, cfg, out_path=out)
    before = dev_mix(recipe)
    after_review = reopened(recipe, before) and not goes_on_short(recipe, before)
    new: list[dict[str, Any]] = []
    while (mix := dev_mix(recipe)).pending is not None and not goes_on_short(recipe, mix):
        done = _labels_or_none(out)
        todo = [s for s in states[mix.pending:] if s.state_id not in done]
        chunk = todo[: max(1, min(chunk_size, remaining(mix)))]
        new += annotate(builder.llm("annotator"), chunk, cfg, out_path=out)
    store_mix(recipe, mix, _labelled_since(recipe, len(new)) if after_review else 0)
    return new


def _labelled_since(recipe: Recipe, new: int) -> int:
    """Dev candidates labelled since the stored walk ended (a top-up that was interrupted and
    resumed counts whole); ``new``: those labelled by this call, for a record without a count."""
    stored = read_mix(recipe).get("labelled")
    if stored is None:
        return new
    return len(_labels_or_none(labels_path(recipe, "dev"))) - int(stored)


def read_cache(path: Path) -> dict[str, dict[str, Any]]:
    """state id -> cached decision (a line torn by a crash is skipped, so that state reruns)."""
    if not path.is_file():
        return {}
    return {str(obj["state_id"]): obj for obj in read_jsonl(path, on_error="skip")}


def measure_split(
    builder: CalibrationParts, split: str, progress: Callable[[Iterable], Iterable] = iter,
    tag: str | None = None,
) -> int:
    """Run the decomposer on every uncached state of the split, appending each result; count.

    The decomposer measures AU/EU only (no thresholds yet); one per domain (tools differ).
    ``tag``: the cache of a decomposer other than the calibration's own (:func:`cache_path`)."""
    recipe, model_id = builder.recipe, _model_id(builder)
    states = split_states(recipe, split)
    cache = cache_path(recipe, split, tag)
    done = set(read_cache(cache))
    todo = [s for s in states if s.state_id not in done]
    decomposer_for = functools.cache(
        lambda domain: builder.decomposer(domain, need_thresholds=False)
    )
    for state in progress(todo):
        decision = decomposer_for(state.domain or recipe.data.domain).decide(
            state.messages, seed=state_seed(recipe.seed, state.state_id)
        )
        record = {"state_id": state.state_id, "model_id": model_id, **decision.to_dict()}
        append_jsonl(cache, record)
    return len(todo)


@dataclass
class Joined:
    """Labelled states with their AU/EU, plus states whose decision had no candidate and states
    left out for want of a usable label."""

    state_ids: list[str]
    au: list[float]
    eu: list[float]
    labels: list[str]
    empty: list[tuple[str, str]]  # (state id, label) of decisions without AU/EU
    unlabelled: list[str] = field(default_factory=list)  # no usable label: left out

    def lacking(self, split: str, path: Path) -> list[str]:
        """What this split lacked, one sentence each (nothing: an empty list)."""
        lines = []
        if self.unlabelled:
            lines.append(f"{len(self.unlabelled)} {split} states have no usable label and were "
                         f"left out (set `corrected` in {path}), e.g. {self.unlabelled[:3]}")
        classes = set(self.labels) | {label for _, label in self.empty}
        absent = [name for name in ROUTES if name not in classes]
        if absent and len(absent) < len(ROUTES):
            lines.append(f"the {split} labels hold no {', '.join(absent)} state: macro-F1 "
                         f"averages {', '.join(n for n in ROUTES if n in classes)} only")
        return lines


def join_split(recipe: Recipe, split: str, tag: str | None = None) -> Joined:
    """Match labels to cached AU/EU by state id (``tag``: another decomposer's cache); a missing
    one is an error naming the files; a state whose label is unusable is left out
    (:attr:`Joined.unlabelled`)."""
    from prour.recipes import prour_command

    unusable: list[str] = []
    if not labels_path(recipe, split).is_file():
        raise ValueError(f"labels file not found: {labels_path(recipe, split)}; run "
                         f"`{prour_command(recipe, 'calibrate', '--stage', 'label')}` first")
    labels = read_labels(labels_path(recipe, split), unusable)
    cache = read_cache(cache_path(recipe, split, tag))
    states = [s.state_id for s in split_states(recipe, split)]
    skipped = set(unusable)
    missing = [s for s in states if s not in skipped and (s not in labels or s not in cache)]
    if missing:
        raise ValueError(
            f"{len(missing)} {split} states lack a label ({labels_path(recipe, split)}) or AU/EU "
            f"({cache_path(recipe, split, tag)}), e.g. {missing[:3]}; run "
            f"`{prour_command(recipe, 'calibrate', '--stage', 'label')}` first"
        )
    joined = Joined([], [], [], [], [], [s for s in states if s in skipped])
    mix = dev_mix(recipe) if split == "dev" else None
    if mix is not None:  # candidates the quota walk met without a usable label
        joined.unlabelled = list(mix.unusable)
    for state_id in states:
        if state_id in skipped:
            continue
        record = cache[state_id]
        if record.get("au") is None:
            joined.empty.append((state_id, labels[state_id]))
            continue
        joined.state_ids.append(state_id)
        joined.au.append(float(record["au"]))
        joined.eu.append(float(record["eu"]))
        joined.labels.append(labels[state_id])
    return joined


def search_thresholds(builder: CalibrationParts,
                      tag: str | None = None) -> tuple[Calibration, Thresholds, Joined]:
    """Grid-search (τ_AU, τ_EU) on the dev split and store them under the decomposer's model id,
    with the digest of the dev labels read; the dev mix record is rewritten as the walk the
    search used. ``tag``: another decomposer's AU/EU cache on the same labels (its own
    thresholds, the Prour paper's Table 7).

    States whose decision had no valid candidate have no AU/EU and are left out of the search.
    """
    recipe = builder.recipe
    joined = join_split(recipe, "dev", tag)
    if joined.empty:
        logger.warning(
            "%d dev states had no valid candidate; left out of the search", len(joined.empty)
        )
    cfg = recipe.router.calibration
    if joined.labels:
        result = calibrate(joined.au, joined.eu, joined.labels, cfg)
    else:  # every pair ties on nothing: the tie rule's pick, the grid's first pair
        result = unfitted(cfg)
    stored = save_thresholds(
        thresholds_path(recipe), _model_id(builder), result, dataset=str(states_path(recipe, "dev")),
        labels_sha256=labels_sha256(labels_path(recipe, "dev")),
    )
    mix = dev_mix(recipe)
    if mix is not None:  # the walk as the search read it (a review may have changed it)
        store_mix(recipe, mix)
    return result, stored, joined


def unfitted(cfg: Any) -> Calibration:
    """The search's result when no dev state has both a label and AU/EU: every threshold pair
    ties (on nothing), so the tie rule picks the grid's first pair; macro-F1 0 over 0 states."""
    return Calibration(tau_au=float(cfg.lo), tau_eu=float(cfg.lo), macro_f1=0.0,
                       per_class_f1=dict.fromkeys(ROUTES, 0.0), confusion=[[0] * 3] * 3,
                       n_states=0, grid=(float(cfg.lo), float(cfg.hi), float(cfg.step)),
                       n_ties=0)


def evaluate_split(
    builder: CalibrationParts, split: str = "test"
) -> tuple[RoutingScores | None, Thresholds, Joined]:
    """Score the stored thresholds on a split; empty decisions take ``router.empty_route``.
    No state with a usable label: no scores (None)."""
    recipe = builder.recipe
    stored = load_thresholds(thresholds_path(recipe), _model_id(builder))
    joined = join_split(recipe, split)
    routed = list(route_many(joined.au, joined.eu, stored.tau_au, stored.tau_eu))
    predicted = routed + [recipe.router.empty_route] * len(joined.empty)
    labels = joined.labels + [label for _, label in joined.empty]
    return (score_routes(predicted, labels) if labels else None), stored, joined


def evaluate_llm_router(
    builder: CalibrationParts, split: str = "test"
) -> tuple[RoutingScores | None, int]:
    """The prompted LLM router (ablation) on the same labelled states (None: none has a usable
    label); also its invalid count."""
    recipe = builder.recipe
    labels = read_labels(labels_path(recipe, split), [])  # unusable labels: left out
    states = split_states(recipe, split)
    predicted: dict[str, str] = {}
    invalid = 0
    for domain in sorted({s.domain or recipe.data.domain for s in states}):
        group = [s for s in states if (s.domain or recipe.data.domain) == domain]
        router = builder.llm_router(domain)
        for state, decision in zip(group, router.decide_many([s.messages for s in group])):
            predicted[state.state_id] = decision.mode
        invalid += sum(router.invalid.values())
    ids = [s.state_id for s in states if s.state_id in labels]
    if not ids:
        return None, invalid
    return score_routes([predicted[i] for i in ids], [labels[i] for i in ids]), invalid
