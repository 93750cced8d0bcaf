"""The local DAPO trainer: one process, CPU or one GPU, the paper's algorithm end to end.

Each step: take ``states_per_step`` instances in seeded order, sample ``n`` queries per state
with the live policy, score them with the reward (whose belief scorer is that same policy), keep
``keep`` per state (valid questions first), compute GRPO advantages within each kept group, and
run ``ppo.epochs`` passes of the clipped surrogate over mini-batches of whole states (that update
is :mod:`prour.train.step`, its maths :mod:`prour.core.policy_gradient`). Checkpoints are atomic
and resumable; metrics go to ``<output_dir>/metrics.jsonl`` (and wandb if enabled).
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from prour.config import ConfigError, Recipe
from prour.config.train import TrainConfig
from prour.llm import retry
from prour.train import checkpoint as ckpt
from prour.train.data import DataOrder, keep_modes, read_instances, row_mode
from prour.train.metrics import (
    MetricsLog,
    PhaseClock,
    ScoredSample,
    check_failed_asks,
    phase_metrics,
    sample_diagnostics,
)
from prour.train.policy import Policy, Rollout, load_policy, policy_weights
from prour.train.recipe import recipe_dict, train_section
from prour.train.reward import RewardFn, score_groups
from prour.train.step import (
    Kept,
    constant_schedule_with_warmup,
    mean_or_none,
    select_groups,
    update,
)

logger = logging.getLogger(__name__)

StateFn = Callable[[dict[str, Any]], Any]
RewardFactory = Callable[[Any], RewardFn]
"""Builds the step's reward around the LLM that scores beliefs (the live policy, or the sampler)."""

__all__ = ["Batch", "Kept", "LocalTrainer", "RewardFactory", "sample_metrics"]


@dataclass
class Batch:
    """A step's sampled and scored states, with the policy version (updates done) that sampled."""

    rows: list[dict[str, Any]]
    rollouts: list[list[Rollout]]
    rewards: list[list[ScoredSample]]
    version: int
    time_rollout_s: float
    time_reward_s: float


