"""The ``prour calibrate`` stages: label decision states, measure their AU/EU with the decomposer,
grid-search the thresholds on the development set, evaluate them on the held-out set.

Files under ``router.calibration.out_dir`` (default ``<run_dir>/calibration``):
``labels_{dev,test}.jsonl`` (reviewable, see :mod:`prour.router.annotation`),
``uncertainty_{dev,test}.jsonl`` (one decomposer decision per state; resumable cache) and, unless
``router.thresholds_file`` names another place, ``thresholds.json``.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prour.config import Recipe
from prour.env.trajectory import append_jsonl, read_jsonl
from prour.llm.base import LLM
from prour.router.annotation import annotate, read_labels, read_states
from prour.router.calibration import Calibration, RoutingScores, calibrate, score_routes
from prour.router.config import RouterConfig
from prour.router.decomposer import Decomposer
from prour.router.routing import route_many
from prour.router.thresholds import (
    Thresholds,
    decomposer_model_id,
    load_thresholds,
    save_thresholds,
)

logger = logging.getLogger(__name__)

SPLITS = ("dev", "test")


@dataclass
class CalibrationRun:
    """A recipe's calibration settings resolved to paths, with models built on first use."""

    recipe: Recipe
    router: RouterConfig
    llm_factory: Callable[[str], LLM] | None = None
    _llms: dict[str, LLM] = field(default_factory=dict)

    @property
    def out_dir(self) -> Path:
        configured = self.router.calibration.out_dir
        return Path(configured) if configured else self.recipe.resolved_run_dir() / "calibration"

    @property
    def thresholds_path(self) -> Path:
        return Path(self.router.thresholds_file or self.out_dir / "thresholds.json")

    @property
    def model_id(self) -> str:
        return decomposer_model_id(self._model_config("decomposer"))

    def states_path(self, split: str) -> Path:
        path = getattr(self.router.calibration, f"{split}_states")
        if not path:
            raise ValueError(
                f"router.calibration.{split}_states is not set (a JSONL of decision states)"
            )
        return Path(path)

    def labels_path(self, split: str) -> Path:
        return self.out_dir / f"labels_{split}.jsonl"

    def cache_path(self, split: str) -> Path:
        return self.out_dir / f"uncertainty_{split}.jsonl"

    def _model_config(self, role: str):
        if role not in self.recipe.models:
            raise ValueError(f"models.{role} is not set in recipe {self.recipe.name!r}")
        return self.recipe.models[role]

    def llm(self, role: str) -> LLM:
        """The model of a recipe role, built once."""
        if role not in self._llms:
            if self.llm_factory is not None:
                self._llms[role] = self.llm_factory(role)
            else:
                from prour.llm import build_llm

                self._llms[role] = build_llm(self._model_config(role))
        return self._llms[role]

    def close(self) -> None:
        for llm in self._llms.values():
            llm.close()


def state_seed(recipe_seed: int, state_id: str) -> int:
    """A decision seed that depends only on the recipe seed and the state (order-free resume)."""
    return zlib.crc32(f"{recipe_seed}:{state_id}".encode())


def label_split(run: CalibrationRun, split: str) -> list[dict[str, Any]]:
    """Annotate the split's states not yet labelled; returns the new records."""
    cfg = run.router.calibration
    return annotate(
        run.llm("annotator"),
        read_states(run.states_path(split)),
        out_path=run.labels_path(split),
        temperature=cfg.annotator_temperature,
        max_tokens=cfg.annotator_max_tokens,
        excerpt_chars=cfg.excerpt_chars,
    )


def _decomposers(run: CalibrationRun) -> Callable[[str], Decomposer]:
    """A per-domain decomposer factory (tools differ by domain); thresholds are not needed here."""
    from prour.env.environment import tool_schemas

    built: dict[str, Decomposer] = {}

    def get(domain: str) -> Decomposer:
        if domain not in built:
            built[domain] = Decomposer(run.llm("decomposer"), tool_schemas(domain), run.router)
        return built[domain]

    return get


def read_cache(path: Path) -> dict[str, dict[str, Any]]:
    """state id -> cached decision (a line torn by a crash is skipped, so that state reruns)."""
    if not path.is_file():
        return {}
    return {str(obj["state_id"]): obj for obj in read_jsonl(path, on_error="skip")}


