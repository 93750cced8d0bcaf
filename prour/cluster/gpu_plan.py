"""GPU memory plan of one node: what each GPU holds during a stage, and whether it fits.

The paper trains on one node with two 80 GiB H100s (A.2.1): the FSDP actor of the Qwen3-1.7B
policy with its AdamW state, verl's vLLM rollout at ``gpu_memory_utilization`` 0.2, and the
frozen Qwen3-8B responders (strict user, verifier) served by vLLM beside them. The plan adds up,
per GPU, in GiB:

* a vLLM server: its share ``gpu_memory_utilization x GPU memory`` on each of its GPUs (vLLM
  reserves exactly that); inside it the weights (parameters x dtype bytes / tensor parallel) and
  a reserve for activations and CUDA graphs must leave KV cache for one ``max_model_len``
  sequence, or vLLM refuses to start;
* the verl trainer (``train.backend: verl``), per GPU of ``nnodes x n_gpus_per_node``: fp32
  parameters, fp32 gradients and AdamW's two fp32 moments, i.e. 16 bytes per parameter sharded
  by FSDP over the data-parallel GPUs; plus the larger of the rollout share (its vLLM sleeps
  while the actor updates) and the update's activations: the fp32 logits of one micro-batch of
  ``max_prompt_tokens + max_response_tokens`` tokens, held about five times (logits, log-probs,
  entropy and their gradients; fitted to a measured update), and the hidden states gradient
  checkpointing keeps (bf16, one per layer);
* a model a stage loads in process (``hf`` backend, e.g. the evaluated generator): its weights
  on the first GPU;
* a CUDA context per process on each GPU it uses.

``prour run`` starts the servers a step calls and stops the others, so a stage is planned step
by step (each with its own servers and in-process roles) and a GPU of the stage's plan shows the
step that holds the most on it; servers of one step whose shares of a GPU add up to more than
1.0 are a problem naming their keys. Each step's servers are sized to what it leaves
(:mod:`prour.cluster.sizing`: shares, replicas, requests at once), and the plan prints how.

Parameter counts and shapes come from a local model folder's ``config.json`` when there is one,
else from the hub configs of the paper's models (:mod:`prour.cluster.shapes`). The reserves are
estimates, marked as such; everything else is arithmetic on the recipe.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prour.cluster.recipe import EXPORTED_GENERATOR, served_models, served_roles
from prour.cluster.shapes import (
    CUDA_CONTEXT_GIB,
    DTYPE_BYTES,
    GIB,
    TIGHT_FRACTION,
    VLLM_RESERVE_GIB,
    model_shape,
)
from prour.config import Recipe
from prour.config.cluster import VLLM_DEFAULT_GPU_SHARE, ServedModel, share_overflow
from prour.stages import Step, get_stage, stage_roles, supplied_model

if TYPE_CHECKING:  # pragma: no cover
    from prour.cluster.sizing import Sizing

TRAIN_STATE_BYTES = 16  # fp32 params (4) + fp32 grads (4) + AdamW exp_avg and exp_avg_sq (8)
# fp32 vocabulary-wide tensors of one micro-batch (logits, log-probs, entropy, their gradients),
# fitted to a measurement: one DAPO update at Qwen3-1.7B shape peaked at 34.5 GiB on one GPU
# (benchmarks/RESULTS.md, gpu_step.py) = 25.6 GiB of fp32 state + 8.9 GiB, i.e. ~4.8 copies of
# 3,160 x 151,936 fp32 logits beside the checkpointed hidden states.
LOGIT_COPIES = 5


class GpuPlanError(ValueError):
    """The recipe's models do not fit the node's GPUs (the message carries the numbers)."""


@dataclass
class GpuPlan:
    """Per-GPU memory of one stage on one node; ``problems`` is empty when it fits."""

    stage: str
    gpu_gib: float
    n_gpus: int
    uses: dict[int, list[tuple[str, float]]] = field(default_factory=lambda: defaultdict(list))
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # fits, but with little to spare
    during: dict[int, str] = field(default_factory=dict)  # GPU -> the steps its line shows
    # per step (or servers started together): each server's replicas, shares, KV cache and
    # requests at once (prour.cluster.sizing)
    serving: list[str] = field(default_factory=list)

    def add(self, gpu: int, what: str, gib: float) -> None:
        self.uses[gpu].append((what, gib))

    def total(self, gpu: int) -> float:
        return sum(gib for _, gib in self.uses.get(gpu, []))

    @property
    def fits(self) -> bool:
        return not self.problems

    def text(self) -> str:
        """The plan as printed by the dry-runs: one line per GPU with its parts, then problems."""
        lines = [f"GPU memory plan, stage {self.stage}: {self.n_gpus} x {self.gpu_gib:g} GiB"]
        for gpu in range(self.n_gpus):
            parts = " + ".join(f"{what} {gib:.1f}" for what, gib in self.uses.get(gpu, []))
            during = f" ({self.during[gpu]})" if gpu in self.during else ""
            lines.append(f"  GPU {gpu}: {self.total(gpu):.1f} / {self.gpu_gib:g} GiB{during} = "
                         f"{parts or 'nothing'}")
        lines += [f"  serving {line}" for line in self.serving]
        lines += [f"  note: {note}" for note in self.notes]
        lines += [f"  warning: {warning}" for warning in self.warnings]
        lines += [f"  does not fit: {problem}" for problem in self.problems]
        return "\n".join(lines)

    def check(self) -> None:
        """Raise :class:`GpuPlanError` with the plan's numbers when it does not fit."""
        if self.problems:
            raise GpuPlanError(self.text())


