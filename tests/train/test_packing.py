"""train.update layouts (CPU): padded, packed and packed_exact micro-batches, with full or fused
log-probs, give the loss and gradients of one-sample forwards, and token budgets group samples as
the forward's cost says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError
from train_helpers import instance_rows

from prour.config.train import PPOSettings, RolloutSettings, TrainConfig, UpdateSettings
from prour.llm.base import Completion
from prour.train.algorithm import policy_loss, token_entropy
from prour.train.layout import token_micro_batches
from prour.train.policy import Policy, Rollout

# Mixed lengths: (prompt, response) tokens of each sample; the longest is padded least.
LENGTHS = [(5, 7), (11, 3), (8, 12), (2, 1)]
TEMPERATURE = 0.8
# Every layout (padded, packed, packed_exact), each with full and fused log-probs (chunks of 5
# tokens, so a sample's response spans several chunks).
UPDATE_OPTIONS = [
    UpdateSettings(packing=packing, packing_mask=mask, log_probs=log_probs,
                   log_prob_chunk_tokens=5)
    for packing, mask in ((False, "position_ids"), (True, "position_ids"), (True, "documents"))
    for log_probs in ("full", "fused")
]


def _rollouts(vocab: int) -> list[Rollout]:
    gen = torch.Generator().manual_seed(3)
    out = []
    for state, (prompt, response) in enumerate(LENGTHS):
        ids = torch.randint(5, vocab, (prompt + response,), generator=gen).tolist()
        out.append(Rollout(state, ids[:prompt], ids[prompt:], Completion(text="", content="")))
    return out


def _one_sample_scores(model, rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropies of one sample's response from a forward of that sample alone."""
    seq = torch.tensor([rollout.prompt_ids + rollout.response_ids])
    logits = model(input_ids=seq, use_cache=False).logits[0].float() / TEMPERATURE
    start = len(rollout.prompt_ids)
    step = logits[start - 1 : seq.shape[1] - 1]
    targets = torch.tensor(rollout.response_ids)
    return torch.log_softmax(step, -1)[torch.arange(len(targets)), targets], token_entropy(step)


def _loss_and_grads(model, scores_fn) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = scores_fn()
    loss.backward()
    loss = loss.detach()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return float(loss), grads


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_and_padded_loss_and_grads_equal_one_sample_forwards(
    tiny_model_dir: Path, tiny_tokenizer, attn: str
) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attn_implementation=attn
    ).train()
    assert model.config._attn_implementation == attn
    policy = Policy(model, tiny_tokenizer, RolloutSettings(temperature=TEMPERATURE), 64, seed=0)
    rollouts = _rollouts(model.config.vocab_size)
    width = max(r for _, r in LENGTHS)
    gen = torch.Generator().manual_seed(4)
    old = -torch.rand(len(LENGTHS), width, generator=gen) * 6
    advantages = torch.randn(len(LENGTHS), 1, generator=gen).expand(-1, width).contiguous()
    n_tokens = sum(r for _, r in LENGTHS)
    settings = PPOSettings()

    def reference() -> torch.Tensor:  # gradient accumulation over one-sample micro-batches
        total = 0.0
        for row, rollout in enumerate(rollouts):
            lp, ent = _one_sample_scores(model, rollout)
            length = len(rollout.response_ids)
            loss, _ = policy_loss(old[row : row + 1, :length], lp[None],
                                  advantages[row : row + 1, :length], torch.ones(1, length),
                                  settings, entropy=ent[None], batch_num_tokens=n_tokens)
            total = total + loss
        return total

    def layout(update: UpdateSettings):
        def run() -> torch.Tensor:
            scores = policy.token_scores(rollouts, with_entropy=True, update=update)
            assert scores.mask.sum() == n_tokens
            loss, _ = policy_loss(old, scores.log_probs, advantages, scores.mask, settings,
                                  entropy=scores.entropy, batch_num_tokens=n_tokens)
            return loss
        return run

    want_loss, want_grads = _loss_and_grads(model, reference)
    for update in UPDATE_OPTIONS:
        loss, grads = _loss_and_grads(model, layout(update))
        assert loss == pytest.approx(want_loss, rel=1e-5, abs=1e-6), update
        assert grads.keys() == want_grads.keys()
        for name, grad in grads.items():
            torch.testing.assert_close(grad, want_grads[name], rtol=1e-4, atol=1e-6,
                                       msg=f"{name} ({update})")
    # Packing without restarting position ids would let samples attend to earlier ones: the
    # second sample's scores then differ, so the equality above is not vacuous.
    joined = Rollout(0, rollouts[0].prompt_ids + rollouts[0].response_ids + rollouts[1].prompt_ids,
                     rollouts[1].response_ids, rollouts[1].completion)
    with torch.no_grad():
        alone = _one_sample_scores(model, rollouts[1])[0]
        leaked = policy.token_scores([joined], update=UpdateSettings()).log_probs[0]
    assert not torch.allclose(alone, leaked, atol=1e-4)


