"""The verl backend: ``python -m verl.trainer.main_ppo`` with Hydra overrides built from the recipe.

GRPO advantages, the clipped surrogate and FSDP updates are verl's; generation runs on vLLM
(colocated, TP 1). Our extensions (``prour.train.verl_ext``) plug in the agent loop that writes
and rewards queries, the sampler that keeps ``keep`` of ``n`` per state, the dataset that
asks for ``n`` sessions per prompt, and verl's sync trainer with optimizer mini-batches of
whole states on any number of data-parallel ranks (or, with ``train.overlap: one_step``, verl's
colocated asynchronous trainer one step ahead). Every hyperparameter comes from the
recipe's ``train`` section; nothing here is a second copy of one.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from prour.config import ConfigError, Recipe
from prour.config.train import TrainConfig
from prour.files import write_atomic
from prour.train.checkpoint import latest_verl_step, untrained_verl_step
from prour.train.recipe import train_section

logger = logging.getLogger(__name__)

VERL_ENTRY = "verl.trainer.main_ppo"
VERL_CONFIG = "ppo_trainer"
EXT = "pkg://prour.train.verl_ext"
TRAINER_MODE = "prour_state_ordered"  # verl_ext.trainer.StateOrderedTrainer's trainer_mode
ONE_STEP_TRAINER_MODE = "prour_state_ordered_one_step"  # OneStepStateOrderedTrainer (overlap)
TRAINER_REGISTER = "prour.train.verl_ext.trainer.register"
_SAFE = re.compile(r"^[A-Za-z0-9_./:+\-@]+$")


@dataclass
class VerlRun:
    """Everything a launch needs: files written into the run folder, overrides and the command."""

    output_dir: Path
    recipe_file: Path
    agent_loops_file: Path
    overrides: list[str]
    env: dict[str, str] = field(default_factory=dict)

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-m", VERL_ENTRY, *self.overrides]

    def shell(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return f"{env} {shlex.join(self.command)}".strip()


def hydra_value(value: Any) -> str:
    """A Python value in Hydra's override syntax."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    text = str(value)
    if _SAFE.match(text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _policy_path(recipe: Recipe) -> str:
    model = recipe.models.get("generator")
    if model is None or not (model.path or model.model):
        raise ConfigError(
            "models.generator",
            "the verl backend needs the initial policy's path (hub id or folder)",
        )
    from prour.llm.weights import ModelNotFound, local_weights

    name = str(model.path or model.model)
    try:
        return str(Path(local_weights(name, recipe.models_dir, "models.generator")).resolve())
    except ModelNotFound:
        return name  # a dry run shows the id; a real run stops in preflight before this


def algorithm_overrides(cfg: TrainConfig) -> dict[str, Any]:
    """GRPO with std-normalised advantages; no KL anywhere; no critic."""
    return {
        "algorithm.adv_estimator": "grpo",
        "algorithm.norm_adv_by_std_in_grpo": True,
        "algorithm.use_kl_in_reward": False,
        "critic.enable": False,
    }


def data_overrides(recipe: Recipe, cfg: TrainConfig) -> dict[str, Any]:
    train_file = cfg.train_file  # absolute: the recipe's path rule
    # train.modes: the dataset keeps those states' rows (verl_ext.dataset), as the local trainer
    modes = {"+data.prour_modes": list(cfg.modes)} if cfg.modes else {}
    return {**modes,
        "data.train_files": train_file,
        "data.val_files": cfg.val_file or train_file,
        "data.train_batch_size": cfg.states_per_step,
        "data.max_prompt_length": recipe.data.max_prompt_tokens,
        "data.max_response_length": cfg.rollout.max_response_tokens,
        "data.truncation": "error",  # histories are left-truncated by the data stage
        "data.filter_overlong_prompts": False,
        "data.return_raw_chat": True,
        "data.shuffle": True,
        "data.seed": recipe.seed,
        # verl fetches refill prompts in whole gen_batch_size chunks; dropped groups are refilled
        # one prompt at a time (verl sets 1 itself only for its own filter_groups).
        "data.gen_batch_size": 1 if cfg.ppo.drop_zero_variance else cfg.states_per_step,
        "data.custom_cls.path": f"{EXT}.dataset",
        "data.custom_cls.name": "ProurRLDataset",
        "+data.prour_sample_n": cfg.rollout.n,
        "+data.apply_chat_template_kwargs.enable_thinking": cfg.rollout.enable_thinking,
    }


def actor_overrides(recipe: Recipe, cfg: TrainConfig) -> dict[str, Any]:
    o, p, v = cfg.optim, cfg.ppo, cfg.verl
    a = "actor_rollout_ref.actor"
    return {
        "actor_rollout_ref.model.path": _policy_path(recipe),
        "actor_rollout_ref.model.enable_gradient_checkpointing": cfg.gradient_checkpointing,
        "actor_rollout_ref.model.use_remove_padding": v.use_remove_padding,
        # verl's chunked log-prob/entropy from hidden states and LM head (train and log-prob
        # passes alike; verl reads both keys from the model section).
        "actor_rollout_ref.model.use_fused_kernels": v.use_fused_kernels,
        "actor_rollout_ref.model.fused_kernel_options.impl_backend": v.fused_kernels_backend,
        "+actor_rollout_ref.model.override_config.attn_implementation": v.attn_implementation,
        f"{a}.fsdp_config.strategy": v.fsdp_strategy,  # verl picks the FSDP engine from this
        f"{a}.fsdp_config.ulysses_sequence_parallel_size": v.ulysses_sequence_parallel_size,
        f"{a}.ulysses_sequence_parallel_size": v.ulysses_sequence_parallel_size,  # ref + checks
        f"{a}.optim.lr": o.lr,
        f"{a}.optim.lr_warmup_steps": o.warmup_steps,
        f"{a}.optim.lr_scheduler_type": "constant",
        f"{a}.optim.weight_decay": o.weight_decay,
        f"{a}.optim.betas": list(o.betas),
        f"{a}.optim.clip_grad": o.grad_clip,
        f"{a}.ppo_epochs": p.epochs,
        # In prompts; verl multiplies by rollout.n (= keep): one state's kept samples.
        f"{a}.ppo_mini_batch_size": p.mini_batch_states,
        f"{a}.ppo_micro_batch_size_per_gpu": p.micro_batch_size,
        f"{a}.use_dynamic_bsz": False,
        f"{a}.shuffle": p.shuffle,  # false (the config refuses true): mini-batches in batch order
        f"{a}.data_loader_seed": recipe.seed,
        f"{a}.clip_ratio": p.clip_low,
        f"{a}.clip_ratio_low": p.clip_low,
        f"{a}.clip_ratio_high": p.clip_high,
        f"{a}.clip_ratio_c": p.clip_ratio_c,
        f"{a}.policy_loss.loss_mode": "vanilla",
        f"{a}.loss_agg_mode": p.loss_agg_mode,
        f"{a}.entropy_coeff": p.entropy_coeff,
        f"{a}.use_kl_loss": False,
        f"{a}.fsdp_config.param_offload": v.param_offload,
        f"{a}.fsdp_config.optimizer_offload": v.optimizer_offload,
    }


def rollout_overrides(recipe: Recipe, cfg: TrainConfig, agent_loops_file: Path) -> dict[str, Any]:
    r, v = cfg.rollout, cfg.verl
    x = "actor_rollout_ref.rollout"
    return {
        f"{x}.name": "vllm",
        f"{x}.mode": "async",
        f"{x}.n": r.keep,  # samples per prompt that reach the update; ProurRLDataset samples r.n
        f"{x}.temperature": r.temperature,
        f"{x}.top_p": r.top_p,
        f"{x}.top_k": r.top_k if r.top_k is not None else -1,
        f"{x}.prompt_length": recipe.data.max_prompt_tokens,
        f"{x}.response_length": r.max_response_tokens,
        f"{x}.max_model_len": v.max_model_len,
        f"{x}.gpu_memory_utilization": v.gpu_memory_utilization,
        f"{x}.enable_chunked_prefill": v.enable_chunked_prefill,
        f"{x}.tensor_model_parallel_size": v.tensor_parallel_size,
        f"{x}.log_prob_micro_batch_size_per_gpu": cfg.ppo.micro_batch_size,  # == actor's
        f"{x}.calculate_log_probs": True,
        # Validation decodes greedily: one session per prompt (more would be identical).
        f"{x}.val_kwargs.n": 1,
        f"{x}.val_kwargs.do_sample": False,
        f"{x}.agent.default_agent_loop": "prour_query",
        f"{x}.agent.agent_loop_config_path": str(agent_loops_file),
        f"{x}.agent.num_workers": v.agent_workers,
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": cfg.ppo.micro_batch_size,
    }


def trainer_overrides(
    recipe: Recipe, cfg: TrainConfig, output_dir: Path, resume: bool
) -> dict[str, Any]:
    v = cfg.verl
    sampler = "trainer.v1.sampler"
    out: dict[str, Any] = {
        "trainer.project_name": cfg.wandb.project,
        "trainer.experiment_name": recipe.name,
        # "file": verl's step metrics as JSON lines (VERL_FILE_LOGGER_PATH, see metrics_file)
        "trainer.logger": ["console", "file", "wandb"] if cfg.wandb.track else ["console", "file"],
        "trainer.nnodes": v.nnodes,
        "trainer.n_gpus_per_node": v.n_gpus_per_node,
        "trainer.total_training_steps": cfg.total_steps,
        "trainer.total_epochs": cfg.total_steps,  # upper bound; total_training_steps ends it
        "trainer.save_freq": cfg.save_every,
        "trainer.max_actor_ckpt_to_keep": cfg.keep_checkpoints,
        "trainer.default_local_dir": str(output_dir),
        "trainer.resume_mode": "auto" if resume else "disable",
        "trainer.val_before_train": v.val_before_train,
        "trainer.test_freq": v.test_freq,
        "trainer.critic_warmup": 0,
        # verl's sync trainer with mini-batches of whole states (verl_ext.trainer), registered in
        # the Ray workers (verl's task runner among them) by Ray's setup hook
        **overlap_overrides(cfg),
        "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook": TRAINER_REGISTER,
        f"{sampler}.custom_sampler.path": f"{EXT}.sampler",
        f"+{sampler}.sampler_kwargs.keep": cfg.rollout.keep,
        f"+{sampler}.sampler_kwargs.drop_zero_variance": cfg.ppo.drop_zero_variance,
        f"+{sampler}.sampler_kwargs.train_batch_size": cfg.states_per_step,
        f"+{sampler}.sampler_kwargs.max_failed_ask_fraction": cfg.max_failed_ask_fraction,
    }
    cpus = os.environ.get("SLURM_CPUS_PER_TASK")
    # A Slurm job's own Ray (one node): the job's CPU share, not every core of the node. With
    # RAY_ADDRESS (train_multinode.sbatch) `ray start --num-cpus` set it and ray.init refuses it.
    if cpus and not os.environ.get("RAY_ADDRESS"):
        out["ray_kwargs.ray_init.num_cpus"] = int(cpus)
    return out


def overlap_overrides(cfg: TrainConfig) -> dict[str, Any]:
    """The trainer and sampler of ``train.overlap``: off, verl's sync trainer (the paper's
    on-policy step); one_step, verl's colocated asynchronous trainer one batch ahead, whose
    sessions finish on the weights they started with, and verl's staleness bound: a sample's
    prompt at most ``train.max_staleness`` updates older than the update using it (verl counts
    the versions a group spans, one more)."""
    sampler = "trainer.v1.sampler"
    if cfg.overlap == "off":
        return {
            "trainer.v1.trainer_mode": TRAINER_MODE,
            f"{sampler}.custom_sampler.name": "KeepValidFirstReplayBuffer",
        }
    return {
        "trainer.v1.trainer_mode": ONE_STEP_TRAINER_MODE,
        f"{sampler}.custom_sampler.name": "OneStepKeepValidFirstReplayBuffer",
        f"{sampler}.max_off_policy_threshold": cfg.max_staleness + 1,
        f"{sampler}.max_off_policy_strategy": "drop",
    }


def verl_overrides(
    recipe: Recipe, cfg: TrainConfig, output_dir: Path, agent_loops_file: Path, resume: bool = False
) -> list[str]:
    """All Hydra overrides of a run, in a stable order; ``train.verl.extra_overrides`` come last."""
    merged: dict[str, Any] = {}
    for part in (
        algorithm_overrides(cfg),
        data_overrides(recipe, cfg),
        actor_overrides(recipe, cfg),
        rollout_overrides(recipe, cfg, agent_loops_file),
        trainer_overrides(recipe, cfg, output_dir, resume),
    ):
        merged.update(part)
    return [f"{key}={hydra_value(value)}" for key, value in merged.items()] + list(
        cfg.verl.extra_overrides
    )


COMPONENTS_BUILDER = "prour.build:Builder"
"""What makes a recipe's components in verl's workers, named as verl names custom functions."""


def agent_loops(recipe_file: Path) -> list[dict[str, Any]]:
    """verl's agent-loop registry entries: our loop, told where the resolved recipe lies and
    which builder makes its responders."""
    return [
        {
            "name": "prour_query",
            "_target_": "prour.train.verl_ext.agent_loop.QueryAgentLoop",
            "recipe_path": str(recipe_file),
            "builder": COMPONENTS_BUILDER,
        }
    ]


def prepare_verl_run(
    recipe: Recipe, cfg: TrainConfig, write: bool = True, resume: bool = False
) -> VerlRun:
    """The run's overrides; with ``write`` also record the run (its one resolved recipe,
    ``<output_dir>/recipe.resolved.yaml``, with provenance, as the local trainer does), which
    verl's agent-loop workers load, and the loop registry that tells them where it is."""
    from prour.provenance import RECIPE_FILE, write_provenance

    if recipe.train != cfg:  # a train section given apart: the run's recipe holds it, its
        # paths taken from run_dir like the rest (validation applies the path rule)
        recipe = Recipe.model_validate({**recipe.model_dump(), "train": cfg.model_dump()})
        cfg = train_section(recipe)
    output_dir = Path(cfg.output_dir)
    recipe_file = output_dir / RECIPE_FILE
    loops_file = output_dir / "verl" / "agent_loops.yaml"
    if write:
        write_provenance(output_dir, recipe, extra={"backend": "verl", "resume": resume})
        loops_file.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(loops_file, yaml.safe_dump(agent_loops(recipe_file), sort_keys=False))
    env = {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false",
           "VERL_FILE_LOGGER_PATH": str(metrics_file(output_dir, resume))}
    if cfg.wandb.track:
        from prour.train.metrics import wandb_mode

        env["WANDB_MODE"] = wandb_mode(cfg.wandb)
    overrides = verl_overrides(recipe, cfg, output_dir, loops_file, resume)
    return VerlRun(output_dir, recipe_file, loops_file, overrides, env)


def metrics_file(output_dir: Path, resume: bool) -> Path:
    """Where verl's file logger writes the step metrics: ``metrics.jsonl``, or, resuming from
    ``global_step_N``, a new segment ``metrics.from_step_N.jsonl`` (verl's logger truncates the
    file it opens; :func:`prour.train.report.read_metrics` joins the segments)."""
    from prour.train.metrics import METRICS_FILE, segment_name

    start = latest_verl_step(output_dir) if resume else None
    return output_dir / (METRICS_FILE if start is None else segment_name(start))


def compose_verl_config(overrides: list[str]) -> Any:
    """verl's ``ppo_trainer`` config with ``overrides`` applied (Hydra compose; runs on CPU)."""
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name=VERL_CONFIG, overrides=overrides)


