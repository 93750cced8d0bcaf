"""train.overlap one_step on the local trainer: step k+1 is sampled while step k updates, and no
update uses samples more than train.max_staleness updates old."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from train_helpers import instance_rows
from transformers import AutoModelForCausalLM, AutoTokenizer

from prour.build import recipe_reward
from prour.config import ModelConfig, Recipe
from prour.config.train import TrainConfig
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


def test_a_sampler_resync_scores_priors_with_the_new_weights_not_the_cached_ones(
        tiny_model_dir, fresh_dir):
    """train.overlap one_step with the recipe's information-gain reward: the sampler's reward
    caches each state's prior; after an update and a re-sync of the sampler, the prior it gives
    is the one a fresh reward scores with the updated weights, not the one cached before."""
    import copy

    from test_local import _tau2_rows

    model = ModelConfig(backend="hf", path=str(tiny_model_dir), device="cpu", dtype="float32")
    recipe = Recipe(name="t", seed=3,
                    models={r: model for r in ("generator", "strict_user", "verifier")},
                    reward={"responder_max_tokens": 8, "verifier_max_steps": 1})
    trainer = LocalTrainer(recipe, _train(fresh_dir, overlap="one_step", max_staleness=1),
                           rows=_tau2_rows(), reward_factory=recipe_reward(recipe))
    trainer.setup()
    sampler_reward = trainer._sampler_reward
    assert sampler_reward is not trainer._reward_fn  # the sampler scores with its own weights
    states = [trainer._make_state(row) for row in trainer._rows]
    before = [sampler_reward.prior(s).sum for s in states]  # cached, version 0
    torch.manual_seed(0)
    with torch.no_grad():  # an update: the live policy's weights move, the sampler's do not
        for p in trainer.model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    trainer.step += 1
    trainer._sync_sampler()
    after = [sampler_reward.prior(s).sum for s in states]
    fresh_policy = Policy(copy.deepcopy(trainer.model).eval(), trainer.tokenizer,
                          trainer.cfg.rollout, recipe.data.max_prompt_tokens, seed=recipe.seed)
    fresh = [trainer._reward_for(fresh_policy.llm).prior(s).sum for s in states]
    assert after == pytest.approx(fresh, abs=1e-4)
    assert all(abs(a - b) > 1e-2 for a, b in zip(after, before)), (before, after)
