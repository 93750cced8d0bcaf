"""The CPU rehearsal of prour's verl trainer: verl 0.9.1's own trainer code with stand-ins for
the GPU side only.

What runs is verl's: the Hydra-composed config of a recipe (:func:`compose`), the trainer's
dataloader, prompt submission, refill, ``step`` (metric aggregation), the replay buffer
construction of our sampler, ``AgentLoopWorkerTQ``'s methods instantiating our
``QueryAgentLoop`` through its registry, and TransferQueue on Ray; our ``StateOrderedTrainer``'s
``_balance_batch``, then verl's ``_update_actor``, dispatch split and
``TrainingWorker.train_mini_batch`` per rank (:class:`ActorRanks`).

What stands in: :class:`RolloutServer` answers with verl's ``generate`` signature and
``TokenOutput`` (prompt log-probs from the tiny HF model, replies from a callable instead of vLLM
sampling); the sampling trainer (:func:`trainer_class`) stops the step after ``_balance_batch``
(old log-probs need the FSDP workers), and the engine under ``train_mini_batch``
(:class:`RankWorker`) records the mini-batches it is handed. :class:`Harness` ties them together
on one event loop. The tests (``tests/train/verl``) and the overlap benchmark build on these.

For step times (``benchmarks/verl_overlap_step.py``) the stand-ins can take stated time: each
sampled reply ``generate_s`` seconds (vLLM's decoding), each step's update is held to ``update_s``
seconds (the FSDP engine; verl's dispatch and mini-batch loop run inside them), and the step then runs verl's ``_update_actor`` and the trainer's own
``on_step_end``, whose weight sync reaches :class:`WeightSync` (the server's weights version).
With ``train.overlap: one_step`` (``OneStepStateOrderedTrainer``) the harness's
``generate_sequences`` only starts the sessions, as verl's agent-loop manager does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from omegaconf import OmegaConf

STOP_WAIT_S = 2.0  # after SIGINT/SIGTERM: the longest wait on Ray in the rehearsal's clean-up


def compose(
    model_dir: Path, run_dir: Path, sets: list[str], recipe_path: str = "recipes/paper.yaml"
) -> tuple[Any, Path]:
    """The recipe at ``recipe_path`` (the paper's unless told) with the verl backend on
    ``model_dir``: verl's resolved config and the recipe file the agent loops read."""
    from prour.recipes import load_recipe
    from prour.train.recipe import train_section
    from prour.train.verl_backend import compose_verl_config, prepare_verl_run

    recipe = load_recipe(
        recipe_path,
        [
            "train.backend=verl",
            f"train.output_dir={run_dir / 'ckpt'}",
            f"run_dir={run_dir}",
            f"models.generator.path={model_dir}",
            "reward.responder_retries=0",
            *sets,
        ],
        endpoints=True,
    )
    run = prepare_verl_run(recipe, train_section(recipe), write=True)
    config = compose_verl_config(run.overrides + ["data.dataloader_num_workers=0"])
    OmegaConf.resolve(config)
    return config, run.recipe_file


class RolloutServer:
    """verl's rollout-server client as the agent loop sees it, on the tiny HF model.

    ``reply(prompt_text)`` scripts the sampled text; scoring requests (``prompt_logprobs``)
    return the model's prompt log-probs in verl's ``extract_prompt_logprobs`` layout. With
    ``reply=None`` the model samples the reply itself (at the request's temperature, within
    ``budget(prompt_tokens, sampling_params)`` tokens) and its log-probs are the model's own.
    :meth:`load_weights` brings in the trained policy and its ``version`` (verl's weight sync to
    its rollout servers).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        reply: Callable[[str], str] | None,
        budget: Callable[[int, dict[str, Any]], int] | None = None,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.reply = reply
        self.budget = budget
        self.score_prompts: Counter[str] = Counter()
        self.sampled_tokens = 0  # tokens of every sampled reply (scoring calls not counted)
        self.version = 0  # the weights' global step (verl's init syncs step 0; WeightSync moves it)
        self.generate_s = 0.0  # seconds each sampled reply takes
        self._lock = threading.Lock()

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Any = None,
        video_data: Any = None,
        audio_data: Any = None,
        mm_processor_kwargs: Any = None,
        **kwargs: Any,
    ) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        version = self.version
        extra = {"global_steps": version, "min_global_steps": version, "max_global_steps": version}
        text = self.tokenizer.decode(prompt_ids)
        if sampling_params.get("prompt_logprobs") is not None:
            with self._lock:
                self.score_prompts[text] += 1
                with torch.no_grad():
                    logits = self.model(input_ids=torch.tensor([prompt_ids])).logits[0]
            logp = torch.log_softmax(logits.float(), -1)
            extra["prompt_logprobs"] = [
                [float(logp[j - 1, t])] for j, t in enumerate(prompt_ids) if j > 0
            ] + [[0.0]]
            return TokenOutput(token_ids=[1], stop_reason="completed", extra_fields=extra)
        if self.generate_s:
            await asyncio.sleep(self.generate_s)
        if self.reply is None:
            ids, sampled = self._sample(prompt_ids, sampling_params)
        else:
            ids = self.tokenizer(self.reply(text), add_special_tokens=False)["input_ids"]
            ids, sampled = ids + [self.tokenizer.eos_token_id], None
        with self._lock:
            self.sampled_tokens += len(ids)
        logprobs = None
        if sampling_params.get("logprobs"):
            logprobs = sampled if sampled is not None else [-0.5] * len(ids)
        return TokenOutput(
            token_ids=ids, log_probs=logprobs, stop_reason="completed", extra_fields=extra
        )

    def _sample(self, prompt_ids: list[int], params: dict[str, Any]) -> tuple[list[int], list[float]]:
        """The model's own reply to ``prompt_ids`` and the log-prob of each of its tokens."""
        if self.budget is None:
            raise ValueError("a sampling RolloutServer (reply=None) needs a token budget")
        temperature = float(params.get("temperature", 1.0))
        budget = self.budget(len(prompt_ids), params)
        with self._lock, torch.no_grad():
            out = self.model.generate(
                input_ids=torch.tensor([prompt_ids]),
                attention_mask=torch.ones((1, len(prompt_ids)), dtype=torch.long),
                max_new_tokens=budget,
                do_sample=temperature > 0,
                temperature=max(temperature, 1e-5),
                top_p=float(params.get("top_p", 1.0)),
                pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
                output_scores=True,
                return_dict_in_generate=True,
            )
        ids = out.sequences[0, len(prompt_ids):].tolist()
        logprobs = [
            float(torch.log_softmax(scores[0].float(), -1)[token])
            for scores, token in zip(out.scores, ids, strict=False)
        ]
        return ids, logprobs

    def load_weights(self, state: dict[str, Any], version: int) -> None:
        """The trained policy's weights, those after step ``version``, for the next replies."""
        with self._lock:
            self.model.load_state_dict(state)
            self.version = version

    def prior_requests(self, answer_mark: str) -> Counter[str]:
        """Scoring prompts without ``answer_mark`` (a phrase every responder answer holds): the
        priors, which carry no question and answer."""
        return Counter({p: n for p, n in self.score_prompts.items() if answer_mark not in p})


class WeightSync:
    """verl's ``CheckpointEngineManager`` as the trainer's hooks call it, for one stand-in
    server: ``update_weights`` sets the server's weights version and records, per sync, how many
    of the train partition's prompts were still pending or running (a sync under a running
    session would change its weights mid-session)."""

    def __init__(self, server: RolloutServer):
        self.server = server
        self.syncs: list[tuple[int, int]] = []  # (global step, prompts still rolling out)
        self.aborts = 0

    def update_weights(self, global_steps: int) -> dict:
        import transfer_queue as tq

        listing = (tq.kv_list("train") or {}).get("train", {})
        rolling = sum(
            tag.get("is_prompt", False) and tag.get("status") in ("pending", "running")
            for tag in listing.values()
        )
        self.syncs.append((global_steps, rolling))
        self.server.version = global_steps
        return {}

    def sleep_replicas(self) -> None:
        """Nothing to free: the stand-in holds no GPU memory."""

    def abort_replicas(self, reject_request: bool = False) -> None:
        self.aborts += 1

    def resume_generation_replicas(self) -> None:
        """Nothing was paused."""


def trainer_class(mode: str | None = None) -> type:
    """The configured verl trainer (ours: ``StateOrderedTrainer``, or for verl's ``mode``
    :data:`~prour.train.verl_backend.ONE_STEP_TRAINER_MODE` ``OneStepStateOrderedTrainer``) up to
    its GPU stages: ``_step_once`` samples and balances the batch over the data-parallel ranks,
    then, with ``runs_update``, runs verl's ``_update_actor`` on the stand-in ranks."""
    from prour.train.verl_backend import ONE_STEP_TRAINER_MODE
    from prour.train.verl_ext.trainer import OneStepStateOrderedTrainer, StateOrderedTrainer

    base = OneStepStateOrderedTrainer if mode == ONE_STEP_TRAINER_MODE else StateOrderedTrainer

    class SamplingTrainer(base):
        def __init__(
            self, config: Any, tokenizer: Any, manager: Any, dp: int, runs_update: bool = False
        ):
            self.config = config
            self.tokenizer, self.processor = tokenizer, None
            self.trainer_mode = config.trainer.v1.trainer_mode
            self.parameter_sync_step = 1
            self.use_critic = False
            self.global_steps = 1
            self.agent_loop_manager = manager
            self.actor_rollout_wg = ActorRanks(dp)
            self._init_dataloader()
            self.replay_buffer = self._build_replay_buffer()
            self.prompt_order: dict[str, int] = {}
            self.batches: list[Any] = []  # as sampled
            self.balanced: list[Any] = []  # as handed to the actor ranks
            self.runs_update = runs_update
            self.checkpoint_manager = WeightSync(manager.server)
            self.curr_step_profile = False
            self._restored_tq_prompt_count = 0

        def _step_once(self, metrics: dict, timing_raw: dict, sample_batch_size: int) -> Any:
            from verl.utils.debug import marked_timer

            with marked_timer("gen", timing_raw):  # as verl's own _step_once times sampling
                batch, sampler_metrics = self.replay_buffer.sample(
                    global_steps=self.global_steps, partition_id="train",
                    batch_size=sample_batch_size,
                )
            metrics.update(sampler_metrics)
            self.batches.append(batch)
            self.balanced.append(self._balance_batch(batch, metrics=metrics))
            if self.runs_update:
                with marked_timer("update_actor", timing_raw):
                    self._update_actor(self.balanced[-1], metrics=metrics)
            return self.balanced[-1]

    return SamplingTrainer


class ActorRanks:
    """verl's actor worker group at ``dp`` data-parallel ranks as ``update_actor`` reaches them:
    verl's dispatch split of the batch, then ``TrainingWorker.train_mini_batch`` on each rank.
    Only the FSDP engine (GPU) stands in: it records the mini-batches it is handed to train on,
    as the uids of their samples, in ``mini_batches[rank]``."""

    def __init__(self, dp: int, update_s: float = 0.0):
        self.dp = dp
        self.update_s = update_s  # the update held to these seconds, the ranks' own work included
        self._dispatch_info = {"actor": list(range(dp))}
        self.mini_batches: list[list[list[str]]] = [[] for _ in range(dp)]
        self.versions: list[list[int]] = []  # per update: each handed sample's weights version

    def update_actor(self, batch: Any) -> Any:
        from verl.single_controller.base.decorator import _split_args_kwargs_data_proto
        from verl.utils import transferqueue_utils
        from verl.workers.engine_workers import TrainingWorker

        transferqueue_utils.TQ_INITIALIZED = True  # this process's client is up (the fixture)
        start = time.perf_counter()
        (chunks,), _ = _split_args_kwargs_data_proto(self.dp, batch)
        outputs = [
            TrainingWorker.train_mini_batch(RankWorker(rank, self), chunk)
            for rank, chunk in enumerate(chunks)
        ]
        self.versions.append(_handed_versions(batch))
        time.sleep(max(0.0, self.update_s - (time.perf_counter() - start)))  # held to update_s
        return outputs[0]


def _handed_versions(batch: Any) -> list[int]:
    """The weights version (``min_global_steps``: the oldest a sample was generated with) of
    each real sample of the batch ``update_actor`` is handed, from its ``extra_fields``."""
    import transfer_queue as tq

    keys = [k for k, tag in zip(batch.keys, batch.tags) if not tag.get("is_padding", False)]
    data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=["extra_fields"])
    return [int(fields["min_global_steps"]) for fields in data["extra_fields"]]


