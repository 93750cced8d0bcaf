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
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from omegaconf import OmegaConf


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
    return the model's prompt log-probs in verl's ``extract_prompt_logprobs`` layout.
    """

    def __init__(self, model: Any, tokenizer: Any, reply: Callable[[str], str]):
        self.model = model
        self.tokenizer = tokenizer
        self.reply = reply
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
        ids = self.tokenizer(self.reply(text), add_special_tokens=False)["input_ids"]
        ids = ids + [self.tokenizer.eos_token_id]
        with self._lock:
            self.sampled_tokens += len(ids)
        logprobs = [-0.5] * len(ids) if sampling_params.get("logprobs") else None
        return TokenOutput(
            token_ids=ids, log_probs=logprobs, stop_reason="completed", extra_fields=extra
        )

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
        reply: Callable[[str], str],
        dp: int = 2,
        update_s: float | None = None,
    ):
        """``update_s``: None stops each step after the balance; seconds make it also run verl's
        ``_update_actor`` on ranks whose update takes that long."""
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
        from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

        self.config = config
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.server = RolloutServer(model, self.tokenizer, reply)
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
        self.trainer = trainer_class(mode)(config, self.tokenizer, self, dp, update_s is not None)
        self.trainer.actor_rollout_wg.update_s = update_s or 0.0
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
        async def settle() -> None:  # sessions started ahead of a step that never came
            while self.worker.background_tasks:
                await asyncio.gather(*list(self.worker.background_tasks), return_exceptions=True)

        asyncio.run_coroutine_threadsafe(settle(), self.loop).result(300)
        self.clear()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
