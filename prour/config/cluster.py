"""The ``serve`` and ``slurm`` recipe sections: frozen-model servers and cluster resources.

``serve.models`` is keyed by model id: the name the server answers to, which is also the
``model`` of every ``openai`` role it serves. Roles find their server by that name, so several
roles that share one frozen model (the paper's Qwen3-8B decomposer, user and verifier) share
one server. ``slurm`` holds only resources, site values and paths; hyperparameters stay in their
own sections (the train job's GPUs come from ``train.verl`` when that backend runs).

Only :mod:`prour.section` is imported here, so :mod:`prour.config` can collect these sections.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Literal

from pydantic import Field, field_validator, model_validator

from prour.section import ConfigError, Section

VLLM_DEFAULT_GPU_SHARE = 0.9  # vLLM's own default for --gpu-memory-utilization
SLURM_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$|^\d+-\d+$|^(UNLIMITED|INFINITE)$")


class ServedModel(Section):
    """One vLLM OpenAI-compatible server: what it loads, where it runs and how it is reached."""

    path: str | None = None  # local HF folder or hub id; None: the model id itself
    gpus: list[int] | None = None  # CUDA_VISIBLE_DEVICES of this server; None: inherit
    tensor_parallel_size: int = Field(1, ge=1)
    max_model_len: int = Field(8192, ge=16)
    port: int | None = Field(None, ge=1, le=65535)  # None: a free port, chosen at start
    host: str | None = None  # bind address; None: serve.host
    dtype: str = "auto"  # vLLM --dtype (float32 for the CPU build)
    # vLLM's share of each of its GPUs. None: in each step of `prour run`, a server with `gpus`
    # gets what the step leaves free on them (prour.cluster.sizing; the plan prints it);
    # outside a step (`prour serve`, a study's serving groups), and without `gpus`, vLLM's 0.9.
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    # true: in each step of `prour run` that calls it, the server gets the share that step leaves
    # (and replicas: auto its copies) in place of gpu_memory_utilization, which stays its share
    # where it is served outside a step.
    size_per_step: bool = False
    # vLLM --max-num-seqs, the requests one replica runs at once. None: in `prour run`'s steps,
    # derived from the KV cache the step's share leaves (tokens / context_tokens) where the
    # context is known; else vLLM's own. The eval queue holds the model at the sum over its
    # replicas.
    max_num_seqs: int | None = Field(None, ge=1)
    # Copies of this server, each on GPUs of its own, the client spreading requests over them
    # (least busy first; one that cannot be reached is left out until it answers again).
    # "auto", in `prour run`'s steps where the share is not fixed: one more copy on each GPU
    # (group of tensor_parallel_size) left with room for its weights and one max_model_len
    # sequence, beside no trainer; elsewhere, one copy. A server without `gpus` runs its copies
    # on the GPUs it inherits (on CPU: side by side).
    replicas: int | Literal["auto"] = 1
    # Tokens one request reaches on this server (prompt + reply), the divisor of the derived
    # max_num_seqs: an assumption until a run's own eval results record its requests' tokens,
    # which replace it. None: data.max_prompt_tokens + train.rollout.max_response_tokens for
    # eval's exported generator, max_model_len for any other model.
    context_tokens: int | None = Field(None, ge=16)
    enforce_eager: bool = False  # no CUDA graphs (needed by the CPU build; slower on GPUs)
    # Flags by what the served roles need (prour.cluster.serve.server_flags). Qwen3 writes tool
    # calls as hermes-style <tool_call>{json}</tool_call> blocks and thinks in <think></think>.
    tool_call_parser: str | None = "hermes"  # agent/user/verifier send tools; None: no tool calling
    reasoning_parser: str | None = "qwen3"  # think block returned apart; None: left in the text
    enable_prefix_caching: bool = True  # the long shared prefix (policy + tools) is reused
    extra_args: list[str] = []  # appended to the vLLM command line as given
    env: dict[str, str] = {}  # extra environment of this server

    @field_validator("replicas")
    @classmethod
    def _some_replicas(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError(f"give at least one replica (or auto), got {value}")
        return value

    @model_validator(mode="after")
    def _enough_gpus(self) -> ServedModel:
        if self.gpus is not None:
            if len(set(self.gpus)) != len(self.gpus):
                raise ConfigError("gpus", f"lists a GPU twice: {self.gpus}")
            if len(self.gpus) < self.tensor_parallel_size:
                raise ConfigError(
                    "gpus",
                    f"{len(self.gpus)} GPU(s) {self.gpus} cannot hold tensor_parallel_size="
                    f"{self.tensor_parallel_size}; list at least that many GPUs or lower it",
                )
        return self


class ServeConfig(Section):
    """Servers that ``prour serve`` starts, and how long it waits for them."""

    # Bind address of every server unless its own `host` says otherwise; 0.0.0.0 serves other
    # nodes (Slurm: train and eval may run elsewhere).
    host: str = "127.0.0.1"
    # The name other nodes reach the servers by, written into the endpoints file. None: the bind
    # address; when binding to every interface, this node's hostname if it names one of this
    # node's own non-loopback addresses, else that address (prour.cluster.serve.node_address).
    advertise_host: str | None = None
    python: str | None = None  # python of the vLLM venv; None: $PROUR_VLLM_PYTHON, else this one
    startup_timeout_s: float = Field(900.0, gt=0)  # per server, from launch to a healthy /health
    log_dir: str = "serve"  # server logs; relative to the run directory
    # Memory of each GPU of the node (prour.cluster.gpu_plan); the paper's H100s have 80 GiB.
    gpu_memory_gib: float = Field(80.0, gt=0)
    # The train stage's servers (strict_user, verifier) share the trainer's node and GPUs, as on
    # the paper's single node; false: they run elsewhere (`prour serve`, e.g. `prour slurm submit
    # --stages serve` on another node): the train step starts none, waits for the recipe's
    # endpoints file to list them ready and reaches them through it, and the train plan counts
    # the trainer only.
    colocate_train: bool = True
    # Model id -> server. Empty: one server with the defaults below per distinct model id of the
    # openai roles without base_url (prour.cluster.recipe.served_models).
    models: dict[str, ServedModel] = {}

    @model_validator(mode="after")
    def _placement(self) -> ServeConfig:
        # GPU shares are checked per step by the GPU plan (prour.cluster.gpu_plan): servers of
        # different steps never run together, so their shares need not fit one GPU at once
        check_ports(self.models)
        return self


def check_ports(models: dict[str, ServedModel]) -> None:
    """Two servers on one host cannot share a fixed port."""
    seen: dict[tuple[str | None, int], str] = {}
    for model_id, spec in models.items():
        if spec.port is None:
            continue
        key = (spec.host, spec.port)
        if key in seen:
            raise ConfigError(
                f"models.{model_id}.port",
                f"port {spec.port} is already used by models.{seen[key]}; give each server its own",
            )
        seen[key] = model_id


def share_overflow(models: dict[str, ServedModel]) -> tuple[int, list[tuple[str, float]]] | None:
    """The first GPU whose servers, run together, ask for more than all of it (their
    ``gpu_memory_utilization`` add up to more than 1.0): that GPU and its (model id, share)
    pairs; ``None`` when every GPU's shares fit."""
    shares: dict[int, list[tuple[str, float]]] = defaultdict(list)
    for model_id, spec in models.items():
        share = spec.gpu_memory_utilization or VLLM_DEFAULT_GPU_SHARE
        for gpu in spec.gpus or []:
            shares[gpu].append((model_id, share))
    for gpu, users in sorted(shares.items()):
        if len(users) > 1 and sum(share for _, share in users) > 1.0 + 1e-9:
            return gpu, users
    return None