class RankWorker:
    """The parts of a ``TrainingWorker`` that ``train_mini_batch`` calls: its engine's
    data-parallel coordinates, and ``train_batch``, which records the mini-batch."""

    def __init__(self, rank: int, ranks: ActorRanks):
        self.rank, self.ranks = rank, ranks
        self.profiler = SimpleNamespace(step=lambda: None)
        self.engine = SimpleNamespace(
            get_data_parallel_size=lambda: ranks.dp,
            get_data_parallel_rank=lambda: rank,
            get_data_parallel_group=lambda: None,
            is_mp_src_rank_with_outputs=lambda: True,
            train_mode=lambda **_: contextlib.nullcontext(),
        )

    def train_batch(self, mini_batch: Any) -> Any:
        from verl.utils import tensordict_utils as tu

        self.ranks.mini_batches[self.rank].append(list(mini_batch["uid"]))
        return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": {"mfu": 0.0}})


class Harness:
    """verl's agent-loop worker on its own event loop, fed by verl's trainer."""

    def __init__(
        self,
        config: Any,
        model_dir: Path,
        reply: Callable[[str], str] | None,
        dp: int = 2,
        update_s: float | None = None,
        ranks: Any = None,
    ):
        """``update_s``: None stops each step after the balance; seconds make it also run verl's
        ``_update_actor`` on ranks whose update takes that long. ``ranks`` given (e.g.
        :class:`RemoteRanks`), the trainer is the whole rehearsal step
        (:func:`rehearsal_trainer_class`) on them and ``reply=None`` lets the model sample."""
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
        from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

        # our loop registers its name on import: import it before the worker reads the run's
        # loop registry file, whose entry (with the recipe path) must be the one that stays
        import prour.train.verl_ext.agent_loop  # noqa: F401

        self.config = config
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        from prour.train.verl_ext.logic import generation_budget

        rollout = config.actor_rollout_ref.rollout
        self.server = RolloutServer(
            model, self.tokenizer, reply, lambda n, params: generation_budget(n, params, rollout)
        )
        self.submitted: list[int] = []  # prompts per generate_sequences call
        self.prompt_uids: list[str] = []  # the states in the order the trainer submitted them
        self.rolled: dict[str, Any] = {}  # trajectory key -> SampleInfo, as rolled out
        self.after_rollout: Callable[[], None] | None = None
        methods = AgentLoopWorkerTQ.__ray_metadata__.modified_class  # the class under @ray.remote

        class Worker(AgentLoopWorker):  # AgentLoopWorkerTQ's own methods, in this process
            generate_sequences = methods.generate_sequences
            _run_prompt = methods._run_prompt
            _agent_loop_postprocess = methods._agent_loop_postprocess

        self.worker = Worker(config, self.server)
        self.worker.background_tasks = set()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        mode = config.trainer.v1.trainer_mode
        if ranks is None:
            self.trainer = trainer_class(mode)(
                config, self.tokenizer, self, dp, update_s is not None
            )
            self.trainer.actor_rollout_wg.update_s = update_s or 0.0
        else:
            self.trainer = rehearsal_trainer_class(mode)(config, self.tokenizer, self, ranks)
        self.overlapped = self.trainer.trainer_mode != "sync"
        self.began = False

    def generate_sequences(self, batch: Any) -> None:
        """``AgentLoopManagerTQ.generate_sequences`` for one worker: run to completion; for an
        overlapping trainer only started (verl's manager returns once the sessions are spawned)."""
        if self.overlapped:
            self.prompt_uids.extend(str(uid) for uid in batch["uid"])
            spawn = self.worker.generate_sequences(batch)
            asyncio.run_coroutine_threadsafe(spawn, self.loop).result(60)
            self.submitted.append(len(batch))
            return

        async def rollout() -> None:
            await self.worker.generate_sequences(batch)
            while self.worker.background_tasks:
                await asyncio.gather(*list(self.worker.background_tasks), return_exceptions=True)

        self.prompt_uids.extend(str(uid) for uid in batch["uid"])
        asyncio.run_coroutine_threadsafe(rollout(), self.loop).result(300)
        self.submitted.append(len(batch))
        self._snapshot()
        if self.after_rollout is not None:
            self.after_rollout()

    def _snapshot(self) -> None:
        """Record every trajectory's reward facts before the sampler drops any."""
        import transfer_queue as tq

        from prour.train.verl_ext.logic import sample_info

        listing = (tq.kv_list("train") or {}).get("train", {})
        keys = [
            k for k, tag in listing.items() if not tag.get("is_prompt") and k not in self.rolled
        ]
        if keys:
            values = self.fields(keys, ["extra_fields"])["extra_fields"]
            self.rolled.update({k: sample_info(v) for k, v in zip(keys, values)})

    def step(self) -> tuple[Any, dict[str, Any]]:
        """One verl training step (``PPOTrainer.step``, timed and hooked as verl's ``fit`` does,
        then our trainer's phase metrics); the sampled batch and step metrics."""
        from verl.utils.debug import marked_timer

        if not self.began:  # verl's fit, before its first step
            self.trainer.on_train_begin()
            self.began = True
        metrics: dict[str, Any] = {}
        self.timing_raw: dict[str, float] = {}
        self.trainer.timing_raw = self.timing_raw
        with marked_timer("step", self.timing_raw):
            self.trainer.on_step_begin()
            balanced = self.trainer.step(metrics, self.timing_raw)
            self.trainer.on_step_end()
        metrics.update(self.trainer.phase_metrics(self.timing_raw))
        self.trainer.global_steps += 1
        return balanced, metrics

    def fields(self, keys: list[str], names: list[str]) -> Any:
        import transfer_queue as tq

        return tq.kv_batch_get(keys=keys, partition_id="train", select_fields=names)

    def clear(self) -> None:
        """Empty the train partition (verl's ``fit`` clears each step's batch after the update)."""
        import transfer_queue as tq

        keys = list(((tq.kv_list("train") or {}).get("train") or {}).keys())
        if keys:
            tq.kv_clear(keys=keys, partition_id="train")

    def close(self) -> None:
        """End the sessions started ahead of a step that never came and empty the partition.
        After a stop was asked (SIGINT/SIGTERM) the sessions are cancelled instead, waited for
        :data:`STOP_WAIT_S` at most, and the rest is left to the end of the process: in a Slurm
        job the job's SIGTERM reaches Ray's own processes as well, whose answers then never
        come (waiting for them held the driver past Slurm's KillWait, which killed it before its
        report and exit 130). The loop keeps running then, so that no pending session is torn
        down half-way at exit."""
        from prour.train.verl_ext import ray_signals

        stopping = ray_signals.stop_asked()

        async def settle() -> None:
            while self.worker.background_tasks:
                tasks = list(self.worker.background_tasks)
                for task in tasks if stopping else ():
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                self.worker.background_tasks.difference_update(tasks)

        try:
            asyncio.run_coroutine_threadsafe(settle(), self.loop).result(
                STOP_WAIT_S if stopping else 300)
        except TimeoutError:
            if not stopping:
                raise
        if stopping:
            return
        self.clear()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


