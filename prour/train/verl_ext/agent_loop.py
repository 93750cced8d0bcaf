"""verl agent loop of the query generator (loaded by verl through ``agent_loop_config_path``).

verl starts this loop in its own Ray workers, so the loop is an entry of its own: its registry
entry (:func:`prour.train.verl_backend.agent_loops`) names the recipe file and, as verl names
custom functions, the ``"module:attr"`` of the builder that makes the recipe's components.

One session = one sampled query for one state: generate with the rollout server (thinking on),
then score it with the information-gain reward, where the responders are the frozen models of
the recipe (vLLM endpoints) and the belief scorer is the rollout server itself, i.e. the policy
being trained, through its prompt log-probs. The reward is set on the output, so verl's own
reward workers are not called.

verl runs each of a prompt's ``n`` sessions as its own agent loop; the reward object is shared
by every loop of a worker process and keyed by training step, so a state's prior is scored once
per step and all its sessions use that one value. Each session times its own phases
(generation, responder calls, scoring) and hands them on with the reward's facts; the trainer
joins every session's into the step's phase times.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from functools import lru_cache
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

from prour.rewards import InfoGainReward
from prour.train.metrics import PhaseClock, clocking
from prour.train.verl_ext.logic import (
    RolloutServerLLM,
    completion_from_output,
    generation_budget,
    reward_extra_info,
)

logger = logging.getLogger(__name__)

AGENT_NAME = "prour_query"


@lru_cache(maxsize=2)
def _run_context(recipe_path: str, builder: str) -> tuple[Any, Any]:
    """The run's recipe and frozen responders (clients), built once per worker process by the
    components' builder that ``builder`` names (``"module:attr"``, called with the recipe)."""
    from prour.recipes import load_recipe
    from prour.registry import load_target
    from prour.train.reward import build_responders

    recipe = load_recipe(recipe_path, endpoints=True)
    return recipe, build_responders(load_target(builder)(recipe))


class StepPriorReward(InfoGainReward):
    """The information-gain reward shared by the agent loops of one worker during one step.

    Sessions run concurrently in worker threads; a lock per state makes the first of them score
    the prior while the others wait for it, so each state costs one prior request per step. The
    responder calls of all those sessions share one bound, ``reward.responder_concurrency``.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self._state_locks: dict[str, threading.Lock] = {}

    def at_step(self, step: int) -> None:
        """Priors are the policy's of ``step``: forget those of earlier steps."""
        with self._lock:
            if step != self.policy_version:
                self._priors.clear()
                self._state_locks.clear()
                self.policy_version = step

    def prior(self, state: Any) -> Any:
        with self._lock:
            lock = self._state_locks.setdefault(state.state_id, threading.Lock())
        with lock:
            return super().prior(state)


_shared: dict[str, StepPriorReward] = {}
_shared_lock = threading.Lock()


def _step_reward(loop: QueryAgentLoop, step: int) -> StepPriorReward:
    """The worker's reward for ``loop``'s recipe at ``step`` (rebuilt when the event loop that
    owns the rollout-server client changes)."""
    with _shared_lock:
        reward = _shared.get(loop.recipe_path)
        if reward is None or reward.policy_llm.loop is not loop.loop:
            policy = RolloutServerLLM(loop._generate, loop.tokenizer, loop.loop)
            reward = StepPriorReward(
                policy,
                loop.responders.strict_user,
                loop.responders.verifier_factory,
                loop.recipe.reward,
                loop.responders.question_cost,
            )
            _shared[loop.recipe_path] = reward
    reward.at_step(step)
    return reward


@register(AGENT_NAME)
class QueryAgentLoop(AgentLoopBase):
    """Sample a query, answer it with the frozen responder, reward it by information gain."""

    def __init__(self, *args: Any, recipe_path: str, builder: str, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.recipe_path = recipe_path
        self.recipe, self.responders = _run_context(recipe_path, builder)
        self.response_length = self.rollout_config.response_length

    async def _generate(self, prompt_ids: list[int], sampling_params: dict[str, Any]) -> Any:
        return await self.server_manager.generate(
            request_id=uuid4().hex, prompt_ids=prompt_ids, sampling_params=sampling_params
        )

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        from prour.data.schema import state_from_row

        prompt_ids = await self.ct_build_initial_tokens(list(kwargs["raw_prompt"]))
        clock = PhaseClock(now=time.time)  # this session's phases, joined with the others' later
        with clock.timed("generation"):
            output = await self._generate(prompt_ids, sampling_params)
        response_ids = list(output.token_ids)[: self.response_length]
        clock.count("generation_tokens", len(response_ids))
        budget = generation_budget(len(prompt_ids), sampling_params, self.rollout_config)
        completion = completion_from_output(
            self.tokenizer, response_ids, output.stop_reason, len(prompt_ids), budget
        )
        state = state_from_row(
            {"reward_model": kwargs["reward_model"], "extra_info": kwargs["extra_info"]}
        )
        reward_fn = _step_reward(self, int(kwargs["global_steps"]))
        with clocking(clock):  # to_thread copies the context: the reward records on ``clock``
            sample = (await asyncio.to_thread(reward_fn.score_group, state, [completion]))[0]
        intervals, counts = clock.take_intervals()
        logprobs = output.log_probs[: self.response_length] if output.log_probs else None
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            response_mask=[1] * len(response_ids),
            response_logprobs=logprobs,
            reward_score=0.0 if sample.reward is None else float(sample.reward),
            num_turns=2,
            metrics=AgentLoopMetrics(),
            extra_fields={
                "reward_extra_info": reward_extra_info(sample, state.mode, intervals, counts),
                "finish_reason": completion.finish_reason,
                "turn_scores": [],
                "tool_rewards": [],
                **output.extra_fields,
            },
        )