def plan_server(plan: GpuPlan, model_id: str, spec: ServedModel, running: bool = False,
                like: str | None = None, label: str | None = None) -> None:
    """Add one vLLM server (``running``: one the endpoints files show on this node); a share too
    small for weights + one full-length sequence is a problem. A server without ``gpus`` runs on
    whatever GPUs its job is given: checked, not placed. ``like``: the model it is a checkpoint
    of, sized in its place while its own folder is not written yet (eval's exported generator).
    ``label``: how its GPU lines name it (a replica: ``<id> replica 2``)."""
    share = spec.gpu_memory_utilization or VLLM_DEFAULT_GPU_SHARE
    share_gib = share * plan.gpu_gib
    for gpu in spec.gpus or []:
        plan.add(gpu, f"{label or model_id} vLLM ({share:g}{', running' if running else ''})",
                 share_gib)
        plan.add(gpu, "CUDA context", CUDA_CONTEXT_GIB)
    if spec.gpus is None and label is None:
        plan.notes.append(
            f"{model_id}: no serve.models.{model_id}.gpus, so it is not placed "
            f"(it takes {share:g} of the GPUs it inherits)"
        )
    shape = model_shape(model_id, spec.path) or (model_shape(like, like) if like else None)
    if shape is None and label is not None:
        return  # a further replica: its size was named with the first
    if shape is None:
        plan.notes.append(
            f"{model_id}: size unknown (no config.json, not a known model); its "
            f"share is counted, its weights are not checked"
        )
        return
    key = f"serve.models.{model_id}"
    tp = spec.tensor_parallel_size
    weights = shape.params * DTYPE_BYTES[spec.dtype] / tp / GIB
    kv_needed = shape.kv_bytes_per_token(DTYPE_BYTES[spec.dtype]) * spec.max_model_len / tp / GIB
    kv_left = share_gib - weights - VLLM_RESERVE_GIB
    if kv_left < kv_needed:
        plan.problems.append(
            f"{key}: {'' if label in (None, model_id) else f'{label}: '}"
            f"gpu_memory_utilization {share:g} x {plan.gpu_gib:g} GiB = {share_gib:.1f} GiB "
            f"per GPU holds {weights:.1f} GiB of weights + {VLLM_RESERVE_GIB:g} GiB reserve, "
            f"leaving {kv_left:.1f} GiB of KV cache < {kv_needed:.1f} GiB for one "
            f"{spec.max_model_len}-token sequence; raise the share or tensor_parallel_size, or "
            f"lower max_model_len"
        )


