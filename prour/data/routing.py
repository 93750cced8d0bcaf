"""The routing of decision states (step 3 of :mod:`prour.data.extract`): the decomposer decides
each state once (decisions cached in JSONL, so a rerun resumes) and the current thresholds route
it to act, clarify or verify."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from prour.data.decision_states import DecisionState, Routed
from prour.data.decisions import DecisionCache, decision_key, decomposer_calls
from prour.router.decomposer import Decomposer
from prour.router.routing import route
from prour.router.uncertainty import Uncertainty

log = logging.getLogger(__name__)


def resolve(record: dict[str, Any], thresholds: tuple[float, float], empty_route: str) -> Routed:
    """Route a cached decision with the current thresholds (empty decisions: ``empty_route``)."""
    decision = record["decision"]
    calls, requests = decomposer_calls(decision.get("model_calls") or {})
    if decision.get("empty") or decision.get("au") is None:
        return Routed(empty_route, 0.0, 0.0, 0.0, True, calls, requests)
    unc = Uncertainty(float(decision["au"]), float(decision["eu"]), float(decision["total"]))
    return Routed(route(unc, *thresholds), unc.au, unc.eu, unc.total, False, calls, requests)


@dataclass
class Router:
    """The decomposer side of extraction: one decomposer per domain, its id and settings."""

    decomposer_for: Callable[[str], Decomposer]
    model_id: str
    fingerprint: dict[str, Any]
    thresholds: tuple[float, float]
    empty_route: str = "act"

    def decide(self, state: DecisionState) -> dict[str, Any]:
        """Run the decomposer on one state (no caching here)."""
        decision = self.decomposer_for(state.domain).decide(state.history, seed=state.seed)
        return {"model": self.model_id, "trajectory_id": state.trajectory_id, "step": state.step,
                "decision": decision.to_dict()}


def route_states(states: Sequence[DecisionState], router: Router, cache: DecisionCache,
                 concurrency: int, progress: bool = True) -> list[Routed]:
    """Route every state, computing (in parallel) and caching only the decisions not cached."""
    for state in states:
        state.key = decision_key(router.model_id, router.fingerprint, state.history, state.seed)
    todo = list({s.key: s for s in states if cache.get(s.key) is None}.values())
    log.info("routing %d state(s): %d cached, %d to decompose", len(states),
             len(states) - len(todo), len(todo))
    with ThreadPoolExecutor(max_workers=concurrency) as pool, \
            DecomposerBar(len(todo), progress) as bar:
        for state, record in zip(todo, pool.map(router.decide, todo)):
            cache.put(state.key, record)
            bar(1)
    return [resolve(cache.records[s.key], router.thresholds, router.empty_route) for s in states]


class DecomposerBar:
    """A rich progress bar of decomposer decisions as a context manager yielding
    ``advance(n)``; silent when disabled (extract's routing, the post-hoc pass)."""

    def __init__(self, total: int, enabled: bool):
        self.enabled = enabled and total > 0
        self.total = total

    def __enter__(self) -> Callable[[int], None]:
        if not self.enabled:
            return lambda n: None
        from rich.progress import Progress

        self.progress = Progress(transient=False)
        self.progress.start()
        task = self.progress.add_task("decomposer", total=self.total)
        return lambda n: self.progress.update(task, advance=n)

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.progress.stop()