class SlurmResources(Section):
    """sbatch resources of one stage; ``None`` defers to ``slurm.defaults``, then the site."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = None  # sbatch --time, e.g. "48:00:00" or "2-00:00:00"
    nodes: int | None = Field(None, ge=1)  # train: None takes train.verl.nnodes (verl backend)
    gpus_per_node: int | None = Field(None, ge=0)  # train/serve: None derives it from the recipe
    cpus_per_task: int | None = Field(None, ge=1)
    mem: str | None = None  # sbatch --mem, e.g. "200G"; "0" asks for all of a node's memory
    constraint: str | None = None
    # sbatch --nodelist: the job runs on these nodes only, e.g. "node1" or "gpu[01-02]" (a serve
    # job on one node and the train job that reads its endpoints on another)
    nodelist: str | None = None
    extra: list[str] = []  # more sbatch options, e.g. ["--exclusive", "--reservation=r1"]

    @field_validator("time")
    @classmethod
    def _slurm_time(cls, value: str | None) -> str | None:
        if value is not None and not SLURM_TIME.match(value):
            raise ValueError(f"not a Slurm time limit (use [D-]HH:MM:SS or minutes): {value!r}")
        return value

    @field_validator("extra")
    @classmethod
    def _options(cls, value: list[str]) -> list[str]:
        for item in value:
            if not item.startswith("-"):
                raise ValueError(f"each extra sbatch option starts with '-', got {item!r}")
        return value

    def merged(self, base: SlurmResources) -> SlurmResources:
        """These resources, unset fields taken from ``base`` (extra options concatenated)."""
        values = {name: getattr(self, name) for name in type(self).model_fields}
        for name, value in values.items():
            if value is None:
                values[name] = getattr(base, name)
        values["extra"] = [*base.extra, *self.extra]
        return SlurmResources(**values)


class SlurmConfig(Section):
    """What ``prour slurm submit`` renders into the sbatch templates besides the recipe itself:
    ``defaults`` and one field per stage of :data:`prour.stages.STAGES`, in pipeline order."""

    defaults: SlurmResources = SlurmResources()  # shared by all stages (partition, account, ...)
    # `--stages serve` alone: servers held until scancel or the time limit (the chain's jobs serve
    # for themselves). Every other job asks for the GPUs its GPU plan places (the servers of the
    # roles its steps call, the trainer, hf roles in process) unless gpus_per_node says otherwise.
    serve: SlurmResources = SlurmResources()
    collect: SlurmResources = SlurmResources()
    normalize: SlurmResources = SlurmResources()
    calibrate: SlurmResources = SlurmResources()
    extract: SlurmResources = SlurmResources()
    train: SlurmResources = SlurmResources()
    export: SlurmResources = SlurmResources()
    eval: SlurmResources = SlurmResources()
    study: SlurmResources = SlurmResources()  # a recipe's study: episodes, judge, report
    taxonomy: SlurmResources = SlurmResources()  # the annotator over the collected trajectories
    report: SlurmResources = SlurmResources()
    # Shell lines run before any prour command (module load, venv activation). None: put the
    # bin folder of the python running `prour slurm submit` first on PATH.
    setup: list[str] | None = None
    env: dict[str, str] = {}  # exported in every job (NCCL_SOCKET_IFNAME, HF_HOME, ...)
    templates_dir: str | None = None  # None: the repository's slurm/ folder
    ray_port: int = Field(6379, ge=1, le=65535)  # multi-node training: Ray head port
    # multi-node training: cap of Ray's object store on each node, MiB (None: Ray's own share of
    # the node's memory; a few hundred MiB suits CPU rehearsals on small machines)
    ray_object_store_mb: int | None = Field(None, ge=75)
    kill_on_invalid_dep: bool = True  # cancel dependants of a failed stage instead of leaving them

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"not an environment variable name: {name!r}")
        return value

    def resources(self, stage: str) -> SlurmResources:
        """The stage's resources with ``defaults`` filled in (one field per stage of
        :data:`prour.stages.STAGES`; tests/test_stages.py holds the two lists equal)."""
        own = {
            "serve": self.serve,
            "collect": self.collect,
            "normalize": self.normalize,
            "calibrate": self.calibrate,
            "extract": self.extract,
            "train": self.train,
            "export": self.export,
            "eval": self.eval,
            "study": self.study,
            "taxonomy": self.taxonomy,
            "report": self.report,
        }
        if stage not in own:
            raise ValueError(f"unknown stage {stage!r}; valid: {', '.join(own)}")
        return own[stage].merged(self.defaults)