def plan_trainer(plan: GpuPlan, recipe: Recipe) -> None:
    """Add the verl trainer of ``models.generator`` on every GPU of one node."""
    train = recipe.train
    if train is None or train.backend != "verl" or train.verl.engine == "cpu_rehearsal":
        return  # the CPU rehearsal places nothing on GPUs
    verl = train.verl
    policy = recipe.models.get("generator")
    model_id = (policy.path or policy.model or "") if policy else ""
    shape = model_shape(model_id, policy.path if policy else None)
    if shape is None:
        plan.notes.append(
            f"models.generator {model_id!r}: size unknown; the trainer is not counted"
        )
        return
    data_parallel = verl.nnodes * verl.n_gpus_per_node
    states = shape.params * TRAIN_STATE_BYTES / data_parallel / GIB
    tokens = recipe.data.max_prompt_tokens + train.rollout.max_response_tokens
    logits = tokens * shape.vocab * 4 * LOGIT_COPIES * train.ppo.micro_batch_size / GIB
    hidden = shape.layers * tokens * shape.hidden * 2 * train.ppo.micro_batch_size / GIB
    rollout = verl.gpu_memory_utilization * plan.gpu_gib
    for gpu in range(verl.n_gpus_per_node):
        plan.add(gpu, "FSDP actor params+grads+AdamW (fp32, 16 B/param)", states)
        if rollout >= logits + hidden:
            plan.add(gpu, f"rollout vLLM ({verl.gpu_memory_utilization:g})", rollout)
        else:
            plan.add(gpu, "update activations (fp32 logits x5, checkpoints)", logits + hidden)
        plan.add(gpu, "CUDA contexts", 2 * CUDA_CONTEXT_GIB)
    rollout_weights = shape.params * 2 / verl.tensor_parallel_size / GIB
    if rollout - rollout_weights - VLLM_RESERVE_GIB <= 0:
        plan.problems.append(
            f"train.verl.gpu_memory_utilization {verl.gpu_memory_utilization:g} x "
            f"{plan.gpu_gib:g} GiB = {rollout:.1f} GiB cannot hold the policy's "
            f"{rollout_weights:.1f} GiB of bf16 weights + {VLLM_RESERVE_GIB:g} GiB reserve"
        )


def plan_in_process(plan: GpuPlan, recipe: Recipe, roles: tuple[str, ...],
                    models: Recipe | None = None) -> None:
    """Add the ``hf`` roles among ``roles`` that a step loads in process (on the first GPU, as
    ``device: auto`` places them): their weights in their dtype and a CUDA context each.
    ``models``: the recipe the step runs on (:meth:`~prour.stages.Step.served_recipe`; eval under
    ``eval.generator_backend: vllm`` calls a served generator, so loads none)."""
    models = models or recipe
    for role in roles:
        # a role the chain's own command sets (eval's models.ig_clarifier) is sized as the model
        # it is a checkpoint of (the run's models.generator, as trained)
        cfg = models.models.get(role) or supplied_model(recipe, role)
        if cfg is None or cfg.backend != "hf" or cfg.device == "cpu":
            continue
        shape = model_shape(cfg.path or "", cfg.path)
        if shape is None:
            plan.notes.append(f"models.{role} {cfg.path!r}: size unknown; not counted")
            continue
        plan.add(
            0,
            f"models.{role} in process ({cfg.dtype})",
            shape.params * DTYPE_BYTES[cfg.dtype] / GIB,
        )
        plan.add(0, "CUDA context", CUDA_CONTEXT_GIB)


def _flag(command: list[str], flag: str) -> str | None:
    """The value after ``flag`` in a server's command line, or ``None``."""
    return command[command.index(flag) + 1] if flag in command[:-1] else None


def _running_spec(entry: dict[str, Any]) -> ServedModel | None:
    """What one server of an endpoints record holds, read from the command it runs."""
    command = [str(arg) for arg in entry.get("command") or []]
    share, tp = _flag(command, "--gpu-memory-utilization"), _flag(command, "--tensor-parallel-size")
    length, dtype = _flag(command, "--max-model-len"), _flag(command, "--dtype")
    try:
        return ServedModel(
            path=entry.get("path"), gpus=entry.get("gpus"),
            gpu_memory_utilization=float(share) if share else None,
            tensor_parallel_size=int(tp) if tp else 1,
            max_model_len=int(length) if length else ServedModel().max_model_len,
            dtype=dtype if dtype in DTYPE_BYTES else "auto",
            max_num_seqs=int(seqs) if (seqs := _flag(command, "--max-num-seqs")) else None,
        )
    except ValueError:  # a record this version cannot read: not counted
        return None