# ---- the rehearsal entry: real updates on Ray actors, one data-parallel rank per node ----------


def rehearsal_trainer_class(mode: str | None = None) -> type:
    """The sampling trainer carried through the rest of verl's step: old log-probs (verl's
    bypass mode: the rollout's own, which the sampling :class:`RolloutServer` computes),
    verl's advantages, and verl's ``_update_actor`` on the rank actors."""
    base = trainer_class(mode)

    class RehearsalTrainer(base):  # type: ignore[misc, valid-type]
        def __init__(self, config: Any, tokenizer: Any, manager: Any, ranks: Any):
            super().__init__(config, tokenizer, manager, ranks.dp)
            self.actor_rollout_wg = ranks
            self.checkpoint_manager = RankWeightSync(manager.server, ranks)

        def _step_once(self, metrics: dict, timing_raw: dict, sample_batch_size: int) -> Any:
            from verl.utils.debug import marked_timer

            batch = super()._step_once(metrics, timing_raw, sample_batch_size)
            with marked_timer("old_log_prob", timing_raw):
                batch = self._compute_old_log_prob(batch, metrics=metrics)
            with marked_timer("adv", timing_raw):
                batch = self._compute_advantage(batch, metrics=metrics)
            with marked_timer("update_actor", timing_raw):
                batch = self._update_actor(batch, metrics=metrics)
            return batch

    return RehearsalTrainer