class LocalTrainer:
    """Trains ``models.generator`` with ``train`` settings; see :meth:`run`.

    The reward is ``reward_fn`` when given, else ``reward_factory(policy_llm)`` (the entry hands
    down the recipe's information-gain reward: :func:`prour.build.recipe_reward`).
    """

    def __init__(
        self,
        recipe: Recipe,
        train: TrainConfig | None = None,
        reward_fn: RewardFn | None = None,
        make_state: StateFn | None = None,
        rows: Sequence[dict[str, Any]] | None = None,
        reward_factory: RewardFactory | None = None,
    ):
        if train is not None:  # a train section given apart: the run's recipe holds it, its
            # paths taken from run_dir like the rest (validation applies the path rule)
            recipe = Recipe.model_validate({**recipe.model_dump(), "train": train.model_dump()})
        self.recipe = recipe
        self.cfg = train_section(recipe)
        self.output_dir = Path(self.cfg.output_dir)
        self._reward_fn = reward_fn
        self._given_reward = reward_fn
        self._reward_factory = reward_factory
        self._make_state = make_state
        self._rows = list(rows) if rows is not None else None
        self.step = 0

    # ---- setup ---------------------------------------------------------------------------

    def _policy_path(self) -> str:
        return policy_weights(self.recipe)

    def _setup_model(self, path: str | Path) -> None:
        """Load the policy in float32 (master weights); bf16 autocast on a GPU when asked."""
        self.policy, self.compute_dtype = load_policy(path, self.cfg, self.recipe)
        self.model, self.tokenizer = self.policy.model, self.policy.tokenizer

    def _setup_optimizer(self) -> None:
        """AdamW and a constant schedule with linear warmup (one scheduler step per step)."""
        o = self.cfg.optim
        params = [p for p in self.model.parameters() if p.requires_grad]
        fused = {"fused": True} if self.cfg.update.fused_optimizer else {}
        try:
            self.optimizer = torch.optim.AdamW(
                params, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay, **fused
            )
        except RuntimeError as error:  # torch names the devices/dtypes its fused kernel takes
            raise ConfigError(
                "train.update.fused_optimizer",
                f"torch's fused AdamW does not run here ({error}); set it to false",
            ) from error
        self.scheduler = constant_schedule_with_warmup(self.optimizer, o.warmup_steps)

    def _setup_data(self) -> None:
        """Seeded order over the rows; every prompt is checked against the token budget."""
        self.order = DataOrder(len(self._rows), self.recipe.seed)
        for index, row in enumerate(self._rows):
            self.policy.check_prompt(row["prompt"], f"training row {index}")
        logger.info("%d training instances", len(self._rows))

    def _train_file(self) -> Path:
        return Path(self.cfg.train_file)

    def _setup_reward(self) -> None:
        if self._make_state is None:
            from prour.data.schema import state_from_row

            self._make_state = state_from_row
        if self._reward_fn is None:
            self._reward_fn = self._reward_for(self.policy.llm)

    def _reward_for(self, policy_llm: Any) -> RewardFn:
        """The factory's reward whose belief scorer is ``policy_llm``."""
        if self._reward_factory is None:
            raise ValueError(
                "LocalTrainer needs a reward_fn or a reward_factory (the recipe's reward: "
                "prour.build.recipe_reward(recipe))"
            )
        return self._reward_factory(policy_llm)

    def _setup_metrics(self) -> None:
        self.metrics = MetricsLog(
            self.output_dir,
            self.cfg.wandb,
            run_name=self.recipe.name,
            config=recipe_dict(self.recipe),
        )

    def setup(self, resume: bool = False) -> Path | None:
        """Load everything; with ``resume`` continue from the newest finished checkpoint."""
        ckpt.remove_temporaries(self.output_dir)
        start = ckpt.latest_checkpoint(self.output_dir)
        if start is not None and not resume:
            raise FileExistsError(
                f"{self.output_dir} already holds checkpoints (newest {start.name}); "
                "pass --resume to continue that run or set train.output_dir to a new folder"
            )
        if self._rows is None:  # read before any model loads: a missing file fails fast
            self._rows = read_instances(self._train_file())
        self._rows = keep_modes(self._rows, self.cfg.modes, str(self._train_file()))
        self._setup_model(start or self._policy_path())
        self._setup_optimizer()
        if self._rows:  # an empty train file: nothing to order or score (see run)
            self._setup_data()
            self._setup_reward()
        self._setup_metrics()
        if start is not None:
            self._restore(start)
        if self.cfg.overlap != "off" and self._rows:
            self._setup_sampler()
        self._write_provenance(start)
        return start

    def _setup_sampler(self) -> None:
        """train.overlap: a frozen copy of the policy samples and scores the next step in a
        background thread while this one updates (it costs one more copy of the weights)."""
        import copy
        from concurrent.futures import ThreadPoolExecutor

        model = copy.deepcopy(self.model).eval()
        model.requires_grad_(False)
        self._sampler = Policy(model, self.tokenizer, self.cfg.rollout,
                               self.recipe.data.max_prompt_tokens, seed=self.recipe.seed)
        self._sampler_version = self.step
        self._sampler_reward = self._reward_fn
        if self._given_reward is None:  # the factory's reward scores beliefs with the sampler
            self._sampler_reward = self._reward_for(self._sampler.llm)
        elif getattr(self._given_reward, "policy_llm", None) is self.policy.llm:
            raise ValueError(
                "train.overlap: the given reward scores beliefs with the live policy, which "
                "updates while the next step is scored; give no reward_fn (the recipe's reward "
                "is built for the sampler) or one that does not score with the policy"
            )
        if isinstance(getattr(self._sampler_reward, "clock", None), PhaseClock):
            self._sampler_reward.clock = self._clock()  # its phases go into the step's times
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="prour-overlap")
        self._next: tuple[int, Any] | None = None  # (step, future of its Batch)

    def _sync_sampler(self) -> None:
        """Copy the policy's current weights into the sampler (no background sampling runs)."""
        with torch.no_grad():
            for dst, src in zip(self._sampler.model.parameters(), self.model.parameters()):
                dst.copy_(src)
        self._sampler_version = self.step
        self._sampler_reward.policy_updated()

    def _restore(self, folder: Path) -> None:
        state = ckpt.load_trainer_state(folder)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        ckpt.restore_rng(state["rng"])
        self.step = int(state["step"])
        dropped = self.metrics.truncate_after(self.step)
        logger.info(
            "resumed from %s (step %d; %d later metric lines dropped)", folder, self.step, dropped
        )

    def _write_provenance(self, resumed_from: Path | None) -> None:
        from prour.provenance import write_provenance

        write_provenance(
            self.output_dir,
            self.recipe,
            extra={
                "resumed_from": str(resumed_from) if resumed_from else None,
                "start_step": self.step,
            },
        )

    # ---- the loop ------------------------------------------------------------------------

    def run(self, resume: bool = False, progress: bool | None = None) -> Path | None:
        """Train to ``total_steps``; returns the last checkpoint folder. ``progress``: draw the
        progress bar (default: when stderr is a terminal)."""
        from prour.train.progress import StepProgress

        self.setup(resume=resume)
        last = ckpt.latest_checkpoint(self.output_dir)
        try:
            if not self._rows:
                return self._save_untrained()
            with StepProgress(self.cfg.total_steps, self.step, enabled=progress) as bar:
                last = self._loop(bar) or last
        finally:
            pool = getattr(self, "_pool", None)
            if pool is not None:  # a sampled-ahead step is dropped (a resume samples it again)
                pool.shutdown(wait=True, cancel_futures=True)
            self.metrics.close()
        return last

    @property
    def untrained(self) -> bool:
        """Whether the train file holds no state (run saves the initial policy, untrained)."""
        return not self._rows

    def _save_untrained(self) -> Path:
        """An empty train file (extract routed no state to clarify or verify): no update can be
        made, so the initial policy is saved as the final step, its trainer state saying why,
        and export and eval still run (the checkpoint then equals the initial policy)."""
        logger.warning(
            "lacking: %s holds no training state: no update was made; the initial policy is saved "
            "as step %d, untrained", self._train_file(), self.cfg.total_steps,
        )
        self.step = self.cfg.total_steps
        state = {
            "step": self.step,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": ckpt.rng_state(),
            "data": {"seed": self.recipe.seed, "n_rows": 0, "position": (0, 0)},
            "untrained": f"{self._train_file()} holds no training state",
        }
        return ckpt.save_checkpoint(self.output_dir, self.step, self.model, self.tokenizer, state)

    def _loop(self, bar: Any) -> Path | None:
        """Steps up to ``total_steps``: metrics line, log line, bar, checkpoint when due."""
        last = None
        while self.step < self.cfg.total_steps:
            metrics = self.train_step()
            self.metrics.log(self.step, metrics)
            bar.advance(self.step, metrics["reward_mean"])
            logger.info(
                "step %d/%d reward %s kept %d lr %.3g (%.1fs)",
                self.step,
                self.cfg.total_steps,
                metrics["reward_mean"],
                metrics["n_kept"],
                metrics["lr"],
                metrics["time_step_s"],
            )
            if self.step % self.cfg.save_every == 0 or self.step == self.cfg.total_steps:
                last = self.save()
        return last

    def save(self) -> Path:
        state = {
            "step": self.step,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": ckpt.rng_state(),
            "data": {
                "seed": self.order.seed,
                "n_rows": self.order.n_rows,
                "position": self.order.position(self.step, self.cfg.states_per_step),
            },
        }
        folder = ckpt.save_checkpoint(self.output_dir, self.step, self.model, self.tokenizer, state)
        ckpt.prune_checkpoints(self.output_dir, self.cfg.keep_checkpoints)
        return folder

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.compute_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.policy.device.type, dtype=self.compute_dtype)

    def train_step(self) -> dict[str, Any]:
        """One training step on the next ``states_per_step`` instances; returns its metrics,
        with the seconds of every phase (:data:`~prour.train.metrics.PHASE_KEYS`: the reward's
        clock times its scoring and responder calls). With ``train.overlap`` the next step's
        sampling runs during this step's update: the phases share the step's seconds (each
        counted within the step's window), and ``waiting`` is the rest. What the served models'
        requests cost within the step's window (attempts, failures, retries, requests given up
        and the error share per role: :func:`prour.llm.retry.step_metrics`) is counted too."""
        clock = self._clock()
        requests_before = retry.snapshot()
        t0 = time.perf_counter()
        clock.take(until=t0)  # nothing from before this step
        batch = self._batch()
        # responders down: stop before an update on what is left (train.max_failed_ask_fraction)
        check_failed_asks([s for group in batch.rewards for s in group],
                          self.cfg.max_failed_ask_fraction, len(batch.rows))
        t1 = time.perf_counter()
        staleness = self.step - batch.version
        if staleness > (self.cfg.max_staleness if self.cfg.overlap != "off" else 0):
            raise RuntimeError(f"step {self.step}: samples of policy version {batch.version} "
                               f"are {staleness} updates old (train.max_staleness)")
        self._sample_ahead()
        rollouts, rewards = batch.rollouts, batch.rewards
        with self._autocast():
            groups, select_stats = self._select(rollouts, rewards)
            with clock.timed("update"):
                update = self._update(groups)
        lr = self.optimizer.param_groups[0]["lr"]  # the rate this step's updates used
        self.scheduler.step()
        self.step += 1
        t3 = time.perf_counter()
        metrics = sample_metrics(rollouts, rewards, [row_mode(row) for row in batch.rows])
        metrics.update(select_stats)
        metrics.update(update)
        n_generated = sum(len(r.response_ids) for g in rollouts for r in g)
        n_tokens = n_generated + sum(len(r.prompt_ids) for g in rollouts for r in g)
        clock.count("generation_tokens", n_generated)
        metrics.update(phase_metrics(*clock.take(since=t0, until=t3), t3 - t0))
        metrics.update(
            time_rollout_s=batch.time_rollout_s,
            time_reward_s=batch.time_reward_s,
            time_sample_wait_s=t1 - t0,  # the step's wait for its samples (with overlap off:
            # all of sampling and scoring)
            rollout_tokens_per_s=n_generated / max(batch.time_rollout_s, 1e-9),
            # verl's perf/throughput on one device: prompt + response tokens per step second
            throughput_tokens_per_s=n_tokens / max(t3 - t0, 1e-9),
            sample_policy_version=batch.version,
            sample_staleness=staleness,
            lr=lr,
        )
        metrics.update(retry.step_metrics(retry.since(requests_before)))
        return metrics

    def _clock(self) -> PhaseClock:
        """The step clock: the reward's own (it times its scoring and responder calls), else
        the trainer's (a reward without one: its time is waiting)."""
        clock = getattr(self._reward_fn, "clock", None)
        if not isinstance(clock, PhaseClock):
            clock = self.__dict__.setdefault("_own_clock", PhaseClock())
        return clock

    def _batch(self) -> Batch:
        """This step's samples: sampled ahead during the last update, or now by the policy."""
        if self.cfg.overlap != "off" and self._next is not None:
            step, future = self._next
            self._next = None
            if step == self.step:
                return future.result()
        return self._generate(self.step, self.policy, self._reward_fn, self.step)

    def _sample_ahead(self) -> None:
        """With overlap, start sampling step + 1 on the sampler, re-synced first when its weights
        would be more than ``max_staleness`` updates old by the time step + 1 updates."""
        if self.cfg.overlap == "off" or self.step + 1 >= self.cfg.total_steps:
            return
        if self._sampler_version < self.step + 1 - self.cfg.max_staleness:
            self._sync_sampler()
        future = self._pool.submit(self._generate, self.step + 1, self._sampler,
                                   self._sampler_reward, self._sampler_version)
        self._next = (self.step + 1, future)

    def _generate(self, step: int, policy: Policy, reward_fn: RewardFn, version: int) -> Batch:
        """Sample and score step ``step``'s states with ``policy`` (weights of ``version``)."""
        rows = [self._rows[i] for i in self.order.indices(step, self.cfg.states_per_step)]
        with self._autocast():
            t0 = time.perf_counter()
            rollouts = self._rollout(rows, step, policy)
            t1 = time.perf_counter()
            self._clock().add_interval("generation", t0, t1)
            rewards = self._score(rows, rollouts, policy.model, reward_fn)
        return Batch(rows, rollouts, rewards, version, t1 - t0, time.perf_counter() - t1)

    def _rollout(
        self, rows: list[dict[str, Any]], step: int, policy: Policy
    ) -> list[list[Rollout]]:
        """``rollout.n`` samples per row; row i of ``step`` draws from the stream of state
        ``step * states_per_step + i`` (the same samples whatever the overlap)."""
        return policy.sample_states([row["prompt"] for row in rows], self.cfg.rollout.n,
                                    self.recipe.seed, step * self.cfg.states_per_step)

    @torch.no_grad()
    def _score(
        self,
        rows: list[dict[str, Any]],
        rollouts: list[list[Rollout]],
        model: Any,
        reward_fn: RewardFn,
    ) -> list[list[ScoredSample]]:
        was_training = model.training
        model.eval()
        try:
            states = [self._make_state(row) for row in rows]
            groups = [[r.completion for r in group] for group in rollouts]
            return score_groups(reward_fn, states, groups)
        finally:
            model.train(was_training)

    def _select(
        self, rollouts: list[list[Rollout]], rewards: list[list[ScoredSample]]
    ) -> tuple[list[list[Kept]], dict[str, Any]]:
        """Keep ``keep`` per state (failed never), then drop groups without a usable signal."""
        return select_groups(rollouts, rewards, self.cfg.rollout.keep,
                             self.cfg.ppo.drop_zero_variance)

    # ---- the update ----------------------------------------------------------------------

    def _update(self, groups: list[list[Kept]]) -> dict[str, Any]:
        """One DAPO update (:func:`prour.train.step.update`); cached priors are then stale."""
        summary = update(groups, self.policy, self.optimizer, self.cfg, self.recipe.seed,
                         self.step)
        if groups:
            self._reward_fn.policy_updated()
        return summary