def endpoints_files(recipe: Recipe) -> list[Path]:
    """The endpoints files of this run folder: the recipe's (``endpoints_file``, else
    ``<run_dir>/endpoints.json``) and those ``prour run`` writes per job under
    ``<run_dir>/endpoints/``."""
    from prour.cluster.endpoints import endpoints_path

    folder = recipe.resolved_run_dir() / "endpoints"
    found = [endpoints_path(recipe), *(sorted(folder.glob("*.json")) if folder.is_dir() else [])]
    return list(dict.fromkeys(path.resolve() for path in found))


def running_servers(recipe: Recipe) -> dict[str, ServedModel | list[ServedModel]]:
    """Model id -> the vLLM servers that run now on this node, by the run folder's endpoints files
    (``starting`` or ``ready``, written on this host, server process alive): they hold their
    GPU share whatever the stage calls. A server run as several replicas gives the list of its
    live ones."""
    import socket

    from prour.cluster.endpoints import EndpointsError, process_alive, read_endpoints

    running: dict[str, ServedModel | list[ServedModel]] = {}
    for path in endpoints_files(recipe):
        try:
            record = read_endpoints(path)
        except (EndpointsError, OSError):
            continue  # preflight and the stages name an unreadable file
        if not record or record["status"] not in ("starting", "ready") \
                or record.get("node") != socket.gethostname():
            continue
        for model_id, entry in (record.get("servers") or {}).items():
            if not isinstance(entry, dict):
                continue
            replicas = [r for r in entry.get("replicas") or [] if isinstance(r, dict)]
            if replicas:
                specs = [spec for r in replicas if process_alive(r.get("pid"))
                         and (spec := _running_spec({**entry, **r})) is not None]
                if specs:
                    running[model_id] = specs
                continue
            spec = _running_spec(entry)
            if spec is not None and process_alive(entry.get("pid")):
                running[model_id] = spec
    return running


def has_plan(stage: str) -> bool:
    """Whether the stage places anything on a node's GPUs (its table row's ``placement``)."""
    return get_stage(stage).placement != "none"


def step_servers(recipe: Recipe, step: Step) -> dict[str, ServedModel]:
    """The servers up while ``step`` runs (``prour run`` starts those it calls and stops the
    rest): those of the roles it calls, from the recipe it runs on (eval under
    ``eval.generator_backend: vllm``: with the served exported generator)."""
    served = step.served_recipe(recipe)
    specs, users = served_models(served), served_roles(served)
    wanted = set(step.roles(recipe))
    return {m: specs[m] for m, roles in users.items() if wanted & set(roles)}


def stage_servers(recipe: Recipe, stage: str) -> dict[str, ServedModel]:
    """The servers of the roles a stage's steps call (the table's roles, derived from the
    recipe); the stage that starts the servers holds every one the recipe starts."""
    if get_stage(stage).placement == "servers":
        specs, users = served_models(recipe), served_roles(recipe)
        return {m: specs[m] for m, roles in users.items() if roles}
    found: dict[str, ServedModel] = {}
    for step in _planned_steps(recipe, stage):
        found.update(step_servers(recipe, step))
    return found


def _planned_steps(recipe: Recipe, stage: str) -> list[Step]:
    """The steps of a stage that run something: those this recipe keeps (all of them when it
    keeps none, so a stage asked about anyway still gets a plan)."""
    commands = [step for step in get_stage(stage).steps if not step.is_gate]
    kept = [step for step in commands if step.skip is None or step.skip(recipe) is None]
    return kept or commands


Servers = dict[str, ServedModel | list[ServedModel]]  # model id -> spec, or its replicas as run


