"""The verl extensions' decisions, free of verl imports so that they run (and are tested) on CPU.

Trajectory keys in verl's TransferQueue read ``{uid}_{session}_{index}``: ``uid`` names the
prompt (one GRPO group), ``session`` the sample's place in sampling order.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prour.llm import chat as chat_rules
from prour.llm.base import ChatRequest, Completion, ScoreRequest, ScoreResult
from prour.train.algorithm import select_kept
from prour.train.metrics import phase_metrics, sample_diagnostics, shared_seconds

logger = logging.getLogger(__name__)

SCORE_SAMPLING = {"max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0, "detokenize": False}
"""vLLM parameters of a scoring call: one forward pass returning the prompt tokens' log-probs."""


@dataclass(frozen=True)
class SampleInfo:
    """What the sampler needs to know of one trajectory (from its ``reward_extra_info``)."""

    kind: str
    failed: bool
    reward: float | None
    mode: str | None = None
    prior: float | None = None
    post: float | None = None
    ig: float | None = None
    attention_cost: float | None = None
    phases: tuple[tuple[str, float, float], ...] = ()  # (phase, start, end), time.time seconds
    calls: dict[str, int] = field(default_factory=dict)  # CALL_KEYS counts of the session


def parse_trajectory_key(key: str) -> tuple[str, int, int]:
    """``(uid, session, index)`` of a trajectory key ``{uid}_{session}_{index}``."""
    uid, session, index = key.rsplit("_", 2)
    return uid, int(session), int(index)