@pytest.mark.parametrize(
    ("packed", "expected"),
    [
        # sums: 10+20 = 30 fits, +35 > 40; 35+5 = 40 fits, +30 > 40; 30+8 = 38
        (True, [[0, 1], [2, 3], [4, 5]]),
        # rows x longest: 2x20 = 40 fits, 3x35 > 40; 2x35 > 40; 2x30 > 40; 2x30 > 40
        (False, [[0, 1], [2], [3], [4], [5]]),
    ],
)
def test_token_micro_batches_follow_the_forward_cost(packed: bool, expected) -> None:
    lengths = [10, 20, 35, 5, 30, 8]
    assert token_micro_batches(lengths, 40, packed) == expected
    assert token_micro_batches([50, 3], 40, packed) == [[0], [1]]  # over budget: alone


def test_update_settings_pick_the_layout_and_the_scores(tiny_model_dir: Path, tiny_tokenizer,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """``token_scores`` runs the layout ``train.update`` names and, with ``log_probs: fused``,
    the chunked scores instead of the LM head's full logits."""
    from transformers import AutoModelForCausalLM

    from prour.core import fused_logprob
    from prour.train import layout

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    policy = Policy(model, tiny_tokenizer, RolloutSettings(temperature=TEMPERATURE), 64, seed=0)
    calls: list[str] = []

    def spy(name: str, function):
        def wrapped(*args, **kwargs):
            calls.append(name)
            return function(*args, **kwargs)
        return wrapped

    for name, function in list(layout.LAYOUTS.items()):
        monkeypatch.setitem(layout.LAYOUTS, name, spy(name, function))
    monkeypatch.setattr(fused_logprob, "fused_token_scores",
                        spy("fused", fused_logprob.fused_token_scores))
    monkeypatch.setattr("prour.train.policy.response_logits",
                        spy("full", layout.response_logits))
    rollouts = _rollouts(model.config.vocab_size)
    with torch.no_grad():
        for update in UPDATE_OPTIONS:
            calls.clear()
            policy.token_scores(rollouts, update=update)
            assert calls == [update.layout, update.log_probs], update
    assert [u.layout for u in UPDATE_OPTIONS[::2]] == ["padded", "packed", "packed_exact"]
    assert UpdateSettings().layout == "padded" and UpdateSettings().log_probs == "full"
    with pytest.raises(ValidationError, match=r"packing_mask.*packing: true"):
        UpdateSettings(packing_mask="documents")


def test_update_options_are_local_only() -> None:
    with pytest.raises(ValidationError, match=r"update\.packing.*local backend"):
        TrainConfig(backend="verl", update={"packing": True})
    with pytest.raises(ValidationError, match=r"update\.log_probs.*use_fused_kernels"):
        TrainConfig(backend="verl", update={"log_probs": "fused"})
    assert TrainConfig(backend="verl", update={"packing": False}).update.packing is False


def _trainer_update(model_dir: Path, out: Path, **update: Any) -> dict[str, torch.Tensor]:
    """How far the tiny policy's parameters move in one local-trainer update of two fixed mixed-length
    groups, with the given ``train.update`` options (lr large enough to move every weight)."""
    from prour.config import ModelConfig, Recipe
    from prour.train.local import Kept, LocalTrainer
    from prour.train.reward import VerifiableFormatReward

    recipe = Recipe(name="t", seed=3,
                    models={"generator": ModelConfig(backend="hf", path=str(model_dir))})
    train = TrainConfig.model_validate({
        "states_per_step": 2, "total_steps": 1, "output_dir": str(out), "device": "cpu",
        "dtype": "float32", "gradient_checkpointing": False,
        "rollout": {"n": 3, "keep": 2, "temperature": TEMPERATURE},
        "optim": {"lr": 1e-3, "warmup_steps": 0}, "ppo": {"epochs": 2, "micro_batch_size": 1},
        "update": update,
    })
    trainer = LocalTrainer(recipe, train, reward_fn=VerifiableFormatReward(),
                           make_state=lambda row: row, rows=instance_rows(2))
    trainer.setup()
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    rollouts = _rollouts(trainer.model.config.vocab_size)
    rewards = [1.0, 0.0, 0.2, 0.9]
    groups = [[Kept(rollouts[i], rewards[i], i // 2) for i in pair] for pair in ([0, 1], [2, 3])]
    summary = trainer._update(groups)
    assert summary["optimizer_steps"] == 4  # 2 epochs x 2 one-state mini-batches
    return {name: p.detach() - before[name] for name, p in trainer.model.named_parameters()}


def test_trainer_update_is_the_same_with_every_update_option(tiny_model_dir: Path,
                                                             tmp_path: Path) -> None:
    """Packed token-budget micro-batches with a document mask, fused log-probs and fused AdamW
    train to the weights of the default one-sample micro-batches with the for-loop AdamW: each tensor's update differs by under 0.1%
    of its size (Adam divides by the root of the squared gradients, so float-level gradient
    differences on near-zero gradients move single weights by a fraction of the learning rate;
    each option alone was measured at <= 2e-5 of lr 1e-3 x 4 steps)."""
    want = _trainer_update(tiny_model_dir, tmp_path / "default")
    got = _trainer_update(tiny_model_dir, tmp_path / "options", packing=True,
                          packing_mask="documents", log_probs="fused", log_prob_chunk_tokens=4,
                          micro_batch_tokens=40, fused_optimizer=True)
    assert got.keys() == want.keys()
    for name, delta in got.items():
        size = float(want[name].norm())
        assert size > 0, f"{name} did not move"
        assert float((delta - want[name]).norm()) < 1e-3 * size, name


def test_step_metrics_do_not_depend_on_the_micro_batch_split(tiny_model_dir: Path,
                                                             tmp_path: Path) -> None:
    """One mini-batch of both groups, one epoch, split into one-sample micro-batches: every
    forward runs before the only optimizer step, so the logged entropy is the token mean of the
    initial policy's entropies (one-sample forwards) and pg_loss, at ratio 1, is minus the
    token mean of the advantages (GRPO by hand: each pair's rewards differ, so +-1/sqrt(2))."""
    from prour.config import ModelConfig, Recipe
    from prour.train.local import Kept, LocalTrainer
    from prour.train.reward import VerifiableFormatReward

    recipe = Recipe(name="t", seed=3,
                    models={"generator": ModelConfig(backend="hf", path=str(tiny_model_dir))})
    train = TrainConfig.model_validate({
        "states_per_step": 2, "total_steps": 1, "output_dir": str(tmp_path / "out"),
        "device": "cpu", "dtype": "float32", "gradient_checkpointing": False,
        "rollout": {"n": 3, "keep": 2, "temperature": TEMPERATURE},
        "optim": {"lr": 1e-3, "warmup_steps": 0},
        "ppo": {"epochs": 1, "mini_batch_states": 2, "micro_batch_size": 1},
    })
    trainer = LocalTrainer(recipe, train, reward_fn=VerifiableFormatReward(),
                           make_state=lambda row: row, rows=instance_rows(2))
    trainer.setup()
    rollouts = _rollouts(trainer.model.config.vocab_size)
    with torch.no_grad():
        entropies = torch.cat([_one_sample_scores(trainer.model.eval(), r)[1] for r in rollouts])
    lengths = [r for _, r in LENGTHS]
    signs = [1, -1, -1, 1]  # rewards 1.0 > 0.0 and 0.2 < 0.9
    want_pg = -sum(s * 2 ** -0.5 * n for s, n in zip(signs, lengths)) / sum(lengths)
    rewards = [1.0, 0.0, 0.2, 0.9]
    groups = [[Kept(rollouts[i], rewards[i], i // 2) for i in pair] for pair in ([0, 1], [2, 3])]
    summary = trainer._update(groups)
    assert summary["optimizer_steps"] == 1
    assert summary["entropy"] == pytest.approx(float(entropies.mean()), rel=1e-4)
    assert summary["pg_loss"] == pytest.approx(want_pg, rel=1e-4)