def measure_split(
    run: CalibrationRun, split: str, progress: Callable[[Iterable], Iterable] = iter
) -> int:
    """Run the decomposer on every uncached state of the split, appending each result; count."""
    states = read_states(run.states_path(split))
    cache_path = run.cache_path(split)
    done = set(read_cache(cache_path))
    todo = [s for s in states if s.state_id not in done]
    decomposer_for = _decomposers(run)
    default_domain = run.recipe.data.domain
    for state in progress(todo):
        decision = decomposer_for(state.domain or default_domain).decide(
            state.messages, seed=state_seed(run.recipe.seed, state.state_id)
        )
        append_jsonl(
            cache_path, {"state_id": state.state_id, "model_id": run.model_id, **decision.to_dict()}
        )
    return len(todo)


@dataclass
class Joined:
    """Labelled states with their AU/EU, plus states whose decision had no candidate."""

    state_ids: list[str]
    au: list[float]
    eu: list[float]
    labels: list[str]
    empty: list[tuple[str, str]]  # (state id, label) of decisions without AU/EU


def join_split(run: CalibrationRun, split: str) -> Joined:
    """Match labels to cached AU/EU by state id; a missing one is an error naming the files."""
    labels = read_labels(run.labels_path(split))
    cache = read_cache(run.cache_path(split))
    states = [s.state_id for s in read_states(run.states_path(split))]
    missing = [s for s in states if s not in labels or s not in cache]
    if missing:
        raise ValueError(
            f"{len(missing)} {split} states lack a label ({run.labels_path(split)}) or AU/EU "
            f"({run.cache_path(split)}), e.g. {missing[:3]}; run the label and search stages first"
        )
    joined = Joined([], [], [], [], [])
    for state_id in states:
        record = cache[state_id]
        if record.get("au") is None:
            joined.empty.append((state_id, labels[state_id]))
            continue
        joined.state_ids.append(state_id)
        joined.au.append(float(record["au"]))
        joined.eu.append(float(record["eu"]))
        joined.labels.append(labels[state_id])
    return joined


def search_thresholds(run: CalibrationRun) -> tuple[Calibration, Thresholds, Joined]:
    """Grid-search (τ_AU, τ_EU) on the dev split and store them under the decomposer's model id.

    States whose decision had no valid candidate have no AU/EU and are left out of the search.
    """
    joined = join_split(run, "dev")
    if joined.empty:
        logger.warning(
            "%d dev states had no valid candidate; left out of the search", len(joined.empty)
        )
    cfg = run.router.calibration
    result = calibrate(joined.au, joined.eu, joined.labels, lo=cfg.lo, hi=cfg.hi, step=cfg.step)
    stored = save_thresholds(
        run.thresholds_path, run.model_id, result, dataset=str(run.states_path("dev"))
    )
    return result, stored, joined


def evaluate_split(run: CalibrationRun, split: str = "test") -> tuple[RoutingScores, Thresholds]:
    """Score the stored thresholds on a split; empty decisions take ``router.empty_route``."""
    stored = load_thresholds(run.thresholds_path, run.model_id)
    joined = join_split(run, split)
    routed = list(route_many(joined.au, joined.eu, stored.tau_au, stored.tau_eu))
    predicted = routed + [run.router.empty_route] * len(joined.empty)
    labels = joined.labels + [label for _, label in joined.empty]
    return score_routes(predicted, labels), stored


def evaluate_llm_router(run: CalibrationRun, split: str = "test") -> tuple[RoutingScores, int]:
    """The prompted LLM router (ablation) on the same labelled states; also its invalid count."""
    from prour.env.environment import tool_schemas
    from prour.router.llm_router import LLMRouter

    labels = read_labels(run.labels_path(split))
    states = read_states(run.states_path(split))
    predicted: dict[str, str] = {}
    invalid = 0
    for domain in sorted({s.domain or run.recipe.data.domain for s in states}):
        group = [s for s in states if (s.domain or run.recipe.data.domain) == domain]
        router = LLMRouter(
            run.llm("router"),
            [schema["function"]["name"] for schema in tool_schemas(domain)],
            fallback=run.router.llm_router_fallback,
            temperature=run.router.llm_router_temperature,
            max_tokens=run.router.llm_router_max_tokens,
        )
        for state, decision in zip(group, router.decide_many([s.messages for s in group])):
            predicted[state.state_id] = decision.mode
        invalid += sum(router.invalid.values())
    ids = [s.state_id for s in states]
    return score_routes([predicted[i] for i in ids], [labels[i] for i in ids]), invalid
