"""Helpers of the training tests: instance rows, a paper-like verl recipe, and a warm start that
makes the format likely."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prour.config import Recipe
    from prour.config.train import TrainConfig

GOOD = (
    "YES [QUESTION]Which size do you want?[/QUESTION]",
    "YES [QUESTION]Which order is it?[/QUESTION]",
)
BAD = (
    "YES Which size?",
    "yes [question]Which order is it?[/question]",
    "Maybe later.",
    "YES [QUESTION][/QUESTION]",
    "Which size do you want?",
)
PROMPT = "Ask me one question."


def paper_like(tmp_path: Path, model_dir: Path, **train: Any) -> tuple[Recipe, TrainConfig]:
    """A paper-named recipe with ``model_dir`` as generator and a verl ``TrainConfig`` (``train``
    holds extra ``train.*`` values)."""
    from prour.config import ModelConfig, Recipe
    from prour.config.train import TrainConfig

    recipe = Recipe(
        name="paper",
        seed=7,
        run_dir=str(tmp_path / "run"),
        models={"generator": ModelConfig(backend="hf", path=str(model_dir))},
    )
    cfg = TrainConfig.model_validate(
        {"backend": "verl", "output_dir": str(tmp_path / "ckpt"), **train}
    )
    return recipe, cfg


@functools.cache
def initial_hash(task_id: str) -> str:
    """DB hash of a retail task before any tool call."""
    from prour.data.schema import tool_traffic_hash

    return tool_traffic_hash("retail", task_id, [])


def instance_rows(n: int, prompt: str = PROMPT) -> list[dict[str, Any]]:
    """Dataset rows (the data stage's schema) with a short prompt, so tiny-model steps stay fast."""
    from prour.data.schema import Instance

    history = [{"role": "user", "content": "hi"}]
    return [
        Instance(
            mode="clarify", domain="retail", task_id=str(i), trajectory_id=f"retail/{i}/s0/t",
            step=0, history=history, prompt=[{"role": "user", "content": prompt}],
            target=f"I want to return order #W{1000 + i}.", au=0.4, eu=0.1, total=0.5,
            truncated=False, dropped_messages=0, prompt_tokens=16, target_tokens=8,
            decomposer_calls=3, prompts_version="test", env_history=[],
            db_hash=initial_hash(str(i)),
        ).to_row(i)
        for i in range(n)
    ]


def warm_start(
    model_dir: Path,
    out_dir: Path,
    good_share: int = 2,
    bad_share: int = 8,
    steps: int = 30,
    seed: int = 0,
    lr: float = 5e-3,
) -> Path:
    """The demo's warm start (:func:`prour.demo.warmstart.fine_tune`) on one prompt answered by a
    mix of well-formed and broken outputs (about good_share : bad_share), all in every step, so
    the tiny model emits the format some of the time; RL then has something to reinforce."""
    from tiny_finetune import learned_by_heart

    from prour.demo.corpus import SFTExample

    targets = [GOOD[i % len(GOOD)] for i in range(good_share)] + [
        BAD[i % len(BAD)] for i in range(bad_share)
    ]
    examples = [
        SFTExample(
            "format",
            [{"role": "user", "content": PROMPT}],
            {"role": "assistant", "content": target},
            enable_thinking=True,
        )
        for target in targets
    ]
    return learned_by_heart(Path(model_dir), out_dir, examples, steps, max_tokens=256, lr=lr,
                            seed=seed)


def random_batch(seed: int, bs: int = 5, T: int = 7) -> tuple:
    """Old and new log-probs, advantages, a response mask and entropies, (bs, T) each: ratios
    spread well past the clip range, every row with at least one response token."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(bs, T, generator=gen) * 3
    new = old + torch.randn(bs, T, generator=gen) * 0.6
    adv = torch.randn(bs, T, generator=gen) * 2
    mask = (torch.rand(bs, T, generator=gen) > 0.25).float()
    mask[:, 0] = 1
    entropy = torch.rand(bs, T, generator=gen) * 4
    return old, new, adv, mask, entropy
