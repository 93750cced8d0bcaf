"""The verl backend on CPU: Hydra overrides pass verl's own validation; extension logic; export."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from train_helpers import paper_like

from prour.config.train import TrainConfig
from prour.llm.base import ChatRequest, SamplingParams, ScoreRequest
from prour.train.verl_backend import (
    check_verl_config,
    compose_verl_config,
    export_checkpoint,
    hydra_value,
    prepare_verl_run,
)
from prour.train.verl_ext.logic import (
    RolloutServerLLM,
    SampleInfo,
    flat_groups,
    kept_keys,
    reward_extra_info,
    sample_info,
    step_metrics,
    target_logprobs,
    verl_phase_metrics,
)


def _as_dict(overrides: list[str]) -> dict[str, str]:
    return dict(item.lstrip("+").split("=", 1) for item in overrides)


def test_overrides_carry_the_paper_numbers(tmp_path, tiny_model_dir):
    recipe, cfg = paper_like(tmp_path, tiny_model_dir)
    run = prepare_verl_run(recipe, cfg)
    o = _as_dict(run.overrides)
    expected = {
        "algorithm.adv_estimator": "grpo",
        "data.train_batch_size": "16",
        "data.prour_sample_n": "8",  # sampled per state ...
        "actor_rollout_ref.rollout.n": "6",  # ... and kept for the update
        "actor_rollout_ref.rollout.temperature": "0.8",
        "actor_rollout_ref.rollout.top_p": "1.0",
        "actor_rollout_ref.rollout.top_k": "-1",
        "actor_rollout_ref.rollout.prompt_length": "1400",
        "actor_rollout_ref.rollout.response_length": "1760",
        "actor_rollout_ref.rollout.gpu_memory_utilization": "0.2",
        "actor_rollout_ref.rollout.enable_chunked_prefill": "true",
        "actor_rollout_ref.rollout.tensor_model_parallel_size": "1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "1",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "1",
        "actor_rollout_ref.actor.ppo_mini_batch_size": "1",
        "actor_rollout_ref.actor.ppo_epochs": "4",
        "actor_rollout_ref.actor.optim.lr": "7e-07",
        "actor_rollout_ref.actor.optim.lr_warmup_steps": "60",
        "actor_rollout_ref.actor.optim.weight_decay": "0.01",
        "actor_rollout_ref.actor.optim.clip_grad": "1.0",
        "actor_rollout_ref.actor.clip_ratio_low": "0.2",
        "actor_rollout_ref.actor.clip_ratio_high": "0.3",
        "actor_rollout_ref.actor.clip_ratio_c": "3.0",
        "actor_rollout_ref.actor.entropy_coeff": "0.01",
        "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
        "actor_rollout_ref.actor.use_kl_loss": "false",
        "algorithm.use_kl_in_reward": "false",
        "actor_rollout_ref.model.enable_gradient_checkpointing": "true",
        "trainer.total_training_steps": "2010",
        "trainer.save_freq": "100",
        "trainer.n_gpus_per_node": "2",
        "trainer.v1.sampler.custom_sampler.name": "KeepValidFirstReplayBuffer",
        "trainer.v1.sampler.sampler_kwargs.keep": "6",
        "trainer.v1.trainer_mode": "prour_state_ordered",
        "ray_kwargs.ray_init.runtime_env.worker_process_setup_hook": (
            "prour.train.verl_ext.trainer.register"
        ),
    }
    assert {k: o.get(k) for k in expected} == expected
    loops = (run.agent_loops_file).read_text()
    assert (
        "prour.train.verl_ext.agent_loop.QueryAgentLoop" in loops and str(run.recipe_file) in loops
    )
    # the workers make the responders with the builder the entry names (train never imports it)
    import yaml

    from prour.build import Builder
    from prour.registry import load_target

    [entry] = yaml.safe_load(loops)
    assert load_target(entry["builder"]) is Builder
    assert "verl.trainer.main_ppo" in run.shell()
    # the workers read the run's one resolved recipe, the provenance beside it; no second copy
    assert run.recipe_file == run.output_dir / "recipe.resolved.yaml"
    assert (run.output_dir / "provenance.json").is_file()
    assert [p.name for p in (run.output_dir / "verl").iterdir()] == ["agent_loops.yaml"]
    from prour.recipes import load_recipe

    worker = load_recipe(run.recipe_file)
    assert (worker.name, worker.seed, worker.models) == ("paper", 7, recipe.models)
    assert worker.train.output_dir == str(tmp_path / "ckpt")
    data = tmp_path / "run" / "data" / "dataset"  # train.train_file is relative to run_dir
    assert worker.train.train_file == str(data / "train.parquet") == o["data.train_files"]
    assert worker.train.model_dump(exclude={"train_file", "val_file"}) == cfg.model_dump(
        exclude={"train_file", "val_file", "output_dir"}) | {"output_dir": str(tmp_path / "ckpt")}


def test_composed_config_passes_verls_validation(tmp_path, tiny_model_dir):
    recipe, cfg = paper_like(tmp_path, tiny_model_dir)
    config = compose_verl_config(prepare_verl_run(recipe, cfg).overrides)
    check_verl_config(
        config
    )  # validate_config + verl's typed config classes (reads the tiny model)
    actor = config.actor_rollout_ref.actor
    assert actor.clip_ratio_c == 3.0 and actor.optim.clip_grad == 1.0
    assert (
        config.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu
        == actor.ppo_micro_batch_size_per_gpu
    )
    assert config.trainer.v1.sampler.custom_sampler.path == "pkg://prour.train.verl_ext.sampler"

    broken = compose_verl_config(
        prepare_verl_run(recipe, cfg).overrides
        + ["data.train_batch_size=1", "actor_rollout_ref.actor.ppo_mini_batch_size=2"]
    )
    with pytest.raises(ValueError, match="train_batch_size"):
        check_verl_config(broken)


def test_hydra_values():
    assert (
        hydra_value(True) == "true" and hydra_value(None) == "null" and hydra_value(7e-7) == "7e-07"
    )
    assert hydra_value([0.9, 0.999]) == "[0.9,0.999]"
    assert hydra_value("pkg://a.b") == "pkg://a.b"
    assert hydra_value("a b,c") == "'a b,c'"


def test_export_command(tmp_path):
    (tmp_path / "global_step_100" / "actor").mkdir(parents=True)
    (tmp_path / "global_step_200" / "actor").mkdir(parents=True)
    command, target = export_checkpoint(tmp_path, dry_run=True)
    assert command[1:5] == ["-m", "verl.model_merger", "merge", "--backend"]
    assert command[command.index("--local_dir") + 1] == str(tmp_path / "global_step_200" / "actor")
    assert target == tmp_path / "step_200"
    with pytest.raises(FileNotFoundError, match="global_step_5"):
        export_checkpoint(tmp_path, step=5, dry_run=True)


# ---- sampler logic ---------------------------------------------------------------------------


def _info(kind: str, reward: float | None = 0.0, failed: bool = False) -> SampleInfo:
    return SampleInfo(kind, failed or reward is None, reward)


def test_kept_keys_follow_the_selection_rule():
    # Keys arrive in storage order, not sampling order; uid "b" keeps one sample only: dropped.
    keys = ["a_3_0", "a_0_0", "b_0_0", "a_1_0", "a_2_0", "b_1_0", "b_2_0"]
    infos = [
        _info("ask", 1.0),
        _info("invalid", -1.0),
        _info("ask", reward=None),
        _info("none"),
        _info("ask", 0.5),
        _info("none"),
        _info("invalid", reward=None),
    ]
    kept, dropped = kept_keys(keys, infos, keep=3)
    assert kept == ["a_3_0", "a_0_0", "a_2_0"]  # both questions, then the earliest other sample
    assert dropped == ["b_0_0", "a_1_0", "b_1_0", "b_2_0"]


def test_flat_groups_look_at_the_kept_samples_only():
    keys = ["a_0_0", "a_1_0", "a_2_0", "b_0_0", "b_1_0", "b_2_0"]
    infos = [
        _info("ask", 0.7),
        _info("ask", 0.7),
        _info("none", 0.0),  # kept: the two asks, equal
        _info("ask", 0.7),
        _info("none", 0.0),
        _info("none", 0.0),
    ]
    assert flat_groups(keys, infos, keep=2) == {"a": 0.7}


def test_sample_info_reads_verl_extra_fields():
    @dataclass
    class Wrapped:
        data: dict = field(default_factory=dict)

    class Sample:
        kind, failed, reward, prior, post = "ask", False, 0.15, -3.0, -2.75
        ig, attention_cost = 0.25, 1.0  # R = IG − λ·cost with λ = 0.1

    fields = {"reward_extra_info": reward_extra_info(Sample(), "clarify")}
    expected = SampleInfo("ask", False, 0.15, "clarify", -3.0, -2.75, 0.25, 1.0)
    assert sample_info(fields) == expected
    assert sample_info(Wrapped(fields)) == expected
    assert sample_info({}) == SampleInfo("invalid", True, None)  # no reward info: never kept


def test_verl_phase_times_join_the_sessions_and_verls_timers():
    """Sessions' intervals (absolute seconds) cut to the step, shared where they overlap; the
    update is verl's training-side timers; waiting the rest; counts summed over sessions."""
    one = reward_extra_info(SampleInfo("ask", False, 0.1), "clarify",
                            [("generation", 99.0, 102.0), ("strict_user", 102.0, 104.0)],
                            {"generation_tokens": 7, "strict_user_calls": 1})
    two = reward_extra_info(SampleInfo("ask", False, 0.1), "clarify",
                            [("generation", 101.0, 103.0), ("posterior", 104.0, 105.0)],
                            {"generation_tokens": 5, "posterior_requests": 1})
    # verl's validation averages reward_extra_info's entries per key (strings skipped): it takes ours
    from verl.trainer.ppo.metric_utils import process_validation_metrics

    validated = process_validation_metrics(["d", "d"], ["u", "u"], {k: [one[k], two[k]] for k in one})
    assert "phases" not in validated["d"] and "ig_reward" in validated["d"]  # (lists: TypeError)
    infos = [sample_info({"reward_extra_info": info}) for info in (one, two)]
    assert infos[0].phases[0] == ("generation", 99.0, 102.0) and infos[1].calls["generation_tokens"] == 5
    timers = {"step": 10.0, "gen": 5.5, "update_actor": 3.0, "adv": 0.5, "save_checkpoint": 0.2}
    got = verl_phase_metrics(infos, timers, step_started=100.0, prefix="p")
    # from 100: generation alone 100-102 (one session's before-step second cut), 102-103
    # generation and strict user, 103-104 strict user, 104-105 posterior
    assert got["p/time_generation_s"] == pytest.approx(2.5)
    assert got["p/time_strict_user_s"] == pytest.approx(1.5)
    assert got["p/time_posterior_s"] == pytest.approx(1.0)
    assert got["p/time_update_s"] == pytest.approx(3.5)
    assert got["p/time_waiting_s"] == pytest.approx(10.0 - 2.5 - 1.5 - 1.0 - 3.5)
    assert got["p/time_step_s"] == 10.0 and got["p/time_prior_s"] == 0.0
    assert got["p/generation_tokens"] == 12 and got["p/strict_user_calls"] == 1
    # sessions and update over the step (another node's clock): sessions scaled to fit
    tight = verl_phase_metrics(infos, {"step": 5.0, "update_actor": 3.0}, 100.0, prefix="p")
    assert tight["p/time_update_s"] == 3.0 and tight["p/time_waiting_s"] == pytest.approx(0.0)
    assert tight["p/time_generation_s"] == pytest.approx(2.5 * 2.0 / 5.0)  # 2 s room of 5 s


