"""verl sampler that keeps ``keep`` of each group's ``n`` sessions (valid questions first).

Loaded by verl through ``trainer.v1.sampler.custom_sampler``; options arrive in
``trainer.v1.sampler.sampler_kwargs``: ``keep``, ``drop_zero_variance`` and, with the latter,
``train_batch_size`` and ``max_inflight_gen_batches`` for verl's refill of dropped groups.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import transfer_queue as tq
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

from prour.train.verl_ext.logic import flat_groups, kept_keys, parse_trajectory_key, sample_info

logger = logging.getLogger(__name__)


class KeepValidFirstReplayBuffer(ReplayBuffer):
    """verl's synchronous replay buffer with our selection applied to every sampled batch."""

    def __init__(self, *, sampler_kwargs: Any, refill_fn: Any = None, **kwargs: Any):
        options = dict(sampler_kwargs or {})
        self.keep = int(options["keep"])
        self.drop_zero_variance = bool(options.get("drop_zero_variance", False))
        extra: dict[str, Any] = {}
        if self.drop_zero_variance:  # verl's DAPO machinery refills, our rule decides what is flat
            extra = {
                "filter_groups_metric": "reward",
                "train_batch_size": int(options["train_batch_size"]),
                "gen_batch_size": 1,
                "max_inflight_gen_batches": int(options.get("max_inflight_gen_batches", 2)),
            }
        super().__init__(sampler_kwargs=sampler_kwargs, refill_fn=refill_fn, **kwargs, **extra)

    def _infos(self, partition_id: str, keys: list[str]) -> list[Any]:
        if not keys:
            return []
        data = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=["extra_fields"])
        return [sample_info(value) for value in data["extra_fields"]]

    def _dapo_filtered_keys(self, partition_id: str) -> tuple[set[str], Counter]:
        """Finished groups whose kept rewards are all equal (no signal after selection)."""
        if partition_id == "val" or not self.drop_zero_variance:
            return set(), Counter()
        finished = self.finished_keys[partition_id]
        keys = [k for k in self.partitions[partition_id] if parse_trajectory_key(k)[0] in finished]
        flat = flat_groups(keys, self._infos(partition_id, keys), self.keep)
        return set(flat), Counter(flat.values())

    def _materialize_batch(
        self,
        partition_id: str,
        selected_prompt_uids: list[str],
        partition_snapshot: dict[str, dict],
    ) -> KVBatchMeta:
        batch = super()._materialize_batch(partition_id, selected_prompt_uids, partition_snapshot)
        if partition_id == "val":
            return batch
        kept, dropped = kept_keys(
            batch.keys, self._infos(partition_id, list(batch.keys)), self.keep
        )
        if dropped:
            tq.kv_clear(partition_id=partition_id, keys=dropped)
        tags = dict(zip(batch.keys, batch.tags))
        logger.info(
            "kept %d of %d trajectories (%d groups)",
            len(kept),
            len(batch.keys),
            len(selected_prompt_uids),
        )
        return KVBatchMeta(partition_id=partition_id, keys=kept, tags=[tags[k] for k in kept])
