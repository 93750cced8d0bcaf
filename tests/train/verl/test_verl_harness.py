"""prour's verl extensions run inside verl 0.9.1's own code: Ray (2 CPUs) + TransferQueue (one
storage unit; the default 8 hang on 2 cores) + ``AgentLoopWorkerTQ`` + our sampler as verl's
trainer builds and calls it. See ``prour.train.verl_ext.rehearsal`` for what stands in for the GPU side."""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from verl_harness import SCORE_MARK

pytestmark = pytest.mark.verl_harness

N_STATES, N, KEEP = 16, 8, 6
REPLIES = (
    "YES [QUESTION]Which colour do you want?[/QUESTION]",
    "NO",
    "garbage",
    "YES [QUESTION]Which size do you want?[/QUESTION]",
    "NO",
)


def test_extensions_import_in_the_test_venv():
    from prour.train.verl_ext import agent_loop, sampler

    assert agent_loop.QueryAgentLoop.__name__ == "QueryAgentLoop"
    assert sampler.KeepValidFirstReplayBuffer.__mro__[1].__name__ == "ReplayBuffer"


@pytest.fixture(scope="module")
def ray_tq(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Ray on two CPUs and TransferQueue with one storage unit, for the whole module."""
    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    from prour.train.verl_ext.rehearsal import compose

    config, _ = compose(tiny_model_dir, tmp_path_factory.mktemp("tq"), [])
    # the runtime env as verl's run_ppo builds it: its defaults under the recipe's ray_init one
    runtime_env = OmegaConf.merge(
        get_ppo_ray_runtime_env(config), config.ray_kwargs.ray_init.runtime_env
    )
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env=OmegaConf.to_container(runtime_env),
    )
    try:
        tq.init(
            OmegaConf.merge(
                config.transfer_queue, {"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}
            )
        )
        yield
        tq.close()
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def scripted_responders() -> Iterator:
    """Our agent loops answer with a scripted strict user instead of the Qwen3-8B endpoint."""
    from verl_harness import StrictUser

    from prour.config.rewards import RewardConfig
    from prour.llm.scripted import ScriptedLLM
    from prour.recipes import load_recipe
    from prour.rollout import StrictUserSimulator
    from prour.train.reward import Responders
    from prour.train.verl_ext import agent_loop

    user = StrictUser()
    responder = StrictUserSimulator(ScriptedLLM(rules=[(".", user)]),
                                    RewardConfig(responder_max_tokens=32))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            agent_loop,
            "_run_context",
            lambda path, _builder: (load_recipe(path, endpoints=True),
                                    Responders(responder, None)),
        )
        yield user


def _harness(model_dir: Path, run_dir: Path, sets: list[str], reply, flat: int = 0):
    from train_helpers import instance_rows

    from prour.data.dataset import write_rows
    from prour.train.verl_ext.rehearsal import Harness, compose

    rows = instance_rows(N_STATES)
    for row in rows[:flat]:
        row["prompt"][0]["content"] = "FLAT please"
    write_rows(rows, run_dir / "data/dataset/train.parquet")
    write_rows(instance_rows(2), run_dir / "data/dataset/validation.parquet")
    config, _ = compose(model_dir, run_dir, sets)
    return Harness(config, model_dir, reply)


def _cycle():
    calls = iter(range(10**6))
    return lambda _text: REPLIES[next(calls) % len(REPLIES)]


@pytest.fixture(scope="module")
def paper_step(ray_tq, scripted_responders, tiny_model_dir, tmp_path_factory):
    """One verl training step of the paper recipe: the harness, the sampled batch, the metrics."""
    harness = _harness(tiny_model_dir, tmp_path_factory.mktemp("paper"), [], _cycle())
    _balanced, metrics = harness.step()
    yield harness, harness.trainer.batches[-1], metrics
    harness.close()


def _by_group(keys) -> dict[str, list[str]]:
    groups = defaultdict(list)
    for key in keys:
        groups[key.split("_")[0]].append(key)
    return groups


def test_sixteen_prompts_give_128_trajectories_and_96_kept_six_per_state(paper_step):
    harness, batch, _ = paper_step
    assert harness.submitted == [N_STATES]
    assert len(harness.rolled) == N_STATES * N
    groups = _by_group(batch.keys)
    assert len(batch.keys) == N_STATES * KEEP
    assert sorted(len(keys) for keys in groups.values()) == [KEEP] * N_STATES


def test_valid_questions_are_kept_first(paper_step):
    harness, batch, _ = paper_step
    rolled = _by_group(harness.rolled)
    for uid, kept in _by_group(batch.keys).items():
        usable_asks = [k for k in rolled[uid] if harness.rolled[k].kind == "ask"]
        usable_asks = [k for k in usable_asks if not harness.rolled[k].failed]
        kept_asks = [k for k in kept if harness.rolled[k].kind == "ask"]
        assert len(kept_asks) == min(KEEP, len(usable_asks)), uid
        assert not any(harness.rolled[k].failed for k in kept)


def test_verl_grpo_normalises_over_the_kept_six(paper_step):
    import numpy as np
    from verl.protocol import DataProto
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    harness, batch, _ = paper_step
    data = harness.fields(batch.keys, ["uid", "response_mask", "rm_scores"])
    data = DataProto(batch=data.to_padded_tensor())
    data.batch["token_level_scores"] = data.batch["rm_scores"]
    data.batch["token_level_rewards"] = data.batch["rm_scores"]
    data.non_tensor_batch["uid"] = np.array(data.batch.pop("uid").tolist(), dtype=object)
    config = harness.config
    data = compute_advantage_for_multi_trajectories(
        data,
        batch_keys=batch.keys,
        adv_estimator=config.algorithm.adv_estimator,
        num_repeat=config.actor_rollout_ref.rollout.n,
        norm_adv_by_std_in_grpo=True,
        config=config.algorithm,
    )
    advantages = data.batch["advantages"][:, 0]
    rewards = torch.tensor([harness.rolled[k].reward for k in batch.keys])
    assert rewards.std() > 0
    for uid, keys in _by_group(batch.keys).items():
        idx = [batch.keys.index(k) for k in keys]
        r = rewards[idx]
        expected = (r - r.mean()) / (r.std() + 1e-6)
        assert torch.allclose(advantages[idx], expected, atol=1e-4), uid


def test_sampler_metrics_reach_verl_step_metrics(paper_step):
    harness, _, metrics = paper_step
    infos = list(harness.rolled.values())
    n = len(infos)
    for kind in ("ask", "none", "invalid"):
        expected = sum(i.kind == kind for i in infos) / n
        assert metrics[f"training/prour/{kind}_fraction"] == pytest.approx(expected)
    asks = [i for i in infos if i.kind == "ask"]
    assert metrics["training/prour/failed_ask_fraction"] == pytest.approx(
        sum(i.failed for i in asks) / len(asks)
    )
    scored = [i.reward for i in infos if not i.failed and i.reward is not None]
    assert {i.mode for i in infos} == {"clarify"}
    assert metrics["training/prour/reward_mean"] == pytest.approx(sum(scored) / len(scored))
    assert metrics["training/prour/reward_mean_clarify"] == pytest.approx(sum(scored) / len(scored))
    assert "training/prour/reward_mean_verify" not in metrics  # no verify state this step
    priors = [i.prior for i in infos if i.prior is not None]
    assert metrics["training/prour/prior_mean"] == pytest.approx(sum(priors) / len(priors))
    assert metrics["training/prour/kept_samples"] == N_STATES * KEEP
    assert "global_seqlen/mean" in metrics or any(k.startswith("global_seqlen") for k in metrics)


def _phases_fill_the_step(harness, metrics) -> None:
    """The step's phase keys are there under training/prour/ and add up to verl's step timer."""
    from prour.train.metrics import CALL_KEYS, PHASE_KEYS

    ours = {k: metrics[f"training/prour/{k}"] for k in (*PHASE_KEYS, *CALL_KEYS, "time_step_s")}
    assert all(v >= 0 for v in ours.values())
    assert ours["time_step_s"] == harness.timing_raw["step"]
    assert sum(ours[k] for k in PHASE_KEYS) == pytest.approx(ours["time_step_s"], rel=1e-9)
    assert ours["time_generation_s"] > 0 and ours["time_strict_user_s"] > 0
    # the harness stops before verl's update; of its timers only the hook's weight sync ran
    assert "update_actor" not in harness.timing_raw
    assert ours["time_update_s"] == harness.timing_raw["update_weights"]


def test_every_step_writes_the_phase_keys(paper_step):
    """One session's phases per trajectory, joined by our trainer: counts match what the stand-in
    rollout server and responder were asked."""
    harness, _, metrics = paper_step
    _phases_fill_the_step(harness, metrics)
    infos = list(harness.rolled.values())
    prior_prompts = harness.server.prior_requests(SCORE_MARK)
    posterior_prompts = sum(harness.server.score_prompts.values()) - sum(prior_prompts.values())
    assert metrics["training/prour/prior_requests"] == sum(prior_prompts.values()) == N_STATES
    assert metrics["training/prour/posterior_requests"] == posterior_prompts > 0
    # every session asks its one question of the strict user once (no retries: responder_retries=0)
    assert metrics["training/prour/strict_user_calls"] == sum(i.kind == "ask" for i in infos)
    assert metrics["training/prour/verifier_calls"] == 0  # clarify states only
    assert metrics["training/prour/generation_tokens"] == harness.server.sampled_tokens > 0


def test_one_prior_request_per_state_per_step(paper_step):
    harness, _, _ = paper_step
    states_with_answers = {
        k.split("_")[0] for k, i in harness.rolled.items() if i.kind == "ask" and not i.failed
    }
    priors = harness.server.prior_requests(SCORE_MARK)
    assert len(states_with_answers) == N_STATES
    assert sorted(priors.values()) == [1] * N_STATES
    by_state = defaultdict(set)
    for key, info in harness.rolled.items():
        if info.prior is not None:
            by_state[key.split("_")[0]].add(info.prior)
    assert all(len(values) == 1 for values in by_state.values())  # sessions share the prior


def test_verls_task_runner_process_gets_the_state_ordered_trainer(ray_tq, paper_step):
    # main_ppo's TaskRunnerV1 (a Ray actor) calls get_trainer_cls(trainer.v1.trainer_mode)
    import ray

    harness, _, _ = paper_step

    @ray.remote(num_cpus=0)
    def trainer_for(mode: str) -> tuple[str, str]:
        from verl.trainer.ppo.v1 import get_trainer_cls

        cls = get_trainer_cls(mode)
        return cls.__module__, cls.__name__

    mode = harness.config.trainer.v1.trainer_mode
    assert ray.get(trainer_for.remote(mode)) == (
        "prour.train.verl_ext.trainer",
        "StateOrderedTrainer",
    )


def _update(harness, batch) -> list[list[list[str]]]:
    """verl's ``_update_actor`` on ``batch`` at the harness's 2 data-parallel ranks: per rank,
    the uids of each optimizer mini-batch ``train_mini_batch`` trains on, in order."""
    ranks = harness.trainer.actor_rollout_wg
    ranks.mini_batches = [[] for _ in range(ranks.dp)]
    harness.trainer._update_actor(batch, metrics={})
    return ranks.mini_batches


def _assert_one_state_per_mini_batch(ranks, states: list[str], epochs: int) -> None:
    assert len(ranks) == 2 and all(len(r) == len(states) * epochs for r in ranks)
    for step, parts in enumerate(zip(*ranks, strict=True)):
        state = states[step % len(states)]
        real = [uid for part in parts for uid in part if not uid.startswith("pad")]
        assert real and set(real) == {state}, step  # one state, in prompt order
        assert [len(part) for part in parts] == [KEEP // 2] * 2  # equal shares


@pytest.fixture(scope="module")
def process_group(tmp_path_factory):
    """``train_mini_batch`` all-gathers token counts over the data-parallel group (gloo, 1 rank)."""
    import torch.distributed as dist

    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_every_optimizer_mini_batch_on_every_rank_holds_one_state(paper_step, process_group):
    harness, batch, metrics = paper_step
    balanced = harness.trainer.balanced[-1]
    assert sorted(balanced.keys) == sorted(batch.keys)  # the kept 96, no padding needed
    states = [uid for uid in harness.prompt_uids if uid in {k.split("_")[0] for k in batch.keys}]
    epochs = harness.config.actor_rollout_ref.actor.ppo_epochs
    _assert_one_state_per_mini_batch(_update(harness, balanced), states, epochs)
    assert "global_seqlen/mean" in metrics


def test_states_short_of_keep_are_padded_with_no_op_samples(paper_step, process_group):
    # a state that lost kept samples (failed asks) is filled up with verl's padding samples,
    # which carry no loss (response_mask 0), so no mini-batch takes samples of another state
    harness, batch, _ = paper_step
    by_state = _by_group(batch.keys)
    first, second = list(by_state)[:2]
    dropped = set(by_state[first][4:]) | set(by_state[second][5:])  # 4 and 5 kept of 6
    sub = batch.select_keys([k for k in batch.keys if k not in dropped])
    # balanced once more: the trainer forgets a prompt's place once trained; tell it again
    harness.trainer.prompt_order = {uid: i for i, uid in enumerate(harness.prompt_uids)}
    balanced = harness.trainer._balance_batch(sub, metrics={})
    pads = [k for k in balanced.keys if k.startswith("pad")]
    assert len(balanced) == len(batch.keys) and len(pads) == 3
    assert all(balanced.tags[balanced.keys.index(k)]["is_padding"] for k in pads)
    masks = harness.fields(pads, ["response_mask"])["response_mask"]
    assert sum(int(m.sum()) for m in masks) == 0  # no loss on padding
    states = [uid for uid in harness.prompt_uids if uid in by_state]
    epochs = harness.config.actor_rollout_ref.actor.ppo_epochs
    _assert_one_state_per_mini_batch(_update(harness, balanced), states, epochs)


def test_replies_that_end_are_reported_as_stop(paper_step):
    harness, batch, _ = paper_step
    fields = harness.fields(batch.keys, ["extra_fields"])["extra_fields"]
    reasons = Counter(getattr(f, "data", f)["finish_reason"] for f in fields)
    assert reasons == Counter({"stop": len(batch.keys)})


def test_drop_zero_variance_refills_single_prompts_and_continues(
    ray_tq, scripted_responders, tiny_model_dir, tmp_path
):
    cycle = _cycle()
    harness = _harness(
        tiny_model_dir,
        tmp_path,
        ["train.ppo.drop_zero_variance=true"],
        lambda text: "NO" if "FLAT" in text else cycle(text),
        flat=3,
    )
    try:
        _, metrics = harness.step()
        batch = harness.trainer.batches[-1]
        groups = _by_group(batch.keys)
        assert sorted(len(k) for k in groups.values()) == [KEEP] * N_STATES
        flat = {k.split("_")[0] for k, i in harness.rolled.items() if i.kind == "none"}
        flat = {
            u
            for u in flat
            if all(i.kind == "none" for k, i in harness.rolled.items() if k.startswith(u))
        }
        assert flat and not flat & set(groups)  # the flat groups were evicted, not trained on
        # a refill can draw a flat row again and finish after the batch filled: it waits in
        # TransferQueue for the next step instead of being evicted
        import transfer_queue as tq

        waiting = {k.split("_")[0] for k in (tq.kv_list("train") or {}).get("train", {})}
        assert metrics["training/filter_groups/evicted_samples"] >= len(flat - waiting) >= 3
        # verl evicts k flat groups and refills 2k prompts, fetched one by one (gen_batch_size 1)
        assert harness.config.data.gen_batch_size == 1
        assert harness.submitted[:2] == [N_STATES, 2 * 3]
        _phases_fill_the_step(harness, metrics)
        _, metrics = harness.step()  # the next step: its own phases, from its own sessions
        _phases_fill_the_step(harness, metrics)
    finally:
        harness.close()


def test_a_step_whose_groups_are_all_dropped_is_skipped_with_a_warning(
    ray_tq, scripted_responders, tiny_model_dir, tmp_path, caplog
):
    harness = _harness(
        tiny_model_dir,
        tmp_path,
        ["train.max_failed_ask_fraction=1.0"],
        lambda _text: REPLIES[0],
    )
    scripted_responders.down = True
    harness.after_rollout = lambda: setattr(scripted_responders, "down", False)
    try:
        with caplog.at_level(logging.WARNING, logger="prour.train.verl_ext.sampler"):
            _, metrics = harness.step()
        assert "every group of the sampled batch was dropped" in caplog.text
        assert harness.submitted == [N_STATES, N_STATES]  # a fresh batch replaced the dropped one
        assert metrics["training/prour/skipped_batches"] == 1
        assert len(harness.trainer.batches[-1].keys) == N_STATES * KEEP
    finally:
        scripted_responders.down = False
        harness.close()


@pytest.mark.parametrize("drop_zero_variance", [False, True])
def test_training_stops_once_failed_asks_pass_the_threshold(
    ray_tq, scripted_responders, tiny_model_dir, tmp_path, drop_zero_variance
):
    from prour.train.verl_ext.sampler import FailedAsksError

    sets = [
        "train.max_failed_ask_fraction=0.5",
        f"train.ppo.drop_zero_variance={str(drop_zero_variance).lower()}",
    ]
    harness = _harness(tiny_model_dir, tmp_path, sets, lambda _t: REPLIES[0])
    scripted_responders.down = True
    try:
        # with drop_zero_variance the failed groups are flat: verl would evict and refill them
        # for ever; the sampler stops once a step's worth of states has been seen
        with pytest.raises(
            FailedAsksError, match=r"128 of 128 .* over 16 states.*max_failed_ask_fraction=0\.5"
        ):
            harness.step()
        assert harness.submitted == [N_STATES]
        assert all(i.failed for i in harness.rolled.values())
    finally:
        scripted_responders.down = False
        harness.close()