def gpu_plan(recipe: Recipe, stage: str, servers: Servers | None = None,
             running: Servers | None = None) -> GpuPlan:
    """The node's memory during ``stage`` (one that places something: :func:`has_plan`).

    ``prour run`` serves per step, so each step of the stage is planned with what runs while it
    does: its servers (:func:`step_servers`), the ``hf`` roles it loads in process and, for the
    trainer's stage, the verl trainer (beside its servers when ``serve.colocate_train``, the
    paper's node); servers that run on this node already (``running``; default
    :func:`running_servers`, from the endpoints files) count in every step. Steps that hold the
    same things share one plan; with several, each GPU shows the step that holds the most on it
    and every step's problems count. ``servers`` (e.g. those of ``prour serve --roles``, which
    starts them together) replaces the steps' servers with one plan of them all (a list: the
    replicas of a server as sized already). Each step's servers are sized to what it leaves
    free (:mod:`prour.cluster.sizing`), and the plan says how, step by step."""
    placement = get_stage(stage).placement
    if placement == "none":
        raise ValueError(f"stage {stage!r} places nothing on the GPUs: it has no memory plan")
    running = running_servers(recipe) if running is None else running
    if servers is not None or placement == "servers":
        servers = stage_servers(recipe, stage) if servers is None else servers
        roles = _union_roles(get_stage(stage).steps, recipe)
        return _step_plan(recipe, stage, servers, running, roles, recipe,
                          "they are served together", steps=False)
    groups: dict[str, tuple[list[str], GpuPlan]] = {}
    for step in _planned_steps(recipe, stage):
        plan = _step_plan(recipe, stage, step_servers(recipe, step), running,
                          step.roles(recipe), step.served_recipe(recipe),
                          f"step {step.name} runs")
        groups.setdefault(plan.text(), ([], plan))[0].append(step.name)  # same plan: one group
    if not groups:
        return _step_plan(recipe, stage, {}, running, (), recipe, f"stage {stage} runs")
    for names, plan in groups.values():
        plan.serving = [f"({', '.join(names)}) {line}" for line in plan.serving]
    return _peak_plan(stage, list(groups.values()))


def _union_roles(steps: tuple[Step, ...], recipe: Recipe) -> tuple[str, ...]:
    return tuple(dict.fromkeys(role for step in steps for role in step.roles(recipe)))


def _peak_plan(stage: str, groups: list[tuple[list[str], GpuPlan]]) -> GpuPlan:
    """One plan of a stage whose steps hold different things: each GPU as the step that holds
    the most on it (named on its line), every step's problems, notes and warnings."""
    if len(groups) == 1:
        return groups[0][1]
    first = groups[0][1]
    plan = GpuPlan(stage, first.gpu_gib, max(group.n_gpus for _, group in groups))
    for gpu in range(plan.n_gpus):
        names, peak = max(groups, key=lambda group: group[1].total(gpu))
        plan.uses[gpu] = list(peak.uses.get(gpu, []))
        if plan.uses[gpu]:
            plan.during[gpu] = ", ".join(names)
    for names, group in groups:
        label = ", ".join(names)
        plan.serving += group.serving
        plan.problems += [f"{label}: {problem}" for problem in group.problems]
        plan.warnings += [f"{label}: {warning}" for warning in group.warnings]
        plan.notes += [note for note in group.notes if note not in plan.notes]
    plan.notes.append("its steps hold different servers, never at once (`prour run` serves per "
                      "step): each GPU shows the step that holds the most on it")
    return plan


