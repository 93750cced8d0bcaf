"""The ``train`` section: paper defaults, and batch arithmetic refused at load with the numbers."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from prour.config import ConfigError
from prour.config.data import DataConfig
from prour.config.train import TrainConfig
from prour.recipes import load_recipe
from prour.train.recipe import train_section

REPO = Path(__file__).resolve().parents[2]
PAPER = REPO / "recipes" / "paper.yaml"


def test_defaults_are_the_papers_numbers():
    cfg = TrainConfig()
    assert (cfg.states_per_step, cfg.rollout.n, cfg.rollout.keep) == (16, 8, 6)
    assert (cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.top_k) == (0.8, 1.0, None)
    assert cfg.rollout.enable_thinking and cfg.gradient_checkpointing
    assert (DataConfig().max_prompt_tokens, cfg.rollout.max_response_tokens) == (1400, 1760)
    assert (cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.weight_decay, cfg.optim.grad_clip) == (
        7e-7,
        60,
        0.01,
        1.0,
    )
    p = cfg.ppo
    assert (p.epochs, p.mini_batch_states, p.micro_batch_size) == (4, 1, 1)
    assert (p.clip_low, p.clip_high, p.clip_ratio_c, p.entropy_coeff) == (0.2, 0.3, 3.0, 0.01)
    assert (cfg.total_steps, cfg.save_every, p.drop_zero_variance) == (2010, 100, False)
    assert (cfg.verl.tensor_parallel_size, cfg.verl.gpu_memory_utilization) == (1, 0.2)
    assert cfg.verl.enable_chunked_prefill and not cfg.wandb.track and cfg.wandb.mode == "offline"


def test_paper_recipe_loads_with_its_train_section(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = load_recipe(PAPER)
    cfg = train_section(recipe)
    assert recipe.name == "paper" and cfg.backend == "verl"
    run_dir = tmp_path / "runs" / "paper"  # run_dir: runs/${name}, from the working directory
    assert (
        cfg.model_dump()
        == TrainConfig(
            backend="verl", wandb={"mode": "auto"}, output_dir=str(run_dir / "checkpoints"),
            train_file=str(run_dir / "data" / "dataset" / "train.parquet"),
            val_file=str(run_dir / "data" / "dataset" / "validation.parquet"),
        ).model_dump()
    )


@pytest.mark.parametrize(
    ("overrides", "key", "numbers"),
    [
        (["train.rollout.keep=10"], "train.rollout.keep", ["10", "8"]),
        (["train.rollout.keep=1"], "train.rollout.keep", ["1", "2"]),
        (["train.ppo.mini_batch_states=3"], "train.ppo.mini_batch_states", ["3", "16"]),
        (["train.ppo.mini_batch_states=32"], "train.ppo.mini_batch_states", ["32", "16"]),
        (
            ["train.backend=local", "train.ppo.micro_batch_size=4"],
            "train.ppo.micro_batch_size",
            ["4", "6"],
        ),
        (
            [
                "train.backend=local",
                "train.ppo.mini_batch_states=2",
                "train.ppo.micro_batch_size=5",
            ],
            "train.ppo.micro_batch_size",
            ["5", "12"],
        ),
        (["train.verl.n_gpus_per_node=4"], "train.rollout.keep", ["6", "4"]),
        (
            ["train.verl.n_gpus_per_node=3", "train.verl.tensor_parallel_size=2"],
            "train.verl.tensor_parallel_size",
            ["2", "3"],
        ),
        (
            ["train.ppo.micro_batch_size=2"],
            "train.ppo.micro_batch_size",
            ["2", "3"],
        ),  # 6 / 2 GPUs = 3
        (["train.rollout.temperature=0"], "train.rollout.temperature", ["0"]),
        (["train.ppo.clip_ratio_c=1.0"], "train.ppo.clip_ratio_c", []),
        (["train.rollout.n_samples=8"], "train.rollout.n_samples", []),
    ],
)
def test_bad_batch_arithmetic_is_refused_with_the_numbers(overrides, key, numbers):
    with pytest.raises(ConfigError) as info:
        load_recipe(PAPER, overrides)
    assert info.value.key == key
    message = str(info.value)
    for number in numbers:
        assert number in message, message


def test_unknown_section_key_names_the_dotted_path(tmp_path):
    data = yaml.safe_load(PAPER.read_text())
    data["train"]["ppo"]["clip_hgih"] = 0.3
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as info:
        load_recipe(path)
    assert info.value.key == "train.ppo.clip_hgih"
