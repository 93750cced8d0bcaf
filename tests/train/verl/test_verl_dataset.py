"""verl's dataset of our instances: prompts over the budget are refused before any rollout."""

from __future__ import annotations

from pathlib import Path

import pytest


def _dataset(
    tiny_model_dir: Path, tmp_path: Path, rows: list[dict], limit: int, role: str = "train"
):
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from prour.data.dataset import write_rows
    from prour.train.verl_ext.dataset import ProurRLDataset

    path = write_rows(rows, tmp_path / f"rows_{limit}.parquet")
    other = str(tmp_path / "other.parquet")
    train, val = (str(path), other) if role == "train" else (other, str(path))
    config = OmegaConf.create(
        {
            "train_files": train,
            "val_files": val,
            "max_prompt_length": limit,
            "filter_overlong_prompts": False,
            "apply_chat_template_kwargs": {"enable_thinking": True},
            "prour_sample_n": 8,
            "cache_dir": str(tmp_path / "cache"),
        }
    )
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    return lambda: ProurRLDataset(str(path), tokenizer, config), tokenizer


def test_prompts_over_max_prompt_tokens_are_refused(tiny_model_dir, tmp_path):
    from train_helpers import instance_rows

    rows = instance_rows(3)
    rows[1]["prompt"][0]["content"] = "a much longer prompt " * 40
    _, tokenizer = _dataset(tiny_model_dir, tmp_path, rows, 10**6)
    lengths = [
        len(
            tokenizer.apply_chat_template(
                r["prompt"],
                add_generation_prompt=True,
                tokenize=True,
                enable_thinking=True,
                return_dict=False,
            )
        )
        for r in rows
    ]
    assert lengths[1] > lengths[0] == lengths[2]

    load, _ = _dataset(tiny_model_dir, tmp_path, rows, lengths[1])  # exactly at the budget
    dataset = load()
    assert len(dataset) == 3 and dataset[0]["__rollout_n__"] == 8
    assert [dataset.prompt_length(dataset.dataframe[i]) for i in range(3)] == lengths

    load, _ = _dataset(tiny_model_dir, tmp_path, rows, lengths[1] - 1)
    with pytest.raises(
        ValueError,
        match=(
            rf"1 of 3 prompts are over data\.max_prompt_tokens={lengths[1] - 1} tokens "
            rf"\(longest: row 1, trajectory retail/1/s0/t, {lengths[1]} tokens\)"
        ),
    ):
        load()


def test_only_the_training_files_ask_for_n_samples(tiny_model_dir, tmp_path):
    """Validation rows carry no ``__rollout_n__``: verl would read it before ``val_kwargs.n``
    and decode 8 identical greedy samples per prompt."""
    from train_helpers import instance_rows

    rows = instance_rows(2)
    train, _ = _dataset(tiny_model_dir, tmp_path, rows, 10**6, role="train")
    val, _ = _dataset(tiny_model_dir, tmp_path, rows, 10**6, role="validation")
    assert train()[0]["__rollout_n__"] == 8
    assert "__rollout_n__" not in val()[0]