def sample_metrics(
    rollouts: list[list[Rollout]],
    rewards: list[list[ScoredSample]],
    modes: Sequence[str | None] | None = None,
) -> dict[str, Any]:
    """Counts by kind, the shared diagnostics (fractions, reward by mode — ``modes[g]`` is state
    g's mode —, prior, posterior; :func:`~prour.train.metrics.sample_diagnostics`) and response
    lengths of all samples."""
    modes = list(modes) if modes is not None else [None] * len(rewards)
    samples = [s for group in rewards for s in group]
    sample_modes = [mode for mode, group in zip(modes, rewards) for _ in group]
    values = [s.reward for s in samples if not s.failed and s.reward is not None]
    lengths = [len(r.response_ids) for group in rollouts for r in group]
    return {
        "n_states": len(rewards),
        "n_sampled": len(samples),
        "n_valid": sum(s.kind == "ask" for s in samples),
        "n_none": sum(s.kind == "none" for s in samples),
        "n_invalid": sum(s.kind == "invalid" for s in samples),
        "n_failed": sum(s.failed for s in samples),
        **sample_diagnostics(samples, sample_modes),
        "reward_std": statistics.pstdev(values) if len(values) > 1 else 0.0,
        "response_length_mean": mean_or_none(lengths),
        "truncated_fraction": mean_or_none([r.finish_reason == "length" for g in rollouts for r in g]),
    }
