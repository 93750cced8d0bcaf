"""The mode-conditioned information-gain reward (paper 3.3, A.3).

For a state (history h, mode m, target Y) and a sampled query Q answered with A:
ℓ_prior = log p_θ(Y | belief_m(h)), ℓ_post = log p_θ(Y | belief_m(h, Q, A)), R = ℓ_post − ℓ_prior,
scored by the current policy θ itself. ``NO`` earns 0, an invalid output the configured penalty,
and a query whose responder fails (after bounded retries) is flagged ``failed`` with no reward.
With ``reward.attention.lambda`` λ > 0 an answered clarify query earns R = IG − λ·cost(Q), its
attention cost priced by :mod:`prour.rewards.attention`; ``ig`` and ``attention_cost`` keep the
two terms apart for the metrics.

Cost per group: one responder batch (a step's groups answered side by side, at most
``reward.responder_concurrency`` calls at once), one prior score request per state (cached across groups
until :meth:`InfoGainReward.policy_updated`), and one batched score call for all posteriors.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from prour.config.rewards import RewardConfig
from prour.core.clock import PhaseClock
from prour.core.reward import info_gain, target_logprob, utility
from prour.data.schema import EnvironmentMismatch, RewardState, decision_environment
from prour.llm.base import LLM, Completion, ScoreRequest, ScoreResult
from prour.llm.meter import metering
from prour.rewards.attention import QuestionCost
from prour.rewards.belief import belief_prompt
from prour.rollout.query import ParsedQuery, parse_query
from prour.rollout.strict_user import StrictUserSimulator
from prour.rollout.verifier import Verifier

logger = logging.getLogger(__name__)


@dataclass
class SampleReward:
    """The reward of one sampled output; ``reward`` is None exactly when ``failed``.

    For an answered question ``ig`` = post − prior and ``attention_cost`` is its priced cost (None
    when the attention term is off); ``reward`` = ig − λ·attention_cost.
    """

    kind: Literal["ask", "none", "invalid"]
    question: str | None = None
    answer: str | None = None
    prior: float | None = None
    post: float | None = None
    reward: float | None = None
    failed: bool = False
    reason: str | None = None
    n_target_tokens: int = 0
    ig: float | None = None
    attention_cost: float | None = None


class InfoGainReward:
    """Scores groups of query-generator outputs of one state with the information-gain reward.

    ``verifier_factory(domain)`` builds the verifier of a domain (once). ``question_cost`` prices
    clarify questions when ``config.attention.lam`` > 0 (built from the config when not given;
    the ``judge`` cost needs it given). Call :meth:`policy_updated` after every optimizer step:
    cached priors belong to the old policy. ``clock`` (its own when not given; in a block of
    :func:`~prour.core.clock.clocking`, the clock that sets) records its prior and posterior
    scoring and its responder calls, with their counts and tokens (the trainer takes them every
    step). The arithmetic (information gain, aggregation, utility) is :mod:`prour.core.reward`.
    """

    def __init__(
        self,
        policy_llm: LLM,
        strict_user: StrictUserSimulator,
        verifier_factory: Callable[[str], Verifier] | None,
        config: RewardConfig | None = None,
        question_cost: QuestionCost | None = None,
        clock: PhaseClock | None = None,
    ):
        self.policy_llm = policy_llm
        self.strict_user = strict_user
        self.verifier_factory = verifier_factory
        self.config = config or RewardConfig()
        attention = self.config.attention
        if question_cost is None and attention.lam > 0:
            question_cost = QuestionCost(attention)
        self.question_cost = question_cost if attention.lam > 0 else None
        self.policy_version = 0
        self._priors: OrderedDict[tuple[str, int], ScoreResult] = OrderedDict()
        self._verifiers: dict[str, Verifier] = {}
        self._env_cache: tuple[str, Any] | None = None
        self._cache_lock = threading.Lock()  # verifiers and the environment, built once each
        self._in_flight = threading.BoundedSemaphore(self.config.responder_concurrency)
        self.clock = clock if clock is not None else PhaseClock()

    def policy_updated(self) -> None:
        """Forget cached priors: they were scored by the policy before its latest update."""
        self.policy_version += 1
        self._priors.clear()

    def score_group(
        self, state: RewardState, completions: Sequence[str | Completion]
    ) -> list[SampleReward]:
        """Rewards for the sampled outputs of one state, in order."""
        return self.score_groups([state], [completions])[0]

    def score_groups(
        self, states: Sequence[RewardState], groups: Sequence[Sequence[str | Completion]]
    ) -> list[list[SampleReward]]:
        """:meth:`score_group` for each state: the responders answer all states side by side (at
        most ``responder_concurrency`` calls at once), then the policy scores them, in order, in
        the calling thread (the policy is the model being trained)."""
        pending = [self._parse(c) for c in groups]
        questions = [[rewards[i].question or "" for i in asks] for rewards, asks in pending]
        todo = [g for g, q in enumerate(questions) if q]
        answers: dict[int, list[tuple[str | None, str | None]]] = {}
        if len(todo) == 1:
            answers[todo[0]] = self.respond(states[todo[0]], questions[todo[0]])
        elif todo:
            from concurrent.futures import ThreadPoolExecutor

            workers = min(self.config.responder_concurrency, len(todo))
            with ThreadPoolExecutor(workers, thread_name_prefix="prour-responders") as pool:
                futures = {g: pool.submit(self.respond, states[g], questions[g]) for g in todo}
                answers = {g: f.result() for g, f in futures.items()}
        for g in todo:
            self._finish(states[g], *pending[g], answers[g])
        return [rewards for rewards, _ in pending]

    def _parse(self, completions: Sequence[str | Completion]) -> tuple[list[SampleReward], list[int]]:
        """Each output's reward before any responder call, and the indices of its questions."""
        parsed = [parse_query(_text(c)) for c in completions]
        return [self._decided(p) for p in parsed], [i for i, p in enumerate(parsed) if p.kind == "ask"]

    def _finish(
        self,
        state: RewardState,
        rewards: list[SampleReward],
        asks: list[int],
        answers: list[tuple[str | None, str | None]],
    ) -> None:
        """Record the answers of a state's questions and score the answered ones."""
        scored: list[int] = []
        for i, (answer, error) in zip(asks, answers):
            rewards[i].answer = answer
            if answer is None:
                rewards[i].failed, rewards[i].reason = True, f"responder failed: {error}"
            else:
                scored.append(i)
        if scored:
            self._score_posteriors(state, [rewards[i] for i in scored])
            self._charge_attention(state, [rewards[i] for i in scored])

    def _charge_attention(self, state: RewardState, samples: list[SampleReward]) -> None:
        """R = IG − λ·cost(Q) for answered clarify questions (verify questions reach no user);
        a question that cannot be priced (the judge failed) fails its sample."""
        if self.question_cost is None or state.mode != "clarify":
            return
        costs = self.question_cost.costs(state.history, [s.question or "" for s in samples])
        for s, (cost, error) in zip(samples, costs):
            if cost is None:
                s.failed, s.reward, s.reason = True, None, f"attention cost failed: {error}"
                continue
            s.attention_cost = cost
            s.reward = utility(s.ig, cost, self.question_cost.lam)  # R = IG − λ·cost

    def _decided(self, parsed: ParsedQuery) -> SampleReward:
        """The reward of an output before any responder call (ask stays pending)."""
        if parsed.kind == "none":
            return SampleReward(kind="none", reward=0.0)
        if parsed.kind == "invalid":
            return SampleReward(
                kind="invalid", reward=self.config.invalid_penalty, reason=parsed.reason
            )
        return SampleReward(kind="ask", question=parsed.question)

    def prior(self, state: RewardState) -> ScoreResult:
        """ℓ_prior's token log-probs for a state: one score request, cached per policy version."""
        key = (state.state_id, self.policy_version)
        if key in self._priors:
            self._priors.move_to_end(key)
            return self._priors[key]
        request = ScoreRequest(
            context=belief_prompt(state.mode, state.history), target=state.target
        )
        with self.clock.current().timed("prior"):
            result = self._score([request], state)[0]
        self.clock.current().count("prior_requests", 1)
        self._priors[key] = result
        while len(self._priors) > self.config.prior_cache_size:
            self._priors.popitem(last=False)
        return result

    def _score_posteriors(self, state: RewardState, samples: list[SampleReward]) -> None:
        """Fill prior, post and reward of answered samples; identical exchanges are scored once."""
        prior = self._logprob(self.prior(state))
        unique: dict[tuple[str, str], int] = {}
        for s in samples:
            unique.setdefault((s.question or "", s.answer or ""), len(unique))
        requests = [
            ScoreRequest(
                context=belief_prompt(state.mode, state.history, q, a), target=state.target
            )
            for q, a in unique
        ]
        with self.clock.current().timed("posterior"):
            results = self._score(requests, state)
        self.clock.current().count("posterior_requests", len(requests))
        for s in samples:
            result = results[unique[(s.question or "", s.answer or "")]]
            s.prior, s.post = prior, self._logprob(result)
            s.ig = s.reward = info_gain(s.prior, s.post)
            s.n_target_tokens = result.n_tokens

    def _score(self, requests: list[ScoreRequest], state: RewardState) -> list[ScoreResult]:
        results = self.policy_llm.score(requests)
        if len(results) != len(requests):
            raise RuntimeError(
                f"policy backend returned {len(results)} scores for {len(requests)} requests "
                f"(state {state.state_id})"
            )
        return results

    def _logprob(self, result: ScoreResult) -> float:
        return target_logprob(result.token_logprobs, self.config.aggregation)

    def respond(
        self, state: RewardState, questions: list[str]
    ) -> list[tuple[str | None, str | None]]:
        """(answer, error) per question from the mode's responder, retrying failed items; its
        seconds, chat requests and tokens go to :attr:`clock` under the responder's role."""
        role = "strict_user" if state.mode == "clarify" else "verifier"
        clock = self.clock.current()

        def counted(requests: int, tokens: int) -> None:
            clock.count(f"{role}_calls", requests)
            clock.count(f"{role}_tokens", tokens)

        with clock.timed(role), metering(counted):
            return self._respond(state, questions)

    def _respond(
        self, state: RewardState, questions: list[str]
    ) -> list[tuple[str | None, str | None]]:
        results: list[tuple[str | None, str | None]] = [(None, "not attempted")] * len(questions)
        pending = list(range(len(questions)))
        for attempt in range(self.config.responder_retries + 1):
            if attempt:
                time.sleep(self.config.retry_backoff_s * 2 ** (attempt - 1))
                logger.info("retrying %d responder call(s), attempt %d", len(pending), attempt + 1)
            batch = [questions[i] for i in pending]
            try:
                with self._in_flight:  # at most responder_concurrency calls at once
                    replies = call_with_timeout(
                        functools.partial(self._responder_call, state, batch),
                        self.config.responder_timeout_s,
                    )
            except EnvironmentMismatch:  # a wrong environment is an error, never a failed sample
                raise
            except Exception as exc:  # noqa: BLE001 - BackendError, timeouts, HTTP errors: retry, then fail
                logger.warning("responder call failed (state %s): %s", state.state_id, exc)
                replies = [(None, f"{type(exc).__name__}: {exc}")] * len(batch)
            for i, reply in zip(pending, replies):
                results[i] = reply
            pending = [i for i in pending if results[i][0] is None]
            if not pending:
                break
        return results

    def _responder_call(
        self, state: RewardState, questions: list[str]
    ) -> list[tuple[str | None, str | None]]:
        """One batched call of the strict user (clarify) or the verifier (verify)."""
        if state.mode == "clarify":
            replies = self.strict_user.answer_many(state.target, questions)
            return [(r, None if r is not None else "empty reply") for r in replies]
        verifier = self._verifier(state.domain)
        if state.env is not None:  # the caller's environment: the verifier works on a copy
            results = verifier.answer_many(questions, state.history, state.env)
        else:  # rebuilt here for this state only: nobody else sees it, no copy needed
            env = self._private_environment(state)
            results = verifier.answer_many(questions, state.history, env, copy_env=False)
        return [(None, r.error) if r.failed else (r.answer, None) for r in results]

    def _verifier(self, domain: str) -> Verifier:
        if self.verifier_factory is None:
            raise ValueError("a verify state needs a verifier_factory in InfoGainReward")
        with self._cache_lock:
            if domain not in self._verifiers:
                self._verifiers[domain] = self.verifier_factory(domain)
            return self._verifiers[domain]

    def _private_environment(self, state: RewardState) -> Any:
        """The environment at a verify state, rebuilt and hash-checked (last state cached)."""
        with self._cache_lock:
            if self._env_cache is None or self._env_cache[0] != state.state_id:
                self._env_cache = (state.state_id, decision_environment(state))
            return self._env_cache[1]


def call_with_timeout(fn: Callable[[], Any], timeout_s: float | None) -> Any:
    """Run ``fn`` with a wall-clock limit; a call past it raises TimeoutError (its thread is left)."""
    if timeout_s is None:
        return fn()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the calling thread below
            box["error"] = exc

    context = contextvars.copy_context()  # the caller's meter follows the call
    thread = threading.Thread(
        target=context.run, args=(run,), name="prour-responder", daemon=True
    )
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"responder call did not return within {timeout_s} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _text(completion: str | Completion | Any) -> Any:
    """The raw text of a sampled output (think block included), or the object itself."""
    return completion.text if isinstance(completion, Completion) else completion
