"""The verl backend on CPU: Hydra overrides pass verl's own validation; extension logic; export."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from prour.config import ModelConfig, Recipe
from prour.llm.base import ChatRequest, SamplingParams, ScoreRequest
from prour.train.config import TrainConfig
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
    target_logprobs,
)


def _paper_like(tmp_path: Path, model_dir: Path, **train: Any) -> tuple[Recipe, TrainConfig]:
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


def _as_dict(overrides: list[str]) -> dict[str, str]:
    return dict(item.lstrip("+").split("=", 1) for item in overrides)


def test_overrides_carry_the_paper_numbers(tmp_path, tiny_model_dir):
    recipe, cfg = _paper_like(tmp_path, tiny_model_dir)
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
    }
    assert {k: o.get(k) for k in expected} == expected
    loops = (run.agent_loops_file).read_text()
    assert (
        "prour.train.verl_ext.agent_loop.QueryAgentLoop" in loops and str(run.recipe_file) in loops
    )
    assert "verl.trainer.main_ppo" in run.shell()


def test_composed_config_passes_verls_validation(tmp_path, tiny_model_dir):
    recipe, cfg = _paper_like(tmp_path, tiny_model_dir)
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
        kind, failed, reward, prior, post = "ask", False, 0.25, -3.0, -2.75

    fields = {"reward_extra_info": reward_extra_info(Sample())}
    assert sample_info(fields) == SampleInfo("ask", False, 0.25)
    assert sample_info(Wrapped(fields)) == SampleInfo("ask", False, 0.25)
    assert sample_info({}) == SampleInfo("invalid", True, None)  # no reward info: never kept


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