CHECKED_SECTIONS = (
    "algorithm",
    "actor_rollout_ref.rollout",
    "actor_rollout_ref.actor.optim",
    "actor_rollout_ref.model",
)


def check_verl_config(config: Any, sections: tuple[str, ...] = CHECKED_SECTIONS) -> None:
    """verl's own start-up validation (``validate_config``, as ``main_ppo`` runs it), then verl's
    typed config classes for ``sections`` (the model section reads the policy's HF config)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    validate_config(
        config=config,
        use_reference_policy=need_reference_policy(config),
        use_critic=need_critic(config),
    )
    for dotted in sections:
        node = config
        for part in dotted.split("."):
            node = node[part]
        omega_conf_to_dataclass(node)


def launch(run: VerlRun) -> int:
    """Run verl's trainer in a child process (GPU nodes); returns its exit status. The child has
    its own session, so SIGINT/SIGTERM reach it once, passed on by :mod:`prour.interrupt` (which
    waits for it to save and end; a second signal stops it by PID)."""
    from prour import interrupt

    logger.info("launching verl: %s", run.shell())
    env = {**os.environ, **run.env}
    trainer = subprocess.Popen(run.command, env=env, start_new_session=True)
    with interrupt.child(trainer, "verl trainer"):
        return trainer.wait()


def no_training_state(cfg: TrainConfig) -> str | None:
    """Why verl has nothing to train on: the train file holds no state of ``train.modes``
    (extract routed none to clarify or verify); verl's dataset cannot even read such a file.
    None when it has states, or is not there yet (preflight names a missing one)."""
    from prour.train.data import keep_modes, read_instances

    try:
        rows = read_instances(cfg.train_file)
    except FileNotFoundError:
        return None
    if keep_modes(rows, cfg.modes, str(cfg.train_file)):
        return None
    return f"{cfg.train_file} holds no training state"


def save_untrained(recipe: Recipe, cfg: TrainConfig, reason: str) -> Path:
    """Save the initial policy as verl's final step without launching verl
    (:func:`prour.train.checkpoint.save_untrained_verl`), so that export and eval still run; a
    policy with no local folder to copy raises FileNotFoundError naming it."""
    from prour.train.checkpoint import is_hf_folder, save_untrained_verl

    policy = Path(_policy_path(recipe))
    if not is_hf_folder(policy):
        raise FileNotFoundError(
            f"models.generator {policy}: no local Hugging Face folder (config.json and weights) "
            f"to save as the untrained final step; download it (see `prour validate --preflight`)")
    return save_untrained_verl(cfg.output_dir, cfg.total_steps, policy, reason)


def export_command(actor_dir: Path, target_dir: Path) -> list[str]:
    """``verl.model_merger`` call that turns an FSDP actor checkpoint into a Hugging Face folder."""
    return [
        sys.executable,
        "-m",
        "verl.model_merger",
        "merge",
        "--backend",
        "fsdp",
        "--local_dir",
        str(actor_dir),
        "--target_dir",
        str(target_dir),
    ]


def export_checkpoint(
    output_dir: Path, step: int | None = None, target: Path | None = None, dry_run: bool = False
) -> tuple[list[str], Path]:
    """Convert ``global_step_<step>`` (newest when None) to HF format in ``step_<step>``. A step
    saved untrained (:func:`save_untrained`) is that folder already: no command, nothing merged
    (copied to ``target`` when one is named)."""
    if step is None:
        step = latest_verl_step(output_dir) or untrained_verl_step(output_dir)
    if step is None:
        raise FileNotFoundError(f"no verl checkpoint (global_step_N/actor) under {output_dir}")
    actor = Path(output_dir) / f"global_step_{step}" / "actor"
    if not actor.is_dir() and untrained_verl_step(output_dir) == step:
        folder = Path(output_dir) / f"step_{step}"  # the initial policy, saved as the last step
        if target is None or dry_run or Path(target).resolve() == folder.resolve():
            return [], folder
        shutil.copytree(folder, target, dirs_exist_ok=True)
        return [], Path(target)
    if not actor.is_dir():
        raise FileNotFoundError(f"{actor} does not exist")
    target = target or Path(output_dir) / f"step_{step}"
    command = export_command(actor, target)
    if not dry_run:
        existed = target.exists()
        merged = subprocess.run(command, capture_output=True, text=True, check=False)
        if merged.returncode != 0:
            if not existed:  # no half-written folder that eval could mistake for the model
                shutil.rmtree(target, ignore_errors=True)
            raise ExportError(merge_failure(actor, merged.returncode, merged.stderr))
    return command, target


class ExportError(RuntimeError):
    """verl's model merger failed; the message is one line with its last error line."""


def merge_failure(actor: Path, returncode: int, stderr: str) -> str:
    """One line: which checkpoint, the merger's exit status and its last error line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else "no output"
    return (f"merging {actor} into a Hugging Face folder failed (verl.model_merger exit "
            f"{returncode}): {last}; check that the step finished saving (actor/ holds "
            "model_world_size_*_rank_*.pt and huggingface/ its config)")
