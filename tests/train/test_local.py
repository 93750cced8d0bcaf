"""The local trainer on CPU with the tiny model: one step, selection, learning, data order."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from train_helpers import instance_rows

from prour.build import recipe_reward
from prour.config import ModelConfig, Recipe
from prour.config.train import TrainConfig
from prour.llm.base import Completion
from prour.rewards.reward import SampleReward
from prour.rollout.query import parse_query
from prour.train.data import DataOrder
from prour.train.local import LocalTrainer
from prour.train.metrics import CALL_KEYS, PHASE_KEYS, STEP_TIME_KEY
from prour.train.policy import Rollout
from prour.train.reward import RewardFn, VerifiableFormatReward

METRIC_KEYS = {
    "n_states",
    "n_sampled",
    "n_valid",
    "n_none",
    "n_invalid",
    "n_failed",
    "n_kept",
    "groups_used",
    "groups_dropped",
    "reward_mean",
    "reward_std",
    "reward_kept_mean",
    "prior_mean",
    "post_mean",
    "response_length_mean",
    "truncated_fraction",
    "pg_loss",
    "pg_clipfrac",
    "pg_clipfrac_lower",
    "ppo_kl",
    "entropy",
    "optimizer_steps",
    "skipped_steps",
    "grad_norm",
    "grad_norm_max",
    "lr",
    "rollout_tokens_per_s",
    "update_tokens_per_s",
    "time_rollout_s",
    "time_reward_s",
    "time_update_s",
    "time_step_s",
    "step",
    *PHASE_KEYS,
    *CALL_KEYS,
}


def _phases_add_up(logged: dict[str, Any]) -> None:
    """Every phase's seconds are there, none negative, and together they are the step's."""
    assert all(logged[k] >= 0 for k in PHASE_KEYS)
    assert sum(logged[k] for k in PHASE_KEYS) == pytest.approx(logged[STEP_TIME_KEY], rel=1e-9)


class StandInReward:
    """A deterministic reward with prior/posterior fields, so every metric has a value."""

    def __init__(self) -> None:
        self.updates = 0
        self.states: list[Any] = []

    def score_group(self, state: Any, completions: Sequence[Completion]) -> list[SampleReward]:
        self.states.append(state)
        out = []
        for c in completions:
            fraction = int(hashlib.sha256(c.text.encode()).hexdigest()[:6], 16) / 16**6
            out.append(
                SampleReward(
                    kind=parse_query(c.text).kind, prior=-5.0, post=-5.0 + fraction, reward=fraction
                )
            )
        return out

    def policy_updated(self) -> None:
        self.updates += 1


def _recipe(model_dir: Path, **sections: Any) -> Recipe:
    return Recipe(
        name="t", seed=3, models={"generator": ModelConfig(backend="hf", path=str(model_dir))},
        **sections,
    )


def _train(out: Path, **changes: Any) -> TrainConfig:
    base: dict[str, Any] = {
        "states_per_step": 2,
        "total_steps": 1,
        "save_every": 1,
        "output_dir": str(out),
        "device": "cpu",
        "dtype": "float32",
        "rollout": {"n": 4, "keep": 3, "max_response_tokens": 12},
        "optim": {"lr": 1e-3, "warmup_steps": 0, "weight_decay": 0.0},
        "ppo": {"epochs": 1},
    }
    for key, value in changes.items():
        base[key] = {**base[key], **value} if isinstance(value, dict) else value
    return TrainConfig.model_validate(base)


def _unchanged_after_one_step(trainer: LocalTrainer) -> list[str]:
    """Run and log one training step; the trainable parameters it left exactly as they were."""
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.metrics.log(trainer.step, trainer.train_step())
    return [
        name
        for name, p in trainer.model.named_parameters()
        if p.requires_grad and torch.equal(p.detach(), before[name])
    ]


def test_stand_in_reward_fits_the_protocol():
    assert isinstance(StandInReward(), RewardFn)
    assert isinstance(VerifiableFormatReward(), RewardFn)


def test_format_reward_rule():
    reward = VerifiableFormatReward()
    texts = [
        "YES [QUESTION]Which size?[/QUESTION]",
        "<think>hm</think>YES [QUESTION]Which one?[/QUESTION]",
        "NO",
        "yes [question]x[/question]",
        "YES [QUESTION][/QUESTION]",
        "Which size?",
    ]
    got = reward.score_group(None, [Completion(text=t, content=t) for t in texts])
    assert [s.reward for s in got] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert [s.kind for s in got] == ["ask", "ask", "none", "invalid", "invalid", "invalid"]


def test_one_step_changes_every_parameter_and_logs_all_metrics(tiny_model_dir, fresh_dir):
    reward = StandInReward()
    trainer = LocalTrainer(
        _recipe(tiny_model_dir),
        _train(fresh_dir, gradient_checkpointing=True),
        reward_fn=reward,
        make_state=lambda row: row["extra_info"]["task_id"],
        rows=instance_rows(4),
    )
    trainer.setup()
    assert _unchanged_after_one_step(trainer) == []
    logged = trainer.metrics.read()
    assert len(logged) == 1 and set(logged[0]) >= METRIC_KEYS
    assert [k for k in METRIC_KEYS if logged[0][k] is None] == []
    assert (
        logged[0]["n_sampled"] == 8 and logged[0]["n_kept"] == 6 and logged[0]["groups_used"] == 2
    )
    assert logged[0]["optimizer_steps"] == 2  # 1 epoch x 2 mini-batches of one state
    assert logged[0]["post_mean"] > logged[0]["prior_mean"]
    _phases_add_up(logged[0])  # a reward without a clock: no responder or scoring time, calls
    assert [logged[0][k] for k in CALL_KEYS if k != "generation_tokens"] == [0] * 6
    assert logged[0]["time_strict_user_s"] == logged[0]["time_prior_s"] == 0
    assert logged[0]["generation_tokens"] == 8 * logged[0]["response_length_mean"]
    assert reward.updates == 1 and len(reward.states) == 2  # the reward saw the states of this step
    assert trainer.model.is_gradient_checkpointing


def test_selection_drops_failed_samples_and_lone_survivors(tiny_model_dir, fresh_dir):
    trainer = LocalTrainer(_recipe(tiny_model_dir), _train(fresh_dir))

    def rollout(i: int) -> Rollout:
        return Rollout(0, [1, 2], [3, 4 + i], Completion(text=str(i), content=str(i)))

    rollouts = [[rollout(i) for i in range(4)], [rollout(i) for i in range(4)]]
    rewards = [
        [
            SampleReward(kind="ask", failed=True, reason="responder failed"),
            SampleReward(kind="invalid", reward=-1.0),
            SampleReward(kind="ask", reward=0.5),
            SampleReward(kind="none", reward=0.0),
        ],
        [
            SampleReward(kind="ask", failed=True),
            SampleReward(kind="ask", failed=True),
            SampleReward(kind="ask", failed=True),
            SampleReward(kind="none", reward=0.0),
        ],
    ]
    groups, stats = trainer._select(rollouts, rewards)
    assert [[k.rollout.response_ids[1] for k in g] for g in groups] == [
        [5, 6, 7]
    ]  # sample 0 failed
    assert [k.reward for k in groups[0]] == [-1.0, 0.5, 0.0]
    assert stats["n_kept"] == 4 and stats["groups_used"] == 1 and stats["groups_dropped"] == 1


def test_refuses_to_overwrite_a_run_without_resume(tiny_model_dir, fresh_dir):
    cfg = _train(fresh_dir)
    trainer = LocalTrainer(
        _recipe(tiny_model_dir),
        cfg,
        reward_fn=VerifiableFormatReward(),
        make_state=lambda row: row,
        rows=instance_rows(2),
    )
    trainer.run()
    again = LocalTrainer(
        _recipe(tiny_model_dir),
        cfg,
        reward_fn=VerifiableFormatReward(),
        make_state=lambda row: row,
        rows=instance_rows(2),
    )
    with pytest.raises(FileExistsError, match="--resume"):
        again.setup()


def test_prompt_over_the_budget_is_refused_naming_the_row(tiny_model_dir, fresh_dir):
    rows = instance_rows(3)
    rows[2]["prompt"] = [{"role": "user", "content": "word " * 400}]
    trainer = LocalTrainer(
        _recipe(tiny_model_dir, data={"max_prompt_tokens": 64}),
        _train(fresh_dir),
        reward_fn=VerifiableFormatReward(),
        make_state=lambda row: row,
        rows=rows,
    )
    with pytest.raises(ValueError, match=r"row 2: the prompt has \d+ tokens, over data.max_prompt_tokens=64"):
        trainer.setup()


def test_data_order_is_a_seeded_shuffle_per_epoch():
    order = DataOrder(n_rows=5, seed=11)
    first = [order.indices(step, 2) for step in range(5)]  # 10 positions = two epochs
    flat = [i for chunk in first for i in chunk]
    assert sorted(flat[:5]) == list(range(5)) and sorted(flat[5:]) == list(range(5))
    assert flat[:5] != flat[5:]  # a fresh shuffle each epoch
    assert DataOrder(5, 11).indices(3, 2) == first[3]  # a pure function of (seed, step)
    assert order.position(3, 2) == (1, 1)


@pytest.mark.slow
def test_learning_raises_the_format_reward(format_policy_dir, fresh_dir):
    """Same trainer, verifiable reward: the share of well-formed questions rises clearly."""
    cfg = _train(
        fresh_dir,
        states_per_step=4,
        total_steps=8,
        save_every=100,
        rollout={"n": 6, "keep": 5, "max_response_tokens": 20},
        optim={"lr": 2e-4, "warmup_steps": 0, "weight_decay": 0.0},
        ppo={"epochs": 2, "drop_zero_variance": True},
    )
    trainer = LocalTrainer(
        _recipe(format_policy_dir),
        cfg,
        reward_fn=VerifiableFormatReward(),
        make_state=lambda row: row,
        rows=instance_rows(8),
    )
    trainer.run()
    rewards = [m["reward_mean"] for m in trainer.metrics.read()]
    assert len(rewards) == 8
    start, end = sum(rewards[:2]) / 2, sum(rewards[-3:]) / 3
    assert start < 0.5, rewards  # the warm start answers well-formed about a fifth of the time
    assert end >= start + 0.3, rewards


def _tau2_rows() -> list[dict[str, Any]]:
    """One clarify and one verify state of retail task 0, in the data stage's row format.

    The history is the task's real opening: the customer's first message, the agent's
    `find_user_id_by_name_zip` call and tau2's own observation of it.
    """
    import json

    from prour.data.schema import state_id_of
    from prour.env import db_hash, execute_tool_call, get_task, make_env

    task = get_task("retail", "0")
    env = make_env("retail", task)
    ref = next(a for a in task.evaluation_criteria.actions if a.requestor == "assistant")
    observation, _ = execute_tool_call(env, ref.name, dict(ref.arguments))
    history = [
        {"role": "user", "content": "Hi, I need help with an order I received."},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c0", "type": "function",
         "function": {"name": ref.name, "arguments": json.dumps(ref.arguments)}}]},
        {"role": "tool", "tool_call_id": "c0", "name": ref.name, "content": observation},
    ]
    targets = {
        "clarify": "I want to exchange the items I received in my order.",
        "verify": json.dumps({"arguments": ref.arguments, "tool": ref.name}, sort_keys=True,
                             separators=(",", ":")),
    }
    rows = instance_rows(2)
    for row, mode in zip(rows, ("clarify", "verify")):
        row["reward_model"]["ground_truth"] = targets[mode]
        row["extra_info"].update(
            mode=mode, task_id="0", history=json.dumps(history),
            state_id=state_id_of(row["extra_info"]["trajectory_id"], 0, mode),
            env_history=json.dumps(history[1:]), db_hash=db_hash(env),
        )
    return rows


def _spy_on_responder_chats(llm: Any) -> list[tuple[str, int, int]]:
    """(role, requests, prompt + generated tokens) of every chat call ``llm`` gets (a failed
    call: no tokens), the role told by the request's system prompt (strict user's or not)."""
    from prour.rollout.strict_user import STRICT_USER_SYSTEM

    seen: list[tuple[str, int, int]] = []
    chat = llm.chat
    opening = STRICT_USER_SYSTEM[:40]

    def spied(requests: Any) -> Any:
        user = str(requests[0].messages[0]["content"]).startswith(opening)
        try:
            outputs = chat(requests)
        except Exception:
            seen.append(("strict_user" if user else "verifier", len(requests), 0))
            raise
        tokens = sum(c.prompt_tokens + c.completion_tokens for out in outputs for c in out)
        seen.append(("strict_user" if user else "verifier", len(requests), tokens))
        return outputs

    llm.chat = spied
    return seen


def test_one_step_with_the_information_gain_reward_on_tau2_states(format_policy_dir, fresh_dir):
    """The real reward (policy-scored prior/posterior, tiny strict user and verifier on tau2),
    with the attention term on (proxy cost): metrics keep IG and cost apart."""
    recipe = Recipe(
        name="t",
        seed=3,
        models={
            role: ModelConfig(backend="hf", path=str(format_policy_dir), device="cpu",
                              dtype="float32")
            for role in ("generator", "strict_user", "verifier")
        },
        reward={"responder_max_tokens": 16, "verifier_max_steps": 1,
                "attention": {"lambda": 0.1, "cost": "proxy"}},
    )
    # the tiny verifier's 4096 positions hold no verify prompt of this state (~5k tokens): its
    # questions fail, which the step would stop on (train.max_failed_ask_fraction); this test
    # reads the step's metrics, so it lets them fail
    cfg = _train(fresh_dir, rollout={"n": 6, "keep": 5, "max_response_tokens": 24},
                 max_failed_ask_fraction=1.0)
    trainer = LocalTrainer(recipe, cfg, rows=_tau2_rows(),
                           reward_factory=recipe_reward(recipe))
    trainer.setup()
    seen = _spy_on_responder_chats(trainer._reward_fn.strict_user.llm)
    assert _unchanged_after_one_step(trainer) == []
    logged = trainer.metrics.read()[0]
    # the per-phase times and counts, against what the responder backends were asked
    _phases_add_up(logged)
    for role in ("strict_user", "verifier"):
        assert logged[f"{role}_calls"] == sum(n for r, n, _ in seen if r == role), role
        assert logged[f"{role}_tokens"] == sum(t for r, _, t in seen if r == role), role
        assert (logged[f"time_{role}_s"] > 0) == (logged[f"{role}_calls"] > 0), role
    assert logged["strict_user_calls"] + logged["verifier_calls"] > 0
    assert logged["prior_requests"] >= 1 and logged["time_prior_s"] > 0
    assert logged["posterior_requests"] >= 1 and logged["time_posterior_s"] > 0
    assert logged["time_generation_s"] == logged["time_rollout_s"] > 0
    assert set(logged) >= METRIC_KEYS
    assert logged["n_sampled"] == 12
    assert logged["n_valid"] > 0, "the warm-started policy asked no well-formed question"
    # information gain, not a stand-in: asked samples carry a prior and a posterior
    assert logged["prior_mean"] is not None and logged["post_mean"] is not None
    assert logged["prior_mean"] < 0 and logged["post_mean"] < 0
    assert logged["ig_mean"] is not None
    assert trainer._reward_fn.question_cost is not None  # the recipe's attention term is on
    cost = logged["attention_cost_mean"]  # None when no clarify question was answered this step
    assert cost is None or cost >= 1.0  # a question asks at least one thing


class _Down:
    """An OpenAI-style server that answers every request with HTTP 500 (a responder that is
    down), on a free loopback port, in a thread."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(500)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_responders_that_are_down_stop_the_step_before_its_update(format_policy_dir, fresh_dir):
    """The strict user and the verifier answer 500 to every request: each question fails after
    its retries, more than train.max_failed_ask_fraction of the step's questions fail, and the
    step raises (naming the share, the states and the responder keys) before any update; the
    weights are those it started with. The verl sampler applies the same check
    (tests/train/verl/test_verl_harness.py)."""
    from prour.train.metrics import FailedAsksError

    down = _Down()
    try:
        served = ModelConfig(backend="openai", model="m", base_url=down.url, max_retries=1,
                             timeout_s=5.0)
        recipe = Recipe(
            name="t", seed=3,
            models={"generator": ModelConfig(backend="hf", path=str(format_policy_dir),
                                             device="cpu", dtype="float32"),
                    "strict_user": served, "verifier": served},
            reward={"responder_max_tokens": 16, "verifier_max_steps": 1, "responder_retries": 0},
        )
        cfg = _train(fresh_dir, rollout={"n": 6, "keep": 5, "max_response_tokens": 24})
        trainer = LocalTrainer(recipe, cfg, rows=_tau2_rows(),
                               reward_factory=recipe_reward(recipe))
        trainer.setup()
        before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
        with pytest.raises(FailedAsksError, match=r"^(\d+) of \1 sampled questions failed "
                           r"\(responder or scoring errors\) over 2 states, more than "
                           r"train\.max_failed_ask_fraction=0\.5; .*models\.strict_user"):
            trainer.train_step()
    finally:
        down.close()
    assert all(torch.equal(p.detach(), before[name])
               for name, p in trainer.model.named_parameters())
    assert trainer.step == 0


