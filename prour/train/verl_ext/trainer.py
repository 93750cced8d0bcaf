"""verl's synchronous trainer with optimizer mini-batches of whole states (the paper's update).

verl 0.9.1's v1 trainer reorders every step's batch by sequence length to balance its
data-parallel ranks (``PPOTrainer._balance_batch``), so at two or more ranks a mini-batch mixes
states. :class:`StateOrderedTrainer` replaces only that step: the kept batch is ordered by state
in the order the trainer submitted the prompts (verl samples it in completion order), each state is padded to ``rollout.n`` (= ``train.rollout.keep``) samples with
verl's no-op padding samples, and rank ``r`` receives the ``r``-th equal share of every state.
verl's dispatch hands each rank a contiguous chunk and its ``train_mini_batch`` cuts that chunk in
order (``actor.shuffle`` false), so mini-batch ``j`` on every rank is a share of the same
``ppo_mini_batch_size`` states: with ``train.ppo.mini_batch_states: 1``, one state per optimizer
step across all ranks, as on the local backend.

:class:`OneStepStateOrderedTrainer` is the same split on verl's colocated asynchronous trainer
(``train.overlap: one_step``): the next step's prompts roll out on the current weights while
this step updates, and every session finishes on the weights it started with (see the class).

verl picks the trainer by ``trainer.v1.trainer_mode`` from its registry inside the Ray task
runner; :func:`register` (run in every Ray worker through Ray's
``runtime_env.worker_process_setup_hook``) adds ours there under :data:`TRAINER_MODE` and
:data:`ONE_STEP_TRAINER_MODE`.
"""

from __future__ import annotations

import time
from typing import Any

from transfer_queue import KVBatchMeta
from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.debug import marked_timer
from verl.utils.seqlen_balancing import log_seqlen_unbalance

from prour.train.verl_backend import ONE_STEP_TRAINER_MODE, TRAINER_MODE
from prour.train.verl_ext.logic import (
    parse_trajectory_key,
    rank_major_order,
    states_in_prompt_order,
    verl_phase_metrics,
)