def test_step_metrics_keep_information_gain_and_attention_cost_apart():
    """With the attention term on, verl's step metrics show R, IG and the cost separately."""
    infos = [
        SampleInfo("ask", False, 0.15, "clarify", -3.0, -2.75, ig=0.25, attention_cost=1.0),
        SampleInfo("ask", False, 0.3, "clarify", -3.0, -2.5, ig=0.5, attention_cost=2.0),
        SampleInfo("ask", False, 0.4, "verify", -2.0, -1.6, ig=0.4),  # verify: no user, no cost
        SampleInfo("none", False, 0.0),
    ]
    metrics = step_metrics(infos, prefix="p")
    assert metrics["p/reward_mean_clarify"] == pytest.approx((0.15 + 0.3) / 2)
    assert metrics["p/reward_mean_verify"] == pytest.approx(0.4)
    assert metrics["p/ig_mean"] == pytest.approx((0.25 + 0.5 + 0.4) / 3)
    assert metrics["p/attention_cost_mean"] == pytest.approx(1.5)
    assert metrics["p/ask_fraction"] == 0.75


def test_states_split_rank_major_into_equal_shares():
    from prour.train.verl_ext.logic import rank_major_order, states_in_prompt_order

    keys = ["b_1_0", "a_0_0", "c_0_0", "b_0_0", "a_1_0"]
    assert states_in_prompt_order(keys, {"a": 0, "b": 1}) == [
        ["a_0_0", "a_1_0"],
        ["b_0_0", "b_1_0"],  # sessions in order
        ["c_0_0"],  # not submitted through the trainer (padding): last
    ]
    assert states_in_prompt_order(keys, {}) == [["b_0_0", "b_1_0"], ["a_0_0", "a_1_0"], ["c_0_0"]]
    # 3 states x 4 samples over 2 ranks: rank 0 the first 2 of each state, rank 1 the last 2
    assert rank_major_order(3, 4, 2) == [0, 1, 4, 5, 8, 9, 2, 3, 6, 7, 10, 11]
    assert rank_major_order(2, 3, 1) == [0, 1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="5 samples per state do not split over 2"):
        rank_major_order(2, 5, 2)