class RankWeightSync(WeightSync):
    """verl's weight sync (its ``on_step_end`` calls ``update_weights``) from rank 0's policy
    into the sampling :class:`RolloutServer`."""

    def __init__(self, server: RolloutServer, ranks: RemoteRanks):
        super().__init__(server)
        self.ranks = ranks

    def update_weights(self, global_steps: int) -> dict:
        import ray

        out = super().update_weights(global_steps)
        self.server.load_weights(ray.get(self.ranks.actors[0].state.remote()), global_steps)
        return out


class RemoteRanks:
    """verl's actor worker group over :class:`~prour.train.verl_ext.policy_rank.PolicyRank` Ray
    actors: verl's dispatch split of the batch, one chunk per rank; ``mini_batches[rank]``
    gathers the uids of each optimizer mini-batch every rank trained on."""

    def __init__(self, actors: list[Any]):
        self.actors = actors
        self.dp = len(actors)
        self._dispatch_info = {"actor": list(range(self.dp))}
        self.mini_batches: list[list[list[str]]] = [[] for _ in range(self.dp)]

    def update_actor(self, batch: Any) -> Any:
        import ray
        from verl.single_controller.base.decorator import _split_args_kwargs_data_proto

        (chunks,), _ = _split_args_kwargs_data_proto(self.dp, batch)
        outputs = ray.get([a.train.remote(c) for a, c in zip(self.actors, chunks, strict=True)])
        for rank, (_, seen) in enumerate(outputs):
            self.mini_batches[rank].extend(seen)
        return outputs[0][0]