def reward_extra_info(
    sample: Any,
    mode: str,
    phases: Sequence[tuple[str, float, float]] = (),
    calls: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The per-sample facts the agent loop hands to verl (metrics and our sampler read them);
    ``mode`` is the state's belief mode (clarify or verify). ``ig_reward`` is the reward the
    update uses (R = IG − λ·cost with the attention term on); ``ig`` and ``attention_cost`` are
    its two terms; ``phases`` the session's timed intervals and ``calls`` its counts (as JSON
    text, which verl's validation metrics skip like the other strings).

    Keys avoid verl's own ``reward`` entry, which its validation fills with the scalar score.
    """
    return {
        "query_kind": sample.kind,
        "mode": mode,
        "failed": bool(sample.failed or sample.reward is None),
        "ig_reward": None if sample.reward is None else float(sample.reward),
        "prior": sample.prior,
        "post": sample.post,
        "ig": sample.ig,
        "attention_cost": sample.attention_cost,
        "valid": sample.kind == "ask",
        # JSON text: verl's validation averages every non-string entry of reward_extra_info
        "phases": json.dumps([[str(p), float(a), float(b)] for p, a, b in phases]),
        "calls": json.dumps(dict(calls or {})),
    }


def sample_info(extra_fields: Any) -> SampleInfo:
    """Read a trajectory's ``extra_fields`` as stored by verl (dict or a wrapper with ``.data``)."""
    fields = getattr(extra_fields, "data", extra_fields)
    info = fields.get("reward_extra_info", {}) if isinstance(fields, Mapping) else {}
    if not info or "query_kind" not in info:
        return SampleInfo(kind="invalid", failed=True, reward=None)
    reward = info.get("ig_reward")
    return SampleInfo(
        kind=str(info["query_kind"]),
        failed=bool(info.get("failed")) or reward is None,
        reward=None if reward is None else float(reward),
        mode=info.get("mode"),
        prior=_optional_float(info.get("prior")),
        post=_optional_float(info.get("post")),
        ig=_optional_float(info.get("ig")),
        attention_cost=_optional_float(info.get("attention_cost")),
        phases=tuple((str(p), float(a), float(b)) for p, a, b in _json(info.get("phases"), [])),
        calls={str(k): int(v) for k, v in _json(info.get("calls"), {}).items()},
    )


def _json(text: Any, empty: Any) -> Any:
    """A JSON entry of reward_extra_info (``empty`` when absent)."""
    return json.loads(text) if isinstance(text, str) and text else empty


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def step_metrics(infos: Sequence[SampleInfo], prefix: str = "training/prour") -> dict[str, float]:
    """The reward diagnostics of one step's sampled trajectories, as verl logs step metrics:
    the local trainer's names (:func:`~prour.train.metrics.sample_diagnostics`: fractions by
    kind, failed asks, mean reward overall and by mode, mean prior and posterior) under
    ``prefix``; values that are None this step (no sample of a mode) are left out."""
    diagnostics = sample_diagnostics(infos, [i.mode for i in infos])
    return {f"{prefix}/{key}": value for key, value in diagnostics.items() if value is not None}


VERL_UPDATE_TIMERS = (
    "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor", "update_weights"
)
"""verl's ``timing_s/*`` timers of the training side, which together are the update phase."""


def verl_phase_metrics(
    infos: Sequence[SampleInfo],
    timing_raw: Mapping[str, float],
    step_started: float,
    prefix: str = "training/prour",
) -> dict[str, float | int]:
    """A verl step's :data:`~prour.train.metrics.PHASE_KEYS` and ``CALL_KEYS`` under ``prefix``.

    The step is verl's ``timing_s/step`` from ``step_started`` (``time.time``). Generation, the
    responders and the scoring passes are the sessions' intervals (``infos``: every trajectory
    the step sampled, kept or not), cut to the step and shared out where sessions overlap
    (:func:`~prour.train.metrics.shared_seconds`); the update is the sum of verl's training-side
    timers (:data:`VERL_UPDATE_TIMERS`); waiting is the rest (verl's scheduling and transfers,
    the balance, checkpoints). Should the sessions' share and the update exceed the step (clocks
    of several nodes apart), the sessions' phases are scaled down to fit, with a warning.
    """
    step_s = float(timing_raw["step"])
    end = step_started + step_s
    intervals = [
        (phase, max(a, step_started), min(b, end)) for info in infos for phase, a, b in info.phases
    ]
    seconds = shared_seconds(intervals)
    update = sum(float(timing_raw.get(name, 0.0)) for name in VERL_UPDATE_TIMERS)
    room = max(step_s - update, 0.0)
    if sum(seconds.values()) > room:
        logger.warning(
            "sessions' phases (%.3f s) and update (%.3f s) exceed the step's %.3f s: scaled down",
            sum(seconds.values()), update, step_s,
        )
        scale = room / sum(seconds.values())
        seconds = {p: v * scale for p, v in seconds.items()}
    seconds["update"] = min(update, step_s)
    counts: dict[str, int] = {}
    for info in infos:
        for key, n in info.calls.items():
            counts[key] = counts.get(key, 0) + n
    return {f"{prefix}/{k}": v for k, v in phase_metrics(seconds, counts, step_s).items()}


def _groups(keys: Sequence[str]) -> dict[str, list[int]]:
    """Positions of each uid's keys, in sampling (session) order."""
    groups: dict[str, list[int]] = {}
    for pos, key in enumerate(keys):
        groups.setdefault(parse_trajectory_key(key)[0], []).append(pos)
    for members in groups.values():
        members.sort(key=lambda pos: parse_trajectory_key(keys[pos])[1:])
    return groups


def kept_keys(
    keys: Sequence[str], infos: Sequence[SampleInfo], keep: int
) -> tuple[list[str], list[str]]:
    """Split a batch's trajectory keys into those kept for the update and those dropped.

    Per group: valid questions first, then the rest, in sampling order, at most ``keep``;
    failed samples are never kept; a group left with fewer than two samples is dropped whole
    (its advantages would carry no relative signal). Kept keys keep their batch order.
    """
    keep_pos: set[int] = set()
    for members in _groups(keys).values():
        chosen = select_kept(
            [infos[p].kind for p in members], keep, [infos[p].failed for p in members]
        )
        if len(chosen) >= 2:
            keep_pos.update(members[c] for c in chosen)
    kept = [k for pos, k in enumerate(keys) if pos in keep_pos]
    dropped = [k for pos, k in enumerate(keys) if pos not in keep_pos]
    return kept, dropped


def flat_groups(
    keys: Sequence[str], infos: Sequence[SampleInfo], keep: int, atol: float = 0.0
) -> dict[str, float]:
    """uid -> shared reward of each group whose *kept* rewards are all equal (DAPO's filter)."""
    flat: dict[str, float] = {}
    for uid, members in _groups(keys).items():
        chosen = select_kept(
            [infos[p].kind for p in members], keep, [infos[p].failed for p in members]
        )
        rewards = [infos[members[c]].reward for c in chosen]
        if len(rewards) < 2 or max(rewards) - min(rewards) <= atol:
            flat[uid] = float(rewards[0]) if rewards else 0.0
    return flat


def states_in_prompt_order(keys: Sequence[str], prompt_order: Mapping[str, int]) -> list[list[str]]:
    """A batch's trajectory keys grouped by state (uid): states by their place in
    ``prompt_order`` (uid -> submission position; states not in it last, as they appear), each
    state's keys in session order."""
    groups = _groups(keys)
    last = len(prompt_order)
    ordered = sorted(groups, key=lambda uid: prompt_order.get(uid, last))  # stable
    return [[keys[pos] for pos in groups[uid]] for uid in ordered]


def rank_major_order(n_states: int, per_state: int, dp: int) -> list[int]:
    """Positions that put ``per_state`` consecutive samples of each of ``n_states`` states into
    rank-major order: rank ``r``'s contiguous part holds the ``r``-th share of every state,
    states in the same order on every rank.

    verl hands rank ``r`` the ``r``-th contiguous chunk and cuts it into mini-batches in order
    (shuffle off), so mini-batch ``j`` of every rank is a share of the same states.
    """
    if per_state % dp:
        raise ValueError(f"{per_state} samples per state do not split over {dp} ranks")
    share = per_state // dp
    return [
        state * per_state + rank * share + i
        for rank in range(dp)
        for state in range(n_states)
        for i in range(share)
    ]


def target_logprobs(
    prompt_logprobs: Sequence[Sequence[float]], n_context: int, n_target: int
) -> list[float]:
    """Log-probs of the last ``n_target`` prompt tokens, from vLLM's prompt log-probs (verl's form).

    ``prompt_logprobs[j][0]`` is the log-prob of prompt token ``j + 1`` (the first token has none;
    verl appends a dummy entry for the last position), so target token ``k`` sits at
    ``n_context + k - 1``.
    """
    needed = n_context + n_target - 1
    if len(prompt_logprobs) < needed:
        raise ValueError(
            f"{len(prompt_logprobs)} prompt log-probs for {n_context} context + "
            f"{n_target} target tokens"
        )
    return [float(prompt_logprobs[n_context + k - 1][0]) for k in range(n_target)]


def generation_budget(
    n_prompt: int, sampling_params: Mapping[str, Any], rollout: Mapping[str, Any]
) -> int:
    """The ``max_tokens`` verl's rollout server grants a prompt of ``n_prompt`` tokens (its
    vLLM server's rule): the request's own ``max_tokens``, else ``response_length`` capped by
    what is left of ``prompt_length + response_length``; always within ``max_model_len`` (unset:
    prompt plus response length, as verl resolves it)."""
    context = rollout["prompt_length"] + rollout["response_length"]
    if "max_tokens" in sampling_params:
        budget = int(sampling_params["max_tokens"])
    else:
        budget = min(rollout["response_length"], context - n_prompt)
    return max(1, min(budget, (rollout.get("max_model_len") or context) - n_prompt))


def finish_reason(token_ids: Sequence[int], budget: int, eos_token_id: int | None) -> str:
    """``"length"`` for a reply cut at its token budget, else ``"stop"``.

    verl's server reports both vLLM reasons as ``"completed"``; a reply that used its whole
    budget without ending on the end-of-sequence token was cut.
    """
    ended = bool(token_ids) and eos_token_id is not None and token_ids[-1] == eos_token_id
    return "length" if len(token_ids) >= budget and not ended else "stop"


def completion_from_output(
    tokenizer: Any,
    token_ids: list[int],
    stop_reason: str | None,
    prompt_tokens: int,
    budget: int,
    logprobs: list[float] | None = None,
) -> Completion:
    """A :class:`Completion` of a rollout server's sampled ids; ``stop_reason`` is verl's
    (``"completed"`` for both stop and length, which ``budget`` tells apart; anything else,
    e.g. ``"aborted"``, counts as cut)."""
    reason = (
        finish_reason(token_ids, budget, tokenizer.eos_token_id)
        if stop_reason == "completed"
        else "length"
    )
    return Completion.from_text(
        tokenizer.decode(token_ids, skip_special_tokens=True),
        reason,
        prompt_tokens=prompt_tokens,
        token_ids=list(token_ids),
        logprobs=logprobs,
    )


Generate = Callable[[list[int], dict[str, Any]], Awaitable[Any]]
"""``generate(prompt_ids, sampling_params)`` of verl's rollout server manager: returns an object
with ``token_ids`` and ``extra_fields`` (``prompt_logprobs`` when asked for)."""


class RolloutServerLLM:
    """The :class:`~prour.llm.base.LLM` protocol over verl's rollout servers (the live policy).

    The agent loop runs on an asyncio loop; the reward is synchronous code, so it runs in a worker
    thread and this adapter hands each batch of server calls back to that loop.
    """

    name = "verl-rollout"

    def __init__(
        self,
        generate: Generate,
        tokenizer: Any,
        loop: asyncio.AbstractEventLoop,
        timeout_s: float = 900.0,
    ):
        self.generate = generate
        self.tokenizer = tokenizer
        self.loop = loop
        self.timeout_s = timeout_s

    def _run(self, make: Callable[[], Awaitable[Any]]) -> Any:
        """Run the coroutine ``make()`` on the agent loop's event loop and wait for its result."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:  # waiting here would block the loop that has to do the work
            raise RuntimeError(
                "RolloutServerLLM must be called from a worker thread, not its event loop"
            )
        return asyncio.run_coroutine_threadsafe(make(), self.loop).result(self.timeout_s)

    def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        """Teacher-forced log-probs of each target, one prompt-log-prob pass per request."""
        pairs = [chat_rules.score_ids(self.tokenizer, r) for r in requests]

        async def all_scores() -> list[Any]:
            return await asyncio.gather(
                *[self.generate(c + t, dict(SCORE_SAMPLING)) for c, t in pairs if t]
            )

        outputs = iter(self._run(all_scores))
        results = []
        for context, target in pairs:
            if not target:
                results.append(ScoreResult([]))
                continue
            entries = next(outputs).extra_fields["prompt_logprobs"]
            results.append(ScoreResult(target_logprobs(entries, len(context), len(target))))
        return results

    def chat(self, requests: Sequence[ChatRequest]) -> list[list[Completion]]:
        """``n`` sampled replies per request (one server call per sample)."""
        prompts = [
            chat_rules.encode(
                self.tokenizer,
                chat_rules.render_chat(self.tokenizer, r.messages, r.tools, r.enable_thinking),
            )
            for r in requests
        ]

        async def all_samples() -> list[Any]:
            calls = [
                self.generate(ids, _sampling(r))
                for ids, r in zip(prompts, requests)
                for _ in range(r.sampling.n)
            ]
            return await asyncio.gather(*calls)

        outputs = iter(self._run(all_samples))
        return [
            [self._completion(next(outputs), len(ids), r) for _ in range(r.sampling.n)]
            for ids, r in zip(prompts, requests)
        ]

    def _completion(self, output: Any, prompt_tokens: int, request: ChatRequest) -> Completion:
        return completion_from_output(
            self.tokenizer,
            list(output.token_ids),
            getattr(output, "stop_reason", None),
            prompt_tokens,
            request.sampling.max_tokens,
            getattr(output, "log_probs", None),
        )

    def close(self) -> None:
        """Nothing to release: the servers belong to verl."""


def _sampling(request: ChatRequest) -> dict[str, Any]:
    s = request.sampling
    return {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k or -1,
        "max_tokens": s.max_tokens,
        "logprobs": 0,
    }