def _step_plan(recipe: Recipe, stage: str, servers: Servers, running: Servers,
               roles: tuple[str, ...], models: Recipe, during: str,
               steps: bool = True) -> GpuPlan:
    """The node's memory while one step runs, or a set of servers started together (``during``
    says which, in a problem's words): its servers sized to what the step leaves
    (:func:`step_sizing`), then the models it loads in process and the trainer."""
    placement = get_stage(stage).placement
    trainer = placement == "trainer"
    if trainer and not recipe.serve.colocate_train:
        servers = {}
    servers = {**{m: spec for m, spec in servers.items() if m not in running}, **running}
    sizing = _sizing(recipe, stage, servers, roles, models, steps)
    verl = trainer and recipe.train is not None and recipe.train.backend == "verl"
    trainer_gpus = recipe.train.verl.n_gpus_per_node if verl and recipe.train else 0
    listed = [gpu for insts in sizing.instances.values() for inst in insts
              for gpu in inst.spec.gpus or []]
    plan = GpuPlan(
        stage, recipe.serve.gpu_memory_gib, max([trainer_gpus, *(g + 1 for g in listed)])
    )
    generator = recipe.models.get("generator")
    for model_id, insts in sizing.instances.items():
        like = generator.path or generator.model if generator and model_id == EXPORTED_GENERATOR \
            else None
        for inst in insts:
            plan_server(plan, model_id, inst.spec, running=model_id in running, like=like,
                        label=None if inst.index == 0 else inst.label)
    if placement == "in_process":
        plan_in_process(plan, recipe, roles, models)
    if trainer:
        plan_trainer(plan, recipe)
        _note_other_servers(plan, recipe, stage, servers)
    plan.problems += sizing.problems
    plan.notes += sizing.notes
    if steps or any(len(insts) > 1 for insts in sizing.instances.values()):
        plan.serving = sizing.lines()  # servers started together keep their settings: no news
    if any(inst.share_from == "derived" or inst.slots_from == "derived"
           for insts in sizing.instances.values() for inst in insts):
        plan.notes.append(DERIVED_NOTE)
    plan.n_gpus = max(plan.n_gpus, max(plan.uses, default=-1) + 1)
    instances = {inst.label: inst.spec for insts in sizing.instances.values() for inst in insts}
    overflow = share_overflow(instances)
    if overflow is not None:  # servers that run together ask vLLM for more than the whole GPU
        gpu, users = overflow
        listing = ", ".join(f"{name} ({share:g})" for name, share in users)
        plan.problems.append(
            f"serve.models.{users[-1][0].split(' replica ')[0]}.gpu_memory_utilization: GPU "
            f"{gpu} is shared by {listing} while {during}: shares add up to "
            f"{sum(share for _, share in users):g} > 1.0; set gpu_memory_utilization on each "
            f"so that they fit"
        )
    placed = {model_id: {gpu for inst in insts for gpu in inst.spec.gpus or []}
              for model_id, insts in sizing.instances.items()}
    for gpu in range(plan.n_gpus):
        if overflow is not None and gpu == overflow[0]:
            continue  # named above, by its keys
        if plan.total(gpu) > plan.gpu_gib + 1e-9:
            parts = ", ".join(f"{what} {gib:.1f}" for what, gib in plan.uses[gpu])
            plan.problems.append(
                f"GPU {gpu} needs {plan.total(gpu):.1f} GiB > {plan.gpu_gib:g} GiB ({parts})"
            )
        elif plan.total(gpu) > (1 - TIGHT_FRACTION) * plan.gpu_gib:
            keys = [f"serve.models.{m}.gpu_memory_utilization" for m, gpus in placed.items()
                    if gpu in gpus]
            if trainer and verl:
                keys.append("train.verl.gpu_memory_utilization")
            plan.warnings.append(
                f"GPU {gpu} is planned at {plan.total(gpu):.1f} of {plan.gpu_gib:g} GiB "
                f"({plan.total(gpu) / plan.gpu_gib:.0%}), within {TIGHT_FRACTION:.0%} of its "
                f"memory; the reserves are estimates, so a server may find too little for its "
                f"KV cache: lower {' or '.join(keys) or 'what it holds'} for more headroom"
            )
    return plan


DERIVED_NOTE = (
    "derived: a server without gpu_memory_utilization (or with size_per_step) gets 95% of its "
    "GPUs less what its step holds besides, servers sharing a GPU splitting its KV cache to hold "
    "as many tokens each; replicas: auto adds a copy on each GPU with room beside no trainer; a "
    "replica without max_num_seqs runs its KV tokens // the tokens one request reaches "
    "(prour/cluster/sizing.py)")


def node_gpus(recipe: Recipe) -> int:
    """GPUs of a node, as the recipe names them: the trainer's (verl) and every GPU a server of
    ``serve.models`` lists."""
    train = recipe.train
    trainer = train.verl.n_gpus_per_node if train is not None and train.backend == "verl" \
        and train.verl.engine != "cpu_rehearsal" else 0
    listed = [gpu for spec in recipe.serve.models.values() for gpu in spec.gpus or []]
    return max([trainer, *(gpu + 1 for gpu in listed)])


