"""verl sampler that keeps ``keep`` of each group's ``n`` sessions (valid questions first).

Loaded by verl through ``trainer.v1.sampler.custom_sampler``; options arrive in
``trainer.v1.sampler.sampler_kwargs``: ``keep``, ``max_failed_ask_fraction``,
``drop_zero_variance`` and, with the latter, ``train_batch_size`` and
``max_inflight_gen_batches`` for verl's refill of dropped groups (the refill asks for single
prompts, so verl's ``data.gen_batch_size`` must be 1, as ``algorithm.filter_groups.enable`` sets).

Every sampled batch also returns the step's reward diagnostics (:func:`step_metrics`), which verl
logs with its step metrics. A batch in which every group is dropped is not trained on: the
sampler warns, asks verl for a fresh batch of prompts and samples again. Training stops with an
error once the failed share of the step's questions exceeds ``max_failed_ask_fraction``
(``train.max_failed_ask_fraction``: responders down or unreachable).

:class:`OneStepKeepValidFirstReplayBuffer` is the same selection on verl's asynchronous buffer,
for ``train.overlap: one_step`` (``OneStepStateOrderedTrainer``): it takes the oldest finished
groups and drops any older than verl's ``max_off_policy_threshold`` versions. An optional
``poll_interval`` in ``sampler_kwargs`` sets how often both buffers look at TransferQueue while
they wait (verl's 2 s unless told).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import transfer_queue as tq
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

from prour.train.metrics import FailedAsksError, check_failed_asks
from prour.train.verl_ext.logic import (
    SampleInfo,
    flat_groups,
    kept_keys,
    parse_trajectory_key,
    sample_info,
    step_metrics,
)

logger = logging.getLogger(__name__)

__all__ = ["FailedAsksError", "KeepValidFirstReplayBuffer", "OneStepKeepValidFirstReplayBuffer"]


class KeepValidFirstReplayBuffer(ReplayBuffer):
    """verl's synchronous replay buffer with our selection applied to every sampled batch."""

    def __init__(self, *, sampler_kwargs: Any, refill_fn: Any = None, **kwargs: Any):
        options = dict(sampler_kwargs or {})
        self.keep = int(options["keep"])
        self.max_failed_ask_fraction = float(options["max_failed_ask_fraction"])
        self.drop_zero_variance = bool(options.get("drop_zero_variance", False))
        extra: dict[str, Any] = {}
        if self.drop_zero_variance:  # verl's DAPO machinery refills, our rule decides what is flat
            extra = {
                "filter_groups_metric": "reward",
                "train_batch_size": int(options["train_batch_size"]),
                "gen_batch_size": 1,
                "max_inflight_gen_batches": int(options.get("max_inflight_gen_batches", 2)),
            }
        if "poll_interval" in options:
            extra["poll_interval"] = float(options["poll_interval"])
        super().__init__(sampler_kwargs=sampler_kwargs, refill_fn=refill_fn, **kwargs, **extra)
        self._seen: dict[str, SampleInfo] = {}  # this step's finished trajectories, by key

    def step_infos(self) -> list[SampleInfo]:
        """Every trajectory the step's sampling saw (kept, dropped, refilled), as sampled."""
        return list(self._seen.values())

    def _infos(self, partition_id: str, keys: list[str]) -> list[SampleInfo]:
        if not keys:
            return []
        data = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=["extra_fields"])
        return [sample_info(value) for value in data["extra_fields"]]

    def _states_seen(self) -> int:
        return len({parse_trajectory_key(key)[0] for key in self._seen})

    def _check_failed_asks(self) -> None:
        """Stop training when too many of this step's questions failed."""
        check_failed_asks(list(self._seen.values()), self.max_failed_ask_fraction,
                          self._states_seen())

    def _dapo_filtered_keys(self, partition_id: str) -> tuple[set[str], Counter]:
        """Finished groups whose kept rewards are all equal (no signal after selection)."""
        if partition_id == "val" or not self.drop_zero_variance:
            return set(), Counter()
        finished = self.finished_keys[partition_id]
        keys = [k for k in self.partitions[partition_id] if parse_trajectory_key(k)[0] in finished]
        infos = self._infos(partition_id, keys)
        self._seen.update(zip(keys, infos))
        if self._states_seen() >= self.train_batch_size:  # judged on a step's worth of groups
            self._check_failed_asks()
        flat = flat_groups(keys, infos, self.keep)
        return set(flat), Counter(flat.values())

    def sample(
        self, global_steps: int, partition_id: str, batch_size: int
    ) -> tuple[KVBatchMeta, dict]:
        """verl's sample, then our selection; an all-dropped batch is replaced by a fresh one."""
        self._seen = {}
        skipped = 0
        while True:
            batch, metrics = super().sample(global_steps, partition_id, batch_size)
            if partition_id == "val":
                return batch, metrics
            kept, infos = self._select(partition_id, batch)
            if kept.keys:
                metrics.update(step_metrics(infos))
                metrics["training/prour/kept_samples"] = len(kept.keys)
                metrics["training/prour/skipped_batches"] = skipped
                return kept, metrics
            skipped += 1
            logger.warning(
                "step %d: every group of the sampled batch was dropped (%d trajectories, none "
                "with two usable samples); no update on it, sampling a fresh batch",
                global_steps,
                len(batch.keys),
            )
            self.refill_fn(batch_size)

    def _select(self, partition_id: str, batch: KVBatchMeta) -> tuple[KVBatchMeta, list]:
        """The kept part of ``batch`` (the rest is cleared from TransferQueue) and the infos of
        all its trajectories."""
        keys = list(batch.keys)
        infos = self._infos(partition_id, keys)
        self._seen.update(zip(keys, infos))
        self._check_failed_asks()
        kept, dropped = kept_keys(keys, infos, self.keep)
        if dropped:
            tq.kv_clear(partition_id=partition_id, keys=dropped)
        tags = dict(zip(keys, batch.tags))
        logger.info("kept %d of %d trajectories", len(kept), len(keys))
        kept_batch = KVBatchMeta(partition_id=partition_id, keys=kept, tags=[tags[k] for k in kept])
        return kept_batch, infos


class OneStepKeepValidFirstReplayBuffer(KeepValidFirstReplayBuffer, ReplayBufferAsync):
    """verl's asynchronous replay buffer (oldest finished groups first, stale ones dropped by
    ``max_off_policy_threshold``) with our selection applied to every sampled batch."""