class StateOrderedTrainer(PPOTrainerSync):
    """``PPOTrainerSync`` whose data-parallel split keeps every mini-batch to whole states."""

    def __init__(self, config: Any):
        self.prompt_order: dict[str, int] = {}  # uid -> submission position, until trained
        super().__init__(config)

    # verl's name of the mode the trainer runs: its code treats every mode but "sync" as
    # asynchronous and reads that mode's config section. Our registered names are not verl's.
    VERL_MODE = "sync"

    @property
    def trainer_mode(self) -> str:
        """:attr:`VERL_MODE`, whatever name the trainer was registered under."""
        return self.VERL_MODE

    @trainer_mode.setter
    def trainer_mode(self, _registered_name: str) -> None:
        """``PPOTrainer.__init__`` stores the configured name; the mode stays :attr:`VERL_MODE`."""

    def on_step_begin(self) -> None:
        """verl's hook; also notes when the step began (its sessions' phases are cut to it)."""
        self.step_started = time.time()
        super().on_step_begin()

    def _compute_metrics(self, batch: Any, metrics: dict, timing_raw: dict, **kwargs: Any) -> None:
        """verl's step metrics, and the step's phase times under ``training/prour/``."""
        super()._compute_metrics(batch, metrics, timing_raw, **kwargs)
        metrics.update(self.phase_metrics(timing_raw))

    def phase_metrics(self, timing_raw: dict) -> dict:
        """The step's :data:`~prour.train.metrics.PHASE_KEYS` and counts, from the sampled
        sessions' own intervals and verl's timers (:func:`~prour.train.verl_ext.logic.
        verl_phase_metrics`)."""
        step_infos = getattr(self.replay_buffer, "step_infos", list)  # verl's own buffer: none
        return verl_phase_metrics(step_infos(), timing_raw, self.step_started)

    def _actor_dp_size(self) -> int:
        worker_group = self.actor_rollout_wg
        if "actor" not in worker_group._dispatch_info:
            worker_group._dispatch_info["actor"] = worker_group._query_dispatch_info("actor")
        return max(worker_group._dispatch_info["actor"]) + 1

    def _submit_batch_to_rollout(self, batch: Any) -> int:
        """verl's submission, remembering the prompts' order (the sampled batch comes in
        completion order)."""
        start = max(self.prompt_order.values(), default=-1) + 1
        for offset, uid in enumerate(batch["uid"]):
            self.prompt_order[str(uid)] = start + offset
        return super()._submit_batch_to_rollout(batch)

    def _pad(self, batch: KVBatchMeta, multiple: int) -> KVBatchMeta:
        """``batch`` with verl's no-op padding samples appended up to a multiple of ``multiple``."""
        return upsample_batch_to_divisible_size(batch, multiple, self.tokenizer.eos_token_id)

    def _balance_batch(
        self, batch: KVBatchMeta, metrics: dict, logging_prefix: str = "global_seqlen", **_: Any
    ) -> KVBatchMeta:
        """The kept batch in state order, each rank holding an equal share of every state."""
        dp = self._actor_dp_size()
        per_state = int(self.config.actor_rollout_ref.rollout.n)
        states_per_mini = int(self.config.actor_rollout_ref.actor.ppo_mini_batch_size)
        if per_state % dp:
            raise ValueError(
                f"train.rollout.keep={per_state} samples per state do not split evenly over the "
                f"actor's {dp} data-parallel ranks"
            )
        states = states_in_prompt_order(batch.keys, self.prompt_order)
        for keys in states:  # trained now (verl clears them after the update)
            self.prompt_order.pop(parse_trajectory_key(keys[0])[0], None)
        padded = [self._pad(batch.select_keys(keys), per_state) for keys in states]
        if any(len(state) != per_state for state in padded):
            raise ValueError(f"a state holds more than rollout.n={per_state} kept samples")
        ordered = KVBatchMeta(
            keys=[k for state in padded for k in state.keys],
            tags=[t for state in padded for t in state.tags],
            partition_id=batch.partition_id,
            fields=batch.fields,
            extra_info=batch.extra_info,
        )
        # whole padding states when the states do not fill the last mini-batch
        ordered = self._pad(ordered, per_state * states_per_mini)
        order = rank_major_order(len(ordered) // per_state, per_state, dp)
        share = len(order) // dp
        ranks = [order[r * share : (r + 1) * share] for r in range(dp)]
        metrics.update(
            log_seqlen_unbalance(
                seqlen_list=[tag["seq_len"] for tag in ordered.tags],
                partitions=ranks,
                prefix=logging_prefix,
            )
        )
        ordered.reorder(order)
        return ordered


class OneStepStateOrderedTrainer(StateOrderedTrainer, PPOTrainerColocateAsync):
    """verl's colocated asynchronous trainer, one step ahead, with whole-state mini-batches.

    verl's ``colocate_async`` aborts the unfinished requests when a batch is sampled and resumes
    them on the new weights after the update, so one sample's tokens (and, in our agent loop, its
    belief scores) would come from two policies. Here nothing is aborted: while step ``k``
    updates, the prompts submitted at its start (one batch ahead, verl's warm-up batch) keep
    generating and scoring on the weights they started with; at the step's end the trainer waits
    for them to finish (:meth:`drain_rollout`), then syncs the new weights. Step ``k + 1`` trains
    on them: every update uses samples exactly one update old, within verl's staleness bound
    (``trainer.v1.sampler.max_off_policy_threshold``, from ``train.max_staleness``). The replicas
    stay awake during the update (the GPU memory plan counts both the FSDP actor and vLLM)."""

    VERL_MODE = "colocate_async"

    def on_train_begin(self) -> None:
        """One batch of prompts ahead of the trainer: ``one_step``."""
        self._add_async_warmup_batches(1)

    def on_sample_end(self) -> None:
        """The replicas keep generating the next batch on their weights (no abort, no sleep)."""
        if self.curr_step_profile:
            self._stop_rollout_profiling()

    def on_step_end(self) -> None:
        """Let the sessions in flight finish on the old weights, then sync the new ones."""
        with marked_timer("overlap_drain", self.timing_raw, color="yellow"):
            self.drain_rollout()
        with marked_timer("update_weights", self.timing_raw, color="red"):
            self.checkpoint_manager.sleep_replicas()  # verl's naive sync expects them asleep
            self.checkpoint_manager.update_weights(self.global_steps)

    def drain_rollout(self, partition_id: str = "train") -> None:
        """Wait until no prompt of ``partition_id`` is pending or running (polled as the replay
        buffer polls TransferQueue)."""
        buffer = self.replay_buffer
        while True:
            buffer._sync_metadata_from_transfer_queue()
            if not (buffer.pending_keys[partition_id] or buffer.running_keys[partition_id]):
                return
            time.sleep(buffer.poll_interval)


def register() -> None:
    """Register our trainers in verl's trainer registry (this process)."""
    register_trainer(TRAINER_MODE)(StateOrderedTrainer)
    register_trainer(ONE_STEP_TRAINER_MODE)(OneStepStateOrderedTrainer)