def _sizing(recipe: Recipe, stage: str, servers: Servers, roles: tuple[str, ...],
            models: Recipe, steps: bool = True) -> Sizing:
    """The servers sized to what the stage's step leaves on the node (``steps``: a step of
    ``prour run``; else servers started together): the trainer and the models loaded in process
    are placed first (a scratch plan), then the servers around them."""
    from prour.cluster.sizing import contexts, size_servers

    placement = get_stage(stage).placement
    scratch = GpuPlan(stage, recipe.serve.gpu_memory_gib, 0)
    if placement == "in_process":
        plan_in_process(scratch, recipe, roles, models)
    trainer_gpus: list[int] = []
    if placement == "trainer":
        plan_trainer(scratch, recipe)
        trainer_gpus = sorted({gpu for gpu, uses in scratch.uses.items() if uses})
    generator = recipe.models.get("generator")
    like = (generator.path or generator.model) if generator is not None else None
    shapes = {}
    for model_id, given in servers.items():
        spec = given if isinstance(given, ServedModel) else given[0]
        shapes[model_id] = model_shape(model_id, spec.path) or (
            model_shape(like, like) if like and model_id == EXPORTED_GENERATOR else None)
    measured, where = _measured(models, stage)
    return size_servers(
        servers, gpu_gib=recipe.serve.gpu_memory_gib, node_gpus=node_gpus(models),
        fixed={gpu: scratch.total(gpu) for gpu in scratch.uses}, trainer_gpus=trainer_gpus,
        shapes=shapes, contexts=contexts(models, servers, measured, where), steps=steps)


def _measured(recipe: Recipe, stage: str) -> tuple[dict[str, tuple[float, int]], Path | None]:
    """Role -> (mean tokens per request, requests) in the run's own eval results, for the eval
    stage's servers (none yet: empty)."""
    path = get_stage(stage).sized_from(recipe)
    if path is None:
        return {}, None
    from prour.eval.results import role_tokens

    found = {role: (t.context, t.requests) for role, t in _read_tokens(path, role_tokens).items()}
    return found, path if found else None


def _read_tokens(path: Path, reader: Any) -> dict[str, Any]:
    """``reader`` over the latest result line of each key in ``path`` (missing: nothing), kept
    while the file is unchanged: the plans of one dry run read it once."""
    try:
        stat = path.stat()
    except OSError:
        return {}
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    if key not in _TOKENS_CACHE:
        from prour.eval.harness import load_result_lines

        _TOKENS_CACHE.clear()
        _TOKENS_CACHE[key] = reader(load_result_lines(path).values())
    return _TOKENS_CACHE[key]


_TOKENS_CACHE: dict[tuple[str, int, int], dict[str, Any]] = {}


def step_sizing(recipe: Recipe, step: Step, running: Servers | None = None) -> Sizing:
    """How ``step``'s servers are sized on this node (:mod:`prour.cluster.sizing`): what
    ``prour run`` starts them with before the step. ``running``: servers that hold their memory
    already (default none: the runner restarts what it resizes)."""
    from prour.stages import stage_of

    stage = stage_of(step).name
    servers: Servers = {**step_servers(recipe, step), **(running or {})}
    if stage_of(step).placement == "trainer" and not recipe.serve.colocate_train:
        servers = {}
    return _sizing(recipe, stage, servers, step.roles(recipe), step.served_recipe(recipe))


def together_sizing(recipe: Recipe, servers: Servers) -> Sizing:
    """``servers`` sized as started together on a node with nothing else (``prour serve``)."""
    return _sizing(recipe, "serve", servers, (), recipe, steps=False)


def _note_other_servers(
    plan: GpuPlan, recipe: Recipe, stage: str, servers: dict[str, ServedModel]
) -> None:
    """The trainer's node serves only its stage's models: say which others to stop, and how to
    serve just the roles it calls."""
    from prour.recipes import prour_command

    every = {m for m, roles in served_roles(recipe).items() if roles}
    others = sorted(every - set(servers))
    if others and servers:
        served = {role for roles in served_roles(recipe).values() for role in roles}
        roles = [role for role in stage_roles(recipe, stage) if role in served]
        plan.notes.append(
            f"counts only the {stage} stage's servers; stop {', '.join(others)} on this node "
            f"while training (`{prour_command(recipe, 'serve', '--roles', ','.join(roles))}`)"
        )


def check_stage(recipe: Recipe, stage: str) -> GpuPlan:
    """The stage's plan, or :class:`GpuPlanError` with its numbers when it does not fit (the
    check ``prour validate --preflight`` and the dry-runs share)."""
    plan = gpu_plan(recipe, stage)
    plan.check()
    return plan