def test_target_logprobs_indexing():
    entries = [
        [-0.1],
        [-0.2],
        [-0.3],
        [-0.4],
        [0.0],
    ]  # prompt of 5 tokens: logprobs of tokens 1..4, dummy
    assert target_logprobs(entries, n_context=3, n_target=2) == [-0.3, -0.4]
    with pytest.raises(ValueError, match="prompt log-probs"):
        target_logprobs(entries[:2], n_context=3, n_target=2)


# ---- the rollout-server LLM against the in-process hf backend --------------------------------


@dataclass
class _TokenOutput:
    token_ids: list[int]
    extra_fields: dict = field(default_factory=dict)
    log_probs: list[float] | None = None
    stop_reason: str | None = "completed"


class _FakeServer:
    """Answers like verl's vLLM server: prompt log-probs per token (first skipped, dummy last)."""

    def __init__(self, model: Any):
        self.model = model
        self.calls = 0

    async def generate(self, prompt_ids: list[int], sampling_params: dict) -> _TokenOutput:
        self.calls += 1
        with torch.no_grad():
            logits = self.model(input_ids=torch.tensor([prompt_ids])).logits[0].float()
        logp = torch.log_softmax(logits, -1)
        entries = [[float(logp[j - 1, tok])] for j, tok in enumerate(prompt_ids) if j > 0] + [[0.0]]
        fields = (
            {"prompt_logprobs": entries}
            if sampling_params.get("prompt_logprobs") is not None
            else {}
        )
        return _TokenOutput(token_ids=[int(logp[-1].argmax())] * 3, extra_fields=fields)


