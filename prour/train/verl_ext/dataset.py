"""verl dataset of our instances: each prompt asks for ``n`` sessions (``data.prour_sample_n``).

Rows of an older schema version are refused when the dataset loads, before any rollout.

verl sizes its PPO mini-batches by ``actor_rollout_ref.rollout.n``; we set that to the number of
samples *kept* per state, and request the larger number *sampled* per prompt through the
``__rollout_n__`` field verl's agent-loop workers honour.
"""

from __future__ import annotations

from typing import Any

from verl.utils.dataset.rl_dataset import RLHFDataset

from prour.data.schema import version_problem


class ProurRLDataset(RLHFDataset):
    """verl's RLHF dataset plus the per-prompt sample count."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.sample_n = int(self.config.get("prour_sample_n", 0) or 0)
        problems = version_problem(self.dataframe[0]["extra_info"] or {}) if len(self) else []
        if problems:
            raise ValueError(f"{self.data_files}: {problems[0]}")

    def __getitem__(self, item: int) -> dict[str, Any]:
        row = super().__getitem__(item)
        if self.sample_n:
            row["__rollout_n__"] = self.sample_n
        return row