def one_state_per_mini_batch(ranks: list[list[list[str]]]) -> int:
    """Check that the i-th optimizer mini-batch of every rank holds samples of one and the same
    state (padding aside); returns how many mini-batches each rank ran."""
    counts = {len(r) for r in ranks}
    if len(counts) != 1:
        raise RuntimeError(f"the ranks ran different numbers of mini-batches: {sorted(counts)}")
    for i, parts in enumerate(zip(*ranks, strict=True)):
        states = {uid for part in parts for uid in part if not str(uid).startswith("pad")}
        if len(states) != 1:
            raise RuntimeError(f"mini-batch {i} mixes states across the ranks: {sorted(states)}")
    return counts.pop()


def rank_nodes(nodes: list[dict[str, Any]], dp: int) -> list[str]:
    """Ray node ids for ``dp`` ranks, one rank per node (the head's first, rank 0 beside the
    driver), from ``ray.nodes()``'s alive entries. The ranks take no CPU of Ray's count
    (TransferQueue's controller and storage unit take one each, and a CPU head may have 2)."""
    if len(nodes) < dp:
        raise RuntimeError(f"{dp} data-parallel ranks need {dp} Ray nodes, one each; the Ray "
                           f"cluster has {len(nodes)} (train.verl.nnodes x n_gpus_per_node)")
    head = [n for n in nodes if n.get("Resources", {}).get("node:__internal_head__")]
    rest = sorted((n for n in nodes if n not in head), key=lambda n: n["NodeManagerAddress"])
    return [n["NodeID"] for n in (head + rest)[:dp]]