def test_rollout_server_llm_scores_like_the_hf_backend(tiny_model_dir):
    from prour.llm.hf import HFLLM

    hf = HFLLM(str(tiny_model_dir), device="cpu", dtype="float32")
    server = _FakeServer(hf.model)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        llm = RolloutServerLLM(server.generate, hf.tokenizer, loop)
        requests = [
            ScoreRequest(
                context=[{"role": "user", "content": "Summarize the user's intent."}],
                target="I want to return my boots.",
                enable_thinking=False,
            ),
            ScoreRequest(context="Plain text context:", target=" a target"),
            ScoreRequest(context="empty target", target=""),
        ]
        ours, theirs = llm.score(requests), hf.score(requests)
        assert server.calls == 2  # the empty target needs no call
        for a, b in zip(ours, theirs):
            assert a.n_tokens == b.n_tokens
            assert a.token_logprobs == pytest.approx(b.token_logprobs, abs=1e-4)
        replies = llm.chat(
            [
                ChatRequest(
                    messages=[{"role": "user", "content": "hi"}],
                    sampling=SamplingParams(n=2, max_tokens=3),
                )
            ]
        )
        assert len(replies[0]) == 2 and replies[0][0].completion_tokens == 3
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)


def test_rollout_server_llm_refuses_to_block_its_own_loop(tiny_model_dir):
    from transformers import AutoTokenizer

    async def inside() -> None:
        llm = RolloutServerLLM(
            None, AutoTokenizer.from_pretrained(tiny_model_dir), asyncio.get_running_loop()
        )
        with pytest.raises(RuntimeError, match="worker thread"):
            llm.score([ScoreRequest(context="x", target="y")])

    asyncio.run(inside())


