"""train.overlap one_step on the local trainer: step k+1 is sampled while step k updates, and no
update uses samples more than train.max_staleness updates old."""

from __future__ import annotations

from pathlib import Path

import pytest
from train_helpers import instance_rows
from transformers import AutoModelForCausalLM, AutoTokenizer

from prour.config import ModelConfig, Recipe
from prour.train.config import TrainConfig
from prour.train.local import LocalTrainer
from prour.train.policy import Policy
from prour.train.reward import VerifiableFormatReward


class Recording(VerifiableFormatReward):
    """The format reward, keeping each scored group's texts by state."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, list[str]]] = []

    def score_group(self, state, completions):
        self.seen.append((state, [c.text for c in completions]))
        return super().score_group(state, completions)


def _train(out: Path, **changes) -> TrainConfig:
    return TrainConfig.model_validate({
        "states_per_step": 2, "total_steps": 4, "save_every": 1, "output_dir": str(out),
        "device": "cpu", "dtype": "float32",
        "rollout": {"n": 2, "keep": 2, "max_response_tokens": 8},
        "optim": {"lr": 1e-2, "warmup_steps": 0, "weight_decay": 0.0}, "ppo": {"epochs": 1},
        **changes,
    })


def _texts(trainer: LocalTrainer, weights: Path, step: int) -> list[list[str]]:
    """What the policy with ``weights`` samples for ``step``'s states (the step's seeds)."""
    model = AutoModelForCausalLM.from_pretrained(str(weights)).eval()
    policy = Policy(model, AutoTokenizer.from_pretrained(str(weights)), trainer.cfg.rollout,
                    trainer.recipe.data.max_prompt_tokens, seed=trainer.recipe.seed)
    rows = [trainer._rows[i] for i in trainer.order.indices(step, trainer.cfg.states_per_step)]
    return [[r.completion.text for r in g] for g in trainer._rollout(rows, step, policy)]


def test_one_step_overlap_uses_samples_at_most_max_staleness_old(tiny_model_dir, fresh_dir):
    recipe = Recipe(name="t", seed=3,
                    models={"generator": ModelConfig(backend="hf", path=str(tiny_model_dir))})
    reward = Recording()
    trainer = LocalTrainer(recipe, _train(fresh_dir, overlap="one_step", max_staleness=2),
                           reward_fn=reward, make_state=lambda row: row["extra_info"]["task_id"],
                           rows=instance_rows(4))
    trainer.run(progress=False)
    logged = trainer.metrics.read()
    # re-synced when the next samples would be 3 updates old: versions 0, 0, 0, 2
    assert [m["sample_policy_version"] for m in logged] == [0, 0, 0, 2]
    assert [m["sample_staleness"] for m in logged] == [0, 1, 2, 1]
    assert max(m["sample_staleness"] for m in logged) <= trainer.cfg.max_staleness
    scored = [texts for _, texts in reward.seen]  # 2 states a step, in step order
    # the samples step 2 updated on are the initial policy's, step 3's those of checkpoint 2
    assert scored[4:6] == _texts(trainer, Path(tiny_model_dir), 2)
    assert scored[6:8] == _texts(trainer, fresh_dir / "step_2", 3)
    assert all(m["optimizer_steps"] == 2 for m in logged)
    # and they differ from what the updated policy samples: the updates did move it
    assert scored[4:6] != _texts(trainer, fresh_dir / "step_2", 2)


def test_verl_overlap_is_refused_only_with_dropped_groups_refill(fresh_dir):
    """verl runs one_step (its asynchronous trainer); our refill of dropped groups does not."""
    assert _train(fresh_dir, backend="verl", overlap="one_step").overlap == "one_step"
    assert _train(fresh_dir, overlap=False).overlap == "off"  # YAML's bare `overlap: off`
    with pytest.raises(ValueError, match="overlap: 'one_step' on the verl backend does not run "
                       "with train.ppo.drop_zero_variance"):
        _train(fresh_dir, backend="verl", overlap="one_step", ppo={"drop_zero_variance": True})