def rehearse(recipe: Any, cfg: Any) -> Path | None:
    """``prour train`` with ``train.verl.engine: cpu_rehearsal``: the recipe's verl run on CPU
    against the Ray cluster at ``RAY_ADDRESS`` (a local Ray of 2 CPUs without it).

    verl's trainer code (sampler, agent loop, TransferQueue, advantages, ``_update_actor``)
    drives :class:`~prour.train.verl_ext.policy_rank.PolicyRank` actors, one per node (node affinity, :func:`rank_nodes`) at
    verl's data-parallel size (``train.verl``: nodes x GPUs per node). The rollout is the
    policy sampling in this process (:class:`RolloutServer`), synced to rank 0's weights after
    every step; the frozen responders come from the recipe's roles as in the real run. Each
    step saves ``step_N`` and appends its line to ``metrics.jsonl``; a start with checkpoints
    under ``train.output_dir`` resumes after the newest (the dataloader starts over). Returns
    the last checkpoint.
    """
    import os

    import ray
    import transfer_queue as tq
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    from prour.config.train import actor_dp_size
    from prour.train import checkpoint as ckpt
    from prour.train.verl_backend import compose_verl_config, prepare_verl_run
    from prour.train.verl_ext import ray_signals
    from prour.train.verl_ext.policy_rank import PolicyRank

    newest = ckpt.latest_checkpoint(cfg.output_dir)
    done = ckpt.load_trainer_state(newest)["step"] if newest is not None else 0
    run = prepare_verl_run(recipe, cfg, write=True, resume=newest is not None)
    config = compose_verl_config(run.overrides + [
        "data.dataloader_num_workers=0", "algorithm.rollout_correction.bypass_mode=true"])
    OmegaConf.resolve(config)
    output_dir = Path(cfg.output_dir)
    catch_up_metrics(output_dir, newest)
    policy_dir = str(newest or config.actor_rollout_ref.model.path)
    if done >= cfg.total_steps:
        print(f"[rehearsal] {newest} is step {done} of {cfg.total_steps}: nothing to train")
        return newest
    print(f"[rehearsal] steps {done + 1}..{cfg.total_steps} from {policy_dir}", flush=True)
    runtime_env = OmegaConf.merge(get_ppo_ray_runtime_env(config),
                                  config.ray_kwargs.ray_init.runtime_env)
    address = os.environ.get("RAY_ADDRESS")
    ray_signals.init(address=address or None, num_cpus=None if address else 2,
                     include_dashboard=False, runtime_env=OmegaConf.to_container(runtime_env))
    harness = None
    try:
        nodes = [n for n in ray.nodes() if n["Alive"]]
        print(f"[rehearsal] Ray cluster of {len(nodes)} node(s): "
              + ", ".join(sorted(n["NodeManagerAddress"] for n in nodes)), flush=True)
        dp = actor_dp_size(cfg.verl)
        actors = [
            ray.remote(num_cpus=0)(PolicyRank).options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
            ).remote(r, dp, policy_dir, cfg.model_dump(), str(output_dir))
            for r, node_id in enumerate(rank_nodes(nodes, dp))
        ]
        wheres = ray.get([a.where.remote() for a in actors])
        for where in wheres:
            print(f"[rehearsal] rank {where['rank']} on node {where['node']} "
                  f"{where['address']} (pid {where['pid']})", flush=True)
        address0, port = ray.get(actors[0].rendezvous.remote())
        ray.get([a.join.remote(address0, port) for a in actors])
        tq.init(OmegaConf.merge(
            config.transfer_queue, {"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
        ranks = RemoteRanks(actors)
        harness = Harness(config, Path(policy_dir), None, dp, ranks=ranks)
        harness.server.version = done  # the weights after the last saved step
        current = [done + 1]
        try:
            return _steps(harness, ranks, actors, cfg, output_dir, done, newest, current)
        except ray.exceptions.RayActorError as exc:
            gone = rank_of(actors, wheres, exc)
            raise RankLostError(
                f"{gone or 'a policy rank'} died during step {current[0]}: "
                f"{str(exc).splitlines()[0]}; newest checkpoint "
                f"{ckpt.latest_checkpoint(output_dir) or 'none'} (a rerun resumes from it)"
            ) from None
    finally:
        if harness is not None:
            harness.close()
        if not ray_signals.stopped_with_ray():  # else its storage actors cannot answer
            with contextlib.suppress(Exception):
                tq.close()
        ray_signals.shutdown()  # ray.shutdown would put SIGTERM's default action back


class RankLostError(RuntimeError):
    """A policy rank's actor (or its node) died mid-run; the message names it and the newest
    checkpoint."""


def rank_of(actors: list[Any], wheres: list[dict[str, Any]], exc: Exception) -> str | None:
    """'rank R on node N (address)' of the actor ``exc`` is about, when it says."""
    actor_id = getattr(exc, "actor_id", None)
    for actor, where in zip(actors, wheres, strict=True):
        if actor_id is not None and actor._actor_id.hex() == actor_id:
            return f"rank {where['rank']} on node {where['node']} ({where['address']})"
    return None


def catch_up_metrics(output_dir: Path, newest: Path | None) -> None:
    """The newest checkpoint's metrics line appended when ``metrics.jsonl`` lacks it (the run
    stopped between the save and the append, or mid-append: the torn line is cut off first):
    with it, every saved step has its line once."""
    from prour.files import append_jsonl, repair_torn_tail
    from prour.train import checkpoint as ckpt
    from prour.train.metrics import METRICS_FILE

    path = output_dir / METRICS_FILE
    repair_torn_tail(path, "the step's metrics line is written again")
    if newest is None:
        return
    record = ckpt.load_trainer_state(newest).get("metrics")
    lines = path.read_text().splitlines() if path.is_file() else []
    logged = {json.loads(line).get("step") for line in lines if line.strip()}
    if record is not None and record["step"] not in logged:
        append_jsonl(path, record)


def _steps(harness: Harness, ranks: RemoteRanks, actors: list[Any], cfg: Any, output_dir: Path,
           done: int, last: Path | None, current: list[int]) -> Path | None:
    """Steps ``done + 1 .. train.total_steps``: each verl step (its end syncs the rollout's
    weights, :class:`RankWeightSync`), the one-state check, the ranks' weights compared, the
    checkpoint (holding the step's metrics line), then that line in ``metrics.jsonl``.
    ``current[0]`` is the step under way."""
    import ray

    from prour.files import append_jsonl
    from prour.train.metrics import METRICS_FILE

    dp = ranks.dp
    for step in range(done + 1, cfg.total_steps + 1):
        current[0] = step
        harness.trainer.global_steps = step
        ranks.mini_batches = [[] for _ in range(dp)]
        _, metrics = harness.step()
        count = one_state_per_mini_batch(ranks.mini_batches)
        harness.clear()
        digests = ray.get([a.digest.remote() for a in actors])
        print(f"[rehearsal] step {step} weights: " + ", ".join(
            f"rank {r} {d}" for r, d in enumerate(digests)), flush=True)
        if len(set(digests)) != 1:
            raise RuntimeError(f"step {step}: the ranks' weights differ: {digests}")
        record = {"step": step, "weights_sha256": digests[0], "mini_batches": count}
        record.update({k: float(v) for k, v in metrics.items()
                       if isinstance(v, int | float) and not isinstance(v, bool)})
        last = Path(ray.get(actors[0].save.remote(step, record)))
        append_jsonl(output_dir / METRICS_FILE, record)
        print(f"[rehearsal] step {step}/{cfg.total_steps}: {count} mini-batches of one state "
              f"on each of {dp} ranks; weights {digests[0][:12]} on every rank; {last}",
              flush=True)
    return last