def test_dataset_asks_for_n_sessions_per_prompt(tmp_path, tiny_model_dir):
    from omegaconf import OmegaConf
    from train_helpers import instance_rows
    from transformers import AutoTokenizer

    from prour.data.dataset import write_rows
    from prour.train.verl_ext.dataset import ProurRLDataset

    path = write_rows(instance_rows(3), tmp_path / "train.parquet")
    config = OmegaConf.create(
        {
            "prompt_key": "prompt",
            "max_prompt_length": 1400,
            "filter_overlong_prompts": False,
            "return_raw_chat": True,
            "prour_sample_n": 8,
            "cache_dir": str(tmp_path / "cache"),
        }
    )
    dataset = ProurRLDataset(str(path), AutoTokenizer.from_pretrained(tiny_model_dir), config)
    item = dataset[1]
    assert item["__rollout_n__"] == 8
    assert item["raw_prompt"][0]["content"] == "Ask me one question."
    assert item["reward_model"]["ground_truth"].startswith("I want to return")


# ---- issue 13: the composed config as verl's own code consumes it ----------------------------


def _composed(tmp_path: Path, model_dir: Path, **train: Any) -> tuple[TrainConfig, Any]:
    from omegaconf import OmegaConf

    recipe, cfg = paper_like(tmp_path, model_dir, **train)
    config = compose_verl_config(prepare_verl_run(recipe, cfg).overrides)
    check_verl_config(config)
    OmegaConf.resolve(config)
    return cfg, config


def _trainer(config: Any, dp: int, mode: str | None = None) -> Any:
    """verl's registered trainer for ``mode`` (default: the configured ``trainer.v1.trainer_mode``,
    ours once registered) with the attributes its balancing reads; nothing of it starts."""
    from types import SimpleNamespace

    from verl.trainer.ppo.v1 import get_trainer_cls

    from prour.train.verl_ext.trainer import register

    register()
    trainer_cls = get_trainer_cls(mode or config.trainer.v1.trainer_mode)
    trainer = trainer_cls.__new__(trainer_cls)
    trainer.config = config
    trainer.global_steps = 1
    trainer.use_critic = False
    trainer.tokenizer = SimpleNamespace(eos_token_id=0)
    trainer.actor_rollout_wg = SimpleNamespace(_dispatch_info={"actor": list(range(dp))})
    trainer.prompt_order = {}  # StateOrderedTrainer's record of _submit_batch_to_rollout
    return trainer


