"""verl dataset of our instances: each prompt asks for ``n`` sessions (``data.prour_sample_n``).

Rows of an older schema version are refused when the dataset loads, before any rollout, and so
are prompts longer than ``data.max_prompt_tokens`` as the rollout renders them (verl's agent loop
would otherwise cut them from the left, system prompt first, without a word).

verl sizes its PPO mini-batches by ``actor_rollout_ref.rollout.n``; we set that to the number of
samples *kept* per state, and request the larger number *sampled* per prompt through the
``__rollout_n__`` field verl's agent-loop workers honour. Only the training files ask for it:
verl reads that field before ``val_kwargs.n``, so a validation dataset carrying it would decode
``n`` identical greedy samples per prompt.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.utils.tokenizer import normalize_token_ids

from prour.data.schema import version_problem

logger = logging.getLogger(__name__)


def file_list(value: Any) -> list[str]:
    """A data-files setting (one path or a list, possibly an OmegaConf list) as a list of str."""
    if value is None:
        return []
    if isinstance(value, str | os.PathLike):
        return [str(value)]
    return [str(item) for item in value]


class ProurRLDataset(RLHFDataset):
    """verl's RLHF dataset plus the per-prompt sample count."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.sample_n = int(self.config.get("prour_sample_n", 0) or 0) if self.serves_training() else 0
        problems = version_problem(self.dataframe[0]["extra_info"] or {}) if len(self) else []
        if problems:
            raise ValueError(f"{self.data_files}: {problems[0]}")

    def serves_training(self) -> bool:
        """Whether these are the training files (validation samples once per prompt)."""
        train = file_list(self.config.get("train_files"))
        if train == file_list(self.config.get("val_files")):
            logger.warning(
                "data.val_files is the training file (train.val_file unset): validation rollouts "
                "sample %s times per prompt like training; set train.val_file to validate once",
                self.config.get("prour_sample_n"),
            )
            return True
        return file_list(self.original_data_files) == train

    def prompt_length(self, row: dict[str, Any]) -> int:
        """Tokens of a row's prompt as the agent loop renders it (chat template, generation
        prompt, the run's template options such as ``enable_thinking``)."""
        options = dict(self.apply_chat_template_kwargs or {})
        for key in ("tokenize", "return_dict", "return_tensors"):
            options.pop(key, None)
        ids = self.tokenizer.apply_chat_template(
            list(row[self.prompt_key]), add_generation_prompt=True, tokenize=True, **options
        )
        return len(normalize_token_ids(ids))

    def keep_modes(self, dataframe: Any) -> Any:
        """The rows of ``train.modes`` (``data.prour_modes``; unset: all), as the local trainer
        keeps them (:func:`prour.train.data.keep_modes`); an empty result is refused."""
        modes = self.config.get("prour_modes")
        if not modes:
            return dataframe
        from prour.train.data import keep_modes

        rows = [dataframe[i] for i in range(len(dataframe))]
        keep = {id(row) for row in keep_modes(rows, list(modes), str(self.data_files))}
        if not keep:
            raise ValueError(f"{self.data_files}: train.modes={list(modes)} keeps no state")
        return dataframe.select([i for i, row in enumerate(rows) if id(row) in keep])

    def maybe_filter_out_long_prompts(self, dataframe: Any = None) -> Any:
        """Keep ``train.modes``' rows, then refuse the dataset when a prompt is over
        ``data.max_prompt_tokens`` (verl's own filter would silently drop those rows; its agent
        loop would silently cut them)."""
        dataframe = self.keep_modes(dataframe)
        lengths = [self.prompt_length(row) for row in dataframe]
        over = [i for i, n in enumerate(lengths) if n > self.max_prompt_length]
        if over:
            worst = max(over, key=lengths.__getitem__)
            trajectory = (dataframe[worst].get("extra_info") or {}).get("trajectory_id")
            raise ValueError(
                f"{self.data_files}: {len(over)} of {len(lengths)} prompts are over "
                f"data.max_prompt_tokens={self.max_prompt_length} tokens (longest: row {worst}, "
                f"trajectory {trajectory}, {lengths[worst]} tokens); re-extract the dataset "
                "with this tokenizer and budget (history is left-truncated there)"
            )
        return dataframe

    def __getitem__(self, item: int) -> dict[str, Any]:
        row = super().__getitem__(item)
        if self.sample_n:
            row["__rollout_n__"] = self.sample_n
        return row
