"""The uncertainty decomposer (paper 3.2, A.2.2): goal readings -> candidates -> scores -> AU/EU.

Every sample is its own request with n=1 and its own seed (paper A.4.1: each call samples one
reading or one action): sample j of the decision seeded s uses seed s + j, goal readings first
(j < K), then reading k's actions (j = K + k·L + l). Explicit per-sample seeds make a sample the
same whether it is sent alone or in a batch, on every backend that honours request seeds (hf,
vLLM); an n=L request would leave the split of one seed over its samples to the backend.

Batched (the default), one decision costs three backend calls, however large K and L are:
1. one chat call with the K goal requests (equal prompts: the backend prefills once);
2. one chat call with the K·L action requests (the prompts differ only in their last line, the
   goal reading, so the backend encodes their shared prefix once);
3. one score call for every (distinct reading, candidate) pair: one shared prefix, one context
   per reading, one target per candidate.
Each candidate is scored as its canonical JSON followed by ``config.end_marker`` (Qwen3's
``<|im_end|>`` by default), so the completion token counts in the summed log-likelihood.
With ``batched=False`` every request goes to the backend in a call of its own (K + K·L chat
calls, K·|C| score calls): the same outputs, no batching and no reuse across requests; it is the
naive baseline of ``benchmarks/decomposer_latency.py``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from prour.config.router import RouterConfig
from prour.llm.base import LLM, ChatRequest, Completion, Message, SamplingParams, ScoreRequest
from prour.llm.history import render_history
from prour.router.candidates import ToolCatalog, answer_text, collect_candidates, render_tools
from prour.router.prompts import action_prompt, goal_prompt, score_prompt
from prour.router.routing import route as route_of
from prour.router.uncertainty import decompose, softmax_over_candidates

logger = logging.getLogger(__name__)


@dataclass
class Decision:
    """Everything one decomposer run saw and concluded.

    ``route`` is None when the decomposer has no thresholds (calibration runs), except for an
    ``empty`` decision (no goal or no valid candidate), which always takes ``config.empty_route``.
    """

    route: str | None
    au: float | None
    eu: float | None
    total: float | None
    interpretations: list[str]
    candidates: list[str]
    loglik: list[list[float]]  # [K, C] summed target log-likelihood, nats
    probs: list[list[float]]  # [K, C] softmax of loglik over the candidates
    invalid: dict[str, int]  # invalid action samples by reason
    n_action_samples: int
    empty_goals: int  # goal samples that were blank and dropped
    empty: bool  # no valid candidate or no goal: route came from config.empty_route
    model_calls: dict[str, int] = field(default_factory=dict)
    latency_s: float = 0.0
    phase_s: dict[str, float] = field(default_factory=dict)  # goals / actions / score seconds
    seed: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Calls:
    """Backend calls and requests/sequences issued during one decision."""

    chat_calls: int = 0
    score_calls: int = 0
    chat_requests: int = 0
    generated: int = 0
    score_requests: int = 0


def _seed(base: int | None, offset: int) -> int | None:
    return None if base is None else base + offset


class Decomposer:
    """Decides act / clarify / verify at one agent step from the dialogue alone (no task goal)."""

    def __init__(
        self,
        llm: LLM,
        tools: Sequence[dict[str, Any]],
        config: RouterConfig | None = None,
        thresholds: tuple[float, float] | None = None,
        batched: bool = True,
    ):
        self.llm = llm
        self.config = config or RouterConfig()
        self.catalog = ToolCatalog(tools)
        self.tools_text = render_tools(self.catalog, self.config.tool_detail)
        if thresholds is None and self.config.tau_au is not None and self.config.tau_eu is not None:
            thresholds = (self.config.tau_au, self.config.tau_eu)
        self.thresholds = thresholds
        self.batched = batched

    # ---- the three model calls -----------------------------------------------------------------

    def _chat(self, requests: list[ChatRequest], calls: _Calls | None) -> list[list[Completion]]:
        """All requests in one backend call, or (unbatched) one call per request."""
        calls = calls if calls is not None else _Calls()
        calls.chat_requests += len(requests)
        calls.generated += sum(r.sampling.n for r in requests)
        if self.batched:
            calls.chat_calls += 1
            return self.llm.chat(requests)
        calls.chat_calls += len(requests)
        return [self.llm.chat([request])[0] for request in requests]

    def _score(self, requests: list[ScoreRequest], calls: _Calls | None) -> list[float]:
        calls = calls if calls is not None else _Calls()
        calls.score_requests += len(requests)
        if self.batched:
            calls.score_calls += 1
            return [result.sum for result in self.llm.score(requests)]
        calls.score_calls += len(requests)
        return [self.llm.score([request])[0].sum for request in requests]

    def _sampling(
        self, n: int, temperature: float, max_tokens: int, seed: int | None
    ) -> SamplingParams:
        return SamplingParams(
            n=n, temperature=temperature, top_p=self.config.top_p, max_tokens=max_tokens, seed=seed
        )

    def _requests(
        self, prompt: str, n: int, temperature: float, max_tokens: int, seed: int | None
    ) -> list[ChatRequest]:
        """``n`` one-sample requests for ``prompt``, sample j seeded ``seed + j``."""
        return [
            ChatRequest(
                messages=[{"role": "user", "content": prompt}],
                sampling=self._sampling(1, temperature, max_tokens, _seed(seed, j)),
                enable_thinking=self.config.enable_thinking,
            )
            for j in range(n)
        ]

    def propose_goals(
        self, history: str, seed: int | None = None, calls: _Calls | None = None
    ) -> list[str]:
        """K first-person goal readings (empty ones dropped), one seeded request each."""
        cfg = self.config
        requests = self._requests(
            goal_prompt(history),
            cfg.n_interpretations,
            cfg.goal_temperature,
            cfg.goal_max_tokens,
            seed,
        )
        texts = [" ".join(answer_text(g[0].text).split()) for g in self._chat(requests, calls)]
        return [text for text in texts if text]

    def sample_actions(
        self, history: str, goals: list[str], seed: int | None = None, calls: _Calls | None = None
    ) -> list[str]:
        """L raw action samples per goal reading (one seeded request each), flattened."""
        cfg = self.config
        requests = [
            request
            for k, goal in enumerate(goals)
            for request in self._requests(
                action_prompt(history, self.tools_text, goal),
                cfg.n_actions,
                cfg.action_temperature,
                cfg.action_max_tokens,
                _seed(seed, cfg.n_interpretations + k * cfg.n_actions),
            )
        ]
        return [group[0].text for group in self._chat(requests, calls)]

    def score_candidates(
        self, history: str, goals: list[str], candidates: list[str], calls: _Calls | None = None
    ) -> np.ndarray:
        """Summed log-likelihood [K, C] of each candidate (plus end marker) under each goal.

        Identical goal readings are scored once. The contexts differ only in their last line (the
        reading), so a backend encodes their common prefix once and each context once.
        """
        unique = list(dict.fromkeys(goals))
        requests = [
            ScoreRequest(
                context=[{"role": "user", "content": score_prompt(history, self.tools_text, goal)}],
                target=candidate + self.config.end_marker,
                enable_thinking=False,
            )
            for goal in unique
            for candidate in candidates
        ]
        sums = np.asarray(self._score(requests, calls), dtype=np.float64)
        by_goal = sums.reshape(len(unique), len(candidates))
        return by_goal[[unique.index(goal) for goal in goals]]

    # ---- the decision ----------------------------------------------------------------------------

    def decide(self, messages: Sequence[Message], seed: int | None = None) -> Decision:
        """Run the decomposer on the dialogue so far and route (when thresholds are set)."""
        start = time.perf_counter()
        calls = _Calls()
        history = render_history(messages)
        goals = self.propose_goals(history, seed, calls)
        after_goals = time.perf_counter()
        samples = self.sample_actions(history, goals, seed, calls) if goals else []
        after_actions = time.perf_counter()
        found = collect_candidates(samples, self.catalog)
        decision = Decision(
            route=self.config.empty_route,
            au=None,
            eu=None,
            total=None,
            interpretations=goals,
            candidates=found.candidates,
            loglik=[],
            probs=[],
            invalid=dict(found.invalid),
            n_action_samples=found.n_samples,
            empty_goals=self.config.n_interpretations - len(goals),
            empty=True,
            seed=seed,
        )
        if goals and found.candidates:
            self._fill_scores(decision, history, calls)
        decision.model_calls = asdict(calls)
        end = time.perf_counter()
        decision.latency_s = end - start
        decision.phase_s = {
            "goals": after_goals - start,
            "actions": after_actions - after_goals,
            "score": end - after_actions,
        }
        logger.debug(
            "decision: %d goals, %d candidates, %d invalid, route %s, %.2fs",
            len(goals),
            len(found.candidates),
            found.n_invalid,
            decision.route,
            decision.latency_s,
        )
        return decision

    def _fill_scores(self, decision: Decision, history: str, calls: _Calls) -> None:
        """Score, normalize, decompose and route a decision that has goals and candidates."""
        loglik = self.score_candidates(
            history, decision.interpretations, decision.candidates, calls
        )
        probs = softmax_over_candidates(loglik)
        uncertainty = decompose(probs)
        decision.loglik, decision.probs = loglik.tolist(), probs.tolist()
        decision.au, decision.eu, decision.total = uncertainty.au, uncertainty.eu, uncertainty.total
        decision.empty = False
        decision.route = route_of(uncertainty, *self.thresholds) if self.thresholds else None