def _optimizer_steps(trainer: Any, states: list[int], seq_lens: list[int], dp: int) -> list[set]:
    """The states each optimizer step trains on, as verl 0.9.1 arranges a step's kept batch:
    the trainer's ``_balance_batch`` (always run by the v1 trainer), the dispatch's contiguous
    split over ``dp`` ranks, then each rank's mini-batches from ``tensordict_utils.make_iterator``
    with the seed, epochs and shuffle ``_update_actor`` passes (``train_mini_batch``'s split)."""
    from transfer_queue import KVBatchMeta
    from verl.utils import tensordict_utils as tu

    config = trainer.config
    trainer.prompt_order = {f"s{s}": s for s in sorted(set(states))}  # submitted s0, s1, ...
    keys = [f"s{s}_{i}_0" for i, s in enumerate(states)]
    batch = KVBatchMeta(partition_id="train", keys=keys, tags=[{"seq_len": n} for n in seq_lens])
    batch = trainer._balance_batch(batch, metrics={})
    state_of = dict(zip(keys, states))
    actor = config.actor_rollout_ref.actor
    global_mini = actor.ppo_mini_batch_size * config.actor_rollout_ref.rollout.n
    per_rank = []
    for rank, part in enumerate(batch.chunk(dp)):
        td = _states_td([state_of[k] for k in part.keys])
        per_rank.append(
            [
                mini["state"].tolist()
                for mini in tu.make_iterator(
                    td,
                    mini_batch_size=global_mini // dp,
                    epochs=actor.ppo_epochs,
                    seed=actor.data_loader_seed + rank,
                    dataloader_kwargs={"shuffle": actor.shuffle},
                )
            ]
        )
    return [set().union(*parts) for parts in zip(*per_rank, strict=True)]


def _states_td(states: list[int]) -> Any:
    from tensordict import TensorDict

    return TensorDict({"state": torch.tensor(states)}, batch_size=[len(states)])


def _kept_batch(states: int = 16, keep: int = 6) -> tuple[list[int], list[int]]:
    """A kept batch as the sampler hands it over: states contiguous in completion order (here
    the reverse of the prompt order), varied lengths."""
    gen = torch.Generator().manual_seed(0)
    order = [s for s in reversed(range(states)) for _ in range(keep)]
    return order, torch.randint(200, 3000, (len(order),), generator=gen).tolist()


def test_one_state_per_optimizer_step_at_data_parallel_size_one(tmp_path, tiny_model_dir):
    # Two GPUs as one Ulysses group: the actor's dp size is 1.
    cfg, config = _composed(
        tmp_path,
        tiny_model_dir,
        verl={
            "ulysses_sequence_parallel_size": 2,
            "use_remove_padding": True,
            "attn_implementation": "flash_attention_2",
        },
    )
    fsdp = config.actor_rollout_ref.actor.fsdp_config
    assert fsdp.ulysses_sequence_parallel_size == 2 and config.trainer.n_gpus_per_node == 2
    states, lens = _kept_batch()
    steps = _optimizer_steps(_trainer(config, dp=1), states, lens, dp=1)
    assert len(steps) == 16 * cfg.ppo.epochs
    assert steps == [{s} for s in range(16)] * cfg.ppo.epochs  # one state each, prompt order


def test_one_state_per_optimizer_step_at_data_parallel_size_two(tmp_path, tiny_model_dir):
    # The paper recipe's 2 data-parallel GPUs: verl's own length balancing splits states over
    # mini-batches; the configured trainer (verl_ext.trainer) keeps each step to one state.
    from prour.train.verl_ext.trainer import StateOrderedTrainer

    cfg, config = _composed(tmp_path, tiny_model_dir)
    assert config.actor_rollout_ref.actor.shuffle is False
    states, lens = _kept_batch()
    stock = _optimizer_steps(_trainer(config, 2, mode="sync"), states, lens, dp=2)
    assert len(stock) == 16 * 4 and any(len(s) > 1 for s in stock)
    trainer = _trainer(config, dp=2)
    assert isinstance(trainer, StateOrderedTrainer)
    steps = _optimizer_steps(trainer, states, lens, dp=2)
    assert steps == [{s} for s in range(16)] * cfg.ppo.epochs


def test_verl_refuses_a_shuffle_that_would_mix_states(tmp_path, tiny_model_dir):
    from prour.config import ConfigError

    with pytest.raises((ConfigError, ValueError), match="ppo.shuffle"):
        paper_like(tmp_path, tiny_model_dir, ppo={"shuffle": True})
    with pytest.raises((ConfigError, ValueError), match="use_remove_padding"):
        paper_like(tmp_path, tiny_model_dir, verl={"ulysses_sequence_parallel_size": 2})
    sdpa = {"ulysses_sequence_parallel_size": 2, "use_remove_padding": True}
    with pytest.raises((ConfigError, ValueError), match="flash_attention_2"):
        paper_like(tmp_path, tiny_model_dir, verl=sdpa)