def test_an_empty_train_file_saves_the_initial_policy_untrained(tiny_model_dir, fresh_dir):
    """Extract routed no state to clarify or verify: nothing to learn from. The final step is
    saved with the initial weights, its trainer state says why, export and eval can load it."""
    from prour.train.checkpoint import complete_checkpoints, load_trainer_state

    trainer = LocalTrainer(_recipe(tiny_model_dir), _train(fresh_dir, total_steps=3), rows=[])
    last = trainer.run()
    assert trainer.untrained and last == fresh_dir / "step_3"
    assert [step for step, _ in complete_checkpoints(fresh_dir)] == [3]
    assert "holds no training state" in load_trainer_state(last)["untrained"]
    saved = _weights(last)
    assert saved and saved == _weights(tiny_model_dir)  # not one parameter moved


def _weights(folder: Path) -> dict[str, str]:
    from safetensors.torch import load_file

    tensors = load_file(next(Path(folder).glob("*.safetensors")))
    return {name: hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()
            for name, t in tensors.items()}


def test_overlapping_phases_share_their_seconds():
    """Side-by-side responder calls: each stretch goes in equal parts to the phases running in it,
    a phase's own overlapping calls count once, and the whole never exceeds the time that passed."""
    from prour.train.metrics import PhaseClock, phase_metrics

    clock = PhaseClock()
    for phase, start, end in [("strict_user", 0, 4), ("strict_user", 1, 3), ("verifier", 2, 6),
                              ("prior", 7, 8)]:
        clock.add_interval(phase, start, end)
    clock.count("strict_user_calls", 2)
    seconds, counts = clock.take()
    # 0-2 strict user alone, 2-4 shared with the verifier, 4-6 verifier alone, 7-8 prior
    assert seconds == {"strict_user": 3.0, "verifier": 3.0, "prior": 1.0}
    metrics = phase_metrics(seconds, counts, 10.0)
    assert metrics["time_waiting_s"] == 3.0 and metrics["strict_user_calls"] == 2
    assert sum(metrics[k] for k in PHASE_KEYS) == metrics[STEP_TIME_KEY] == 10.0
    assert clock.take() == ({}, {})  # taken: the next step starts at zero
    with pytest.raises(ValueError, match="more than the step"):
        phase_metrics(seconds, counts, 5.0)
    with pytest.raises(ValueError, match="unknown phase 'gen'"):
        clock.add_interval("gen", 0, 1)
