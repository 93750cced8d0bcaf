"""The ``train`` recipe section: DAPO hyperparameters (paper A.2.1) and both backends' resources.

Defaults are the paper's numbers. Batch arithmetic is checked when the recipe loads, before any
model: an impossible combination is refused with the dotted key and the numbers involved.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from prour.section import ConfigError, Section


class RolloutSettings(Section):
    """How the policy samples its group of queries for each state."""

    n: int = Field(8, ge=1)  # queries sampled per state
    keep: int = Field(6, ge=1)  # kept per state for the update (valid questions first)
    temperature: float = Field(0.8, gt=0)  # > 0: the update needs a sampling distribution
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int | None = Field(None, ge=1)  # None: no top-k truncation
    enable_thinking: bool = True  # Qwen3 <think> block before the answer (evaluation too)
    # Also the generator's limit in evaluation; the prompt budget is data.max_prompt_tokens.
    max_response_tokens: int = Field(1760, ge=1)


class OptimSettings(Section):
    """AdamW with linear warmup to a constant learning rate, and grad-norm clipping."""

    lr: float = Field(7e-7, gt=0)
    # Training steps (one per states_per_step states, not per optimizer step) of linear warmup
    # from 0: both backends step the scheduler once per training step.
    warmup_steps: int = Field(60, ge=0)
    weight_decay: float = Field(0.01, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)
    grad_clip: float = Field(1.0, gt=0)  # max global L2 norm of the gradient


class PPOSettings(Section):
    """The clipped-surrogate update over the kept samples."""

    epochs: int = Field(4, ge=1)  # passes over the step's kept samples
    mini_batch_states: int = Field(1, ge=1)  # states per optimizer step
    micro_batch_size: int = Field(1, ge=1)  # samples per forward/backward (per GPU on verl)
    clip_low: float = Field(0.2, gt=0, lt=1)  # ratio floor 1 - clip_low
    clip_high: float = Field(0.3, gt=0)  # ratio ceiling 1 + clip_high
    clip_ratio_c: float = Field(3.0, gt=1)  # dual-clip bound for negative advantages
    entropy_coeff: float = Field(0.01, ge=0)
    loss_agg_mode: Literal["token-mean"] = "token-mean"
    adv_epsilon: float = Field(1e-6, gt=0)  # added to the group std
    drop_zero_variance: bool = False  # DAPO dynamic sampling: skip groups with equal rewards
    # Local backend: reshuffle the order of whole states between epochs. verl shuffles single
    # samples per rank (mixing states in a mini-batch), so the verl backend refuses true.
    shuffle: bool = False


class UpdateSettings(Section):
    """How the local trainer lays out the update's forward/backward passes; none changes the loss.

    Each option only regroups the same token sums (the loss of a mini-batch is its token sum over
    the mini-batch's token count however it is split), so the defaults reproduce the paper's run.
    """

    # Concatenate a micro-batch's samples into one row with position ids restarting per sample
    # (transformers then builds a block-diagonal causal mask): no padding tokens are computed.
    packing: bool = False
    # With packing, what keeps attention inside each sample. "position_ids": transformers, which
    # reads the restarts of the position ids as sample boundaries (no mask is passed);
    # "documents": a block-diagonal causal mask built from the sample lengths and passed in the
    # form the model's attention takes (prour.train.layout.document_mask; under flex_attention a
    # BlockMask that skips the cross-sample blocks): the layouts "packed" and "packed_exact".
    packing_mask: Literal["position_ids", "documents"] = "position_ids"
    # "full": the LM head's logits (R, V) of every response token of a micro-batch, then
    # log-softmax and entropy over them. "fused": prour.core.fused_logprob, the logits of at most
    # log_prob_chunk_tokens tokens at a time in the forward and the backward (same values).
    log_probs: Literal["full", "fused"] = "full"
    log_prob_chunk_tokens: int = Field(512, ge=1)
    # Token budget of one micro-batch (the tokens its forward computes: their sum when packed,
    # rows x longest when padded) instead of ppo.micro_batch_size samples; a sample over the
    # budget goes alone. None: ppo.micro_batch_size samples per micro-batch.
    micro_batch_tokens: int | None = Field(None, ge=1)
    fused_optimizer: bool = False  # torch AdamW's fused kernel (CUDA; CPU where torch has one)

    @model_validator(mode="after")
    def _mask_needs_packing(self) -> UpdateSettings:
        if self.packing_mask != "position_ids" and not self.packing:
            raise ConfigError(
                "packing_mask", f"{self.packing_mask!r} applies to packed rows: set "
                "train.update.packing: true (or leave packing_mask out)"
            )
        return self

    @property
    def layout(self) -> str:
        """The name of the forward's layout in :data:`prour.train.layout.LAYOUTS`."""
        if not self.packing:
            return "padded"
        return "packed_exact" if self.packing_mask == "documents" else "packed"


class VerlSettings(Section):
    """Resources and engine switches of the verl backend (Ray, FSDP, vLLM rollouts)."""

    nnodes: int = Field(1, ge=1)
    n_gpus_per_node: int = Field(2, ge=1)
    # fsdp: verl's main_ppo (GPU nodes). cpu_rehearsal: the same recipe on CPU, verl's trainer
    # code with the policy on one Ray actor per data-parallel rank, sampling itself
    # (prour.train.verl_ext.rehearsal); against RAY_ADDRESS when set (train_multinode.sbatch).
    engine: Literal["fsdp", "cpu_rehearsal"] = "fsdp"
    tensor_parallel_size: int = Field(1, ge=1)  # vLLM rollout TP (verl's default is 2)
    gpu_memory_utilization: float = Field(0.2, gt=0, le=1)  # vLLM share while colocated
    enable_chunked_prefill: bool = True
    fsdp_strategy: Literal["fsdp", "fsdp2"] = "fsdp"  # verl's actor.fsdp_config.strategy
    param_offload: bool = False
    optimizer_offload: bool = False
    # Padding-free micro-batches (one packed row, position ids restarting per sample). Under
    # sdpa, transformers (>= 5) masks the packed row block-diagonally from the restarts, so it
    # needs no flash-attn (tests/train/test_layout.py runs verl's packed forward on sdpa);
    # it saves compute only where a micro-batch holds several samples (use_dynamic_bsz, or
    # ppo.micro_batch_size > 1). Ulysses still needs flash-attn, which has no wheel for the `gpu`
    # extra's torch.
    use_remove_padding: bool = False
    attn_implementation: str = "sdpa"
    # verl's chunked log-prob and entropy from the hidden states and LM head
    # (actor_rollout_ref.model.use_fused_kernels): no sample's full-vocabulary logits exist at
    # once. Backend "torch": verl's pure-torch function (equal to the unfused values within bf16;
    # tested on CPU); "triton": verl's Triton kernel (GPU only, not tested here).
    use_fused_kernels: bool = False
    fused_kernels_backend: Literal["torch", "triton"] = "torch"
    # Ulysses sequence parallelism: the actor's data-parallel size is GPUs / this. At any
    # data-parallel size each rank holds an equal share of the same states in every optimizer
    # step (verl_ext.trainer), so rollout.keep must divide by it.
    ulysses_sequence_parallel_size: int = Field(1, ge=1)
    max_model_len: int = Field(8192, ge=64)  # rollout server context: belief prompts + target fit
    agent_workers: int = Field(8, ge=1)  # agent-loop worker actors
    val_before_train: bool = False
    test_freq: int = -1  # steps between validations; -1: never
    extra_overrides: list[str] = Field(default_factory=list)  # raw Hydra overrides, appended last


class WandbSettings(Section):
    """Weights & Biases tracking; off unless asked for, offline when no API key is set."""

    track: bool = False
    project: str = "prour"
    entity: str | None = None
    mode: Literal["offline", "online", "auto"] = "offline"  # auto: online iff WANDB_API_KEY is set


class TrainConfig(Section):
    """DAPO training of the query generator (``models.generator`` is the initial policy)."""

    backend: Literal["local", "verl"] = "local"
    train_file: str = "data/dataset/train.parquet"  # instances; relative to the run directory
    val_file: str | None = "data/dataset/validation.parquet"
    # The belief modes of the train/validation files' states that training uses (the others are
    # left out as the files are read, by both backends); None: every state. IG-Clarifier's run
    # (recipes/ig-clarifier.yaml) trains on the clarify states only.
    modes: list[Literal["clarify", "verify"]] | None = Field(None, min_length=1)
    states_per_step: int = Field(16, ge=1)  # prompts per training step
    total_steps: int = Field(2010, ge=1)
    # both backends stop training (exit 1, the newest checkpoint kept) once more than this
    # fraction of a step's asks failed (responders down); each step logs n_failed.
    max_failed_ask_fraction: float = Field(0.5, ge=0, le=1)
    save_every: int = Field(100, ge=1)  # checkpoint every N steps; the last step is always saved
    keep_checkpoints: int | None = Field(None, ge=1)  # newest N kept; None: keep all
    output_dir: str = "checkpoints"  # <run_dir>/checkpoints/step_N (relative to the run directory)
    device: str = "auto"  # local backend: auto | cpu | cuda[:i]
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"  # auto: bf16 on GPU, fp32 on CPU
    gradient_checkpointing: bool = True  # where the model supports it
    rollout: RolloutSettings = RolloutSettings()
    optim: OptimSettings = OptimSettings()
    ppo: PPOSettings = PPOSettings()
    update: UpdateSettings = UpdateSettings()  # local backend only
    verl: VerlSettings = VerlSettings()
    wandb: WandbSettings = WandbSettings()
    # "off" (the paper's setting) samples each step with the policy it updates; "one_step"
    # samples and scores step k+1 while step k updates. Local backend: on a copy of the policy,
    # re-synced so that no update uses samples more than max_staleness updates old. verl backend:
    # verl's colocated asynchronous trainer one batch ahead, each session finishing on the
    # weights it started with (samples one update old), max_staleness verl's staleness bound.
    overlap: Literal["off", "one_step"] = "off"
    max_staleness: int = Field(1, ge=1)  # with overlap one_step: updates between sampling and use

    @field_validator("overlap", mode="before")
    @classmethod
    def _overlap_off(cls, value: object) -> object:
        """YAML reads a bare ``off`` as false: ``overlap: off`` means "off"."""
        return "off" if value is False else value

    @model_validator(mode="after")
    def _batch_arithmetic(self) -> TrainConfig:
        check_batch_arithmetic(self)
        if self.overlap != "off" and self.backend == "verl" and self.ppo.drop_zero_variance:
            raise ConfigError(
                "overlap", f"{self.overlap!r} on the verl backend does not run with "
                "train.ppo.drop_zero_variance: our refill of dropped groups is built on verl's "
                "synchronous buffer; set train.overlap: off or train.ppo.drop_zero_variance: false"
            )
        return self

    @property
    def kept_per_step(self) -> int:
        """Samples that reach the update per step (before failures and dropped groups)."""
        return self.states_per_step * self.rollout.keep

    @property
    def mini_batches_per_epoch(self) -> int:
        return self.states_per_step // self.ppo.mini_batch_states


def check_batch_arithmetic(cfg: TrainConfig) -> None:
    """Refuse impossible batch sizes; keys are relative to ``train`` (first_error prefixes it)."""
    n, keep = cfg.rollout.n, cfg.rollout.keep
    if keep > n:
        raise ConfigError(
            "rollout.keep", f"keeps {keep} samples per state but only {n} are sampled (rollout.n)"
        )
    if keep < 2:
        raise ConfigError(
            "rollout.keep", f"keeps {keep} sample per state; a group advantage needs at least 2"
        )
    states, per_mini = cfg.states_per_step, cfg.ppo.mini_batch_states
    if per_mini > states or states % per_mini:
        raise ConfigError(
            "ppo.mini_batch_states",
            f"{per_mini} states per mini-batch does not divide the {states} states per step "
            "(states_per_step)",
        )
    samples = per_mini * keep
    micro = cfg.ppo.micro_batch_size
    if cfg.backend == "verl":
        _check_verl(cfg, samples)
    elif micro > samples or samples % micro:
        raise ConfigError(
            "ppo.micro_batch_size",
            f"{micro} does not divide the {samples} samples of a mini-batch "
            f"(mini_batch_states {per_mini} x rollout.keep {keep})",
        )


def actor_dp_size(v: VerlSettings) -> int:
    """The verl actor's data-parallel size: GPUs over Ulysses sequence-parallel size."""
    return v.nnodes * v.n_gpus_per_node // v.ulysses_sequence_parallel_size


def _check_verl(cfg: TrainConfig, samples: int) -> None:
    """verl splits each mini-batch over data-parallel ranks, then into micro-batches per rank."""
    v = cfg.verl
    defaults = UpdateSettings()
    changed = [key for key, value in cfg.update if value != getattr(defaults, key)]
    if changed:
        raise ConfigError(
            f"update.{changed[0]}",
            "train.update applies to the local backend; verl's own switches are "
            "train.verl.use_remove_padding, train.verl.use_fused_kernels and "
            "train.verl.extra_overrides (use_dynamic_bsz)",
        )
    gpus = v.nnodes * v.n_gpus_per_node
    for key, size in (
        ("verl.tensor_parallel_size", v.tensor_parallel_size),
        ("verl.ulysses_sequence_parallel_size", v.ulysses_sequence_parallel_size),
    ):
        if gpus % size:
            raise ConfigError(
                key,
                f"{size} does not divide the {gpus} GPUs ({v.nnodes} nodes x {v.n_gpus_per_node})",
            )
    if v.ulysses_sequence_parallel_size > 1 and not (
        v.use_remove_padding and v.attn_implementation == "flash_attention_2"
    ):
        raise ConfigError(
            "verl.ulysses_sequence_parallel_size",
            "verl's Ulysses all-to-all lives in its flash-attention patch over packed sequences: "
            "set train.verl.use_remove_padding=true and "
            "train.verl.attn_implementation=flash_attention_2",
        )
    if cfg.ppo.shuffle:
        raise ConfigError(
            "ppo.shuffle",
            "verl shuffles single samples on each rank, which mixes states within a mini-batch; "
            "set it to false",
        )
    dp = actor_dp_size(v)
    if cfg.rollout.keep % dp:  # every rank holds an equal share of each state (verl_ext.trainer)
        raise ConfigError(
            "rollout.keep",
            f"a state's {cfg.rollout.keep} kept samples do not split over {dp} data-parallel "
            f"ranks ({gpus} GPUs / ulysses_sequence_parallel_size "
            f"{v.ulysses_sequence_parallel_size})",
        )
    per_rank, micro = samples // dp, cfg.ppo.micro_batch_size
    if micro > per_rank or per_rank % micro:
        raise ConfigError(
            "ppo.micro_batch_size",
            f"{micro} per rank does not divide the {per_rank} samples each of {dp} "
            "data-parallel ranks gets per mini-batch",
        )


def step_dir(output_dir: str | Path, step: int) -> Path:
    """The folder of the checkpoint saved after ``step`` under ``train.output_dir``."""
    return Path(output_dir) / f"step_{step}"