def _refill(config: Any, num_prompts: int) -> int:
    """verl's ``PPOTrainer._next_train_batch`` (the refill path), one-row dataloader fetches."""
    from types import SimpleNamespace

    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    fetches = []

    def fetch_one():
        size = config.data.gen_batch_size
        fetches.append(size)
        return _states_td(list(range(size)))

    trainer = SimpleNamespace(config=config, global_steps=3, _fetch_one_gen_batch=fetch_one)
    return len(PPOTrainer._next_train_batch(trainer, num_prompts))


def test_drop_zero_variance_refills_whole_prompts(tmp_path, tiny_model_dir):
    _, config = _composed(tmp_path, tiny_model_dir, ppo={"drop_zero_variance": True})
    assert config.data.gen_batch_size == 1
    assert _refill(config, 6) == 6  # the refill of 6 dropped groups
    assert _refill(config, 16) == 16  # a full step
    _, plain = _composed(tmp_path, tiny_model_dir)
    assert _refill(plain, 16) == 16
    with pytest.raises(ValueError, match="gen_batch_size"):  # the crash the refill used to hit
        _refill(plain, 6)


def test_fsdp_strategy_reaches_the_engine_key(tmp_path, tiny_model_dir):
    from verl.utils.config import omega_conf_to_dataclass

    _, config = _composed(tmp_path, tiny_model_dir, verl={"fsdp_strategy": "fsdp2"})
    engine = omega_conf_to_dataclass(config.actor_rollout_ref.actor.fsdp_config)
    assert engine.strategy == "fsdp2"


def test_fused_kernels_reach_verls_model_and_actor(tmp_path, tiny_model_dir):
    """train.verl.use_fused_kernels sets verl's model switch, which its actor section reads;
    off by default. Its numbers: tests/train/test_fused_logprob.py, test_layout.py."""
    from verl.utils.config import omega_conf_to_dataclass

    _, config = _composed(tmp_path / "off", tiny_model_dir)
    assert config.actor_rollout_ref.model.use_fused_kernels is False
    assert config.actor_rollout_ref.actor.use_fused_kernels is False
    _, config = _composed(tmp_path / "on", tiny_model_dir,
                          verl={"use_fused_kernels": True, "use_remove_padding": True})
    model = omega_conf_to_dataclass(config.actor_rollout_ref.model)
    assert model.use_fused_kernels is True and model.use_remove_padding is True
    assert model.fused_kernel_options["impl_backend"] == "torch"
    assert config.actor_rollout_ref.actor.use_fused_kernels is True


def test_warmup_counts_training_steps(tmp_path, tiny_model_dir):
    # verl steps the actor's scheduler once per training step (the last mini-batch of the last
    # epoch sets update_lr_scheduler), through get_constant_schedule_with_warmup.
    from verl.utils.torch_functional import get_constant_schedule_with_warmup

    cfg, config = _composed(tmp_path, tiny_model_dir, optim={"warmup_steps": 4})
    optim = config.actor_rollout_ref.actor.optim
    assert optim.lr_scheduler_type == "constant" and optim.lr_warmup_steps == 4
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=optim.lr)
    sched = get_constant_schedule_with_warmup(opt, num_warmup_steps=optim.lr_warmup_steps)
    lrs = []
    for _ in range(6):  # training steps; each would hold 16 x 4 optimizer steps
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    lr = cfg.optim.lr
    assert lrs == pytest.approx([0.0, lr / 4, lr / 2, 3 * lr / 4, lr, lr])


def test_validation_samples_once_greedily(tmp_path, tiny_model_dir):
    from verl.utils.config import omega_conf_to_dataclass

    _, config = _composed(tmp_path, tiny_model_dir)
    val = omega_conf_to_dataclass(config.actor_rollout_ref.rollout.val_kwargs)
    assert val.n == 1 and val.do_sample is False


def test_ray_gets_the_slurm_cpu_share(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "16")
    _, config = _composed(tmp_path, tiny_model_dir)
    assert config.ray_kwargs.ray_init.num_cpus == 16
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # multi-node: `ray start` set the CPUs
    _, config = _composed(tmp_path, tiny_model_dir)
    assert config.ray_kwargs.ray_init.num_cpus is None
    monkeypatch.delenv("RAY_ADDRESS")
    sampler = config.trainer.v1.sampler.sampler_kwargs
    assert sampler.max_failed_ask_fraction == 0.5
    monkeypatch.delenv("SLURM_CPUS_PER_TASK")
    _, config = _composed(tmp_path, tiny_model_dir)
    assert config.ray_kwargs.ray_init.num_cpus is None


def test_the_dataset_keeps_the_states_of_train_modes(tmp_path, tiny_model_dir):
    """train.modes reaches verl as data.prour_modes and its dataset keeps those states' rows, as
    the local trainer does; a filter that keeps none is refused."""
    import json

    from omegaconf import OmegaConf
    from train_helpers import instance_rows
    from transformers import AutoTokenizer

    from prour.data.dataset import write_rows
    from prour.train.verl_backend import data_overrides
    from prour.train.verl_ext.dataset import ProurRLDataset

    recipe, cfg = paper_like(tmp_path, tiny_model_dir, modes=["clarify"])
    assert data_overrides(recipe, cfg)["+data.prour_modes"] == ["clarify"]
    assert "+data.prour_modes" not in data_overrides(*paper_like(tmp_path, tiny_model_dir))
    rows = instance_rows(3)
    rows[1]["extra_info"] = {**rows[1]["extra_info"], "mode": "verify"}
    rows[1]["reward_model"] = {**rows[1]["reward_model"], "ground_truth": json.dumps(
        {"arguments": {}, "name": "x"}, sort_keys=True, separators=(",", ":"))}
    path = write_rows(rows, tmp_path / "train.parquet")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)

    def dataset(modes):
        config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 1400,
                                   "filter_overlong_prompts": False, "return_raw_chat": True,
                                   "cache_dir": str(tmp_path / "cache"), "prour_modes": modes})
        return ProurRLDataset(str(path), tokenizer, config)

    assert len(dataset(None)) == 3
    clarify = dataset(["clarify"])
    assert [clarify[i]["extra_info"]["state_id"] for i in range(len(clarify))] == [
        rows[0]["extra_info"]["state_id"], rows[2]["extra_info"]["state_id"]]
    assert len(dataset(["verify"])) == 1
    write_rows([rows[1]], path)
    with pytest.raises(ValueError, match=r"train.modes=\['clarify'\] keeps no state"):
        dataset(["clarify"])


def test_overlap_one_step_maps_onto_our_colocated_async_trainer(tmp_path, tiny_model_dir):
    """train.overlap picks the trainer and sampler; max_staleness becomes verl's span bound."""
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync
    from verl.trainer.ppo.v1.trainer_base import get_trainer_cls
    from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
    from verl.utils.import_utils import load_extern_type

    from prour.train.verl_ext.trainer import OneStepStateOrderedTrainer, register

    register()
    for overlap, staleness in (("off", None), ("one_step", 1), ("one_step", 3)):
        extra = {} if staleness is None else {"max_staleness": staleness}
        _, config = _composed(tmp_path, tiny_model_dir, overlap=overlap, **extra)
        check_verl_config(config)
        v1 = config.trainer.v1
        trainer = get_trainer_cls(v1.trainer_mode)
        sampler = load_extern_type(v1.sampler.custom_sampler.path, v1.sampler.custom_sampler.name)
        if staleness is None:  # the paper's synchronous step
            assert trainer.__name__ == "StateOrderedTrainer"
            assert not issubclass(sampler, ReplayBufferAsync) and issubclass(sampler, ReplayBuffer)
            continue
        assert trainer is OneStepStateOrderedTrainer
        assert issubclass(trainer, PPOTrainerColocateAsync) and issubclass(sampler, ReplayBufferAsync)
        # verl counts the versions a prompt's group spans: one more than the updates in between
        assert v1.sampler.max_off_policy_threshold == staleness + 1
        assert v1.sampler.max_off_policy_strategy == "drop"
