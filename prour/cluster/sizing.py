"""Each step's vLLM servers sized to the memory that step leaves on the node.

``prour run`` serves per step, so a server need not keep one size for the whole chain: in the
step that runs it, a server with ``gpus`` and no ``gpu_memory_utilization`` (or with
``size_per_step``) gets what the step leaves on its GPUs, its ``replicas`` take the GPUs the step
leaves room on, and its ``max_num_seqs`` follows from the KV cache that share leaves. Servers
started together outside a step (``prour serve``, a study's serving groups) keep their own
shares (vLLM's 0.9 without one) and limits; only a number of ``replicas`` is placed for them.
The rules of a step, in order:

1. **What a GPU offers**: 95 % of its memory (the last 5 % is the GPU plan's headroom, since the
   reserves are estimates) less what the step holds there besides derived servers: the
   trainer, models loaded in process, servers whose share is pinned (or that already run), and
   a CUDA context per process.
2. **Replicas**: ``replicas: N`` or ``auto`` adds copies of a server on the GPUs (groups of
   ``tensor_parallel_size``) not yet holding one, the roomiest first, each only where its
   floor fits: its weights, vLLM's reserve and the KV cache of one ``max_model_len`` sequence
   (what vLLM needs to start). ``auto`` stops when no GPU has room; no copy goes beside the
   trainer, whose memory swings between its rollout and its update.
3. **Shares**: on each GPU the derived servers first take their weights and reserve; the KV
   memory left is split so that each of them caches the same number of tokens (in proportion
   to its KV bytes per token and GPU). A share is rounded down to hundredths; a server on
   several GPUs takes the smallest share they give it.
4. **Requests in flight**: a replica's KV tokens are its KV GiB x tensor parallel / (2 x layers
   x KV heads x head size x dtype bytes); unless ``max_num_seqs`` pins it, it runs tokens //
   context requests at once, the context being what one request reaches (:func:`contexts`: a
   run's own results, ``context_tokens``, eval's generator budgets). A model with no such
   number keeps vLLM's own limit; the plan says how many ``max_model_len`` sequences fit.

Everything here is arithmetic on the recipe and the model shapes of :mod:`prour.cluster.gpu_plan`;
the plan and the dry-run print the result step by step (:meth:`Sizing.lines`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from prour.cluster.shapes import (
    CUDA_CONTEXT_GIB,
    DTYPE_BYTES,
    GIB,
    TIGHT_FRACTION,
    VLLM_RESERVE_GIB,
    ModelShape,
)
from prour.config.cluster import VLLM_DEFAULT_GPU_SHARE, ServedModel

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe

HEADROOM = TIGHT_FRACTION  # derived shares stop this short of each GPU: the plan's own margin


# ---- the arithmetic --------------------------------------------------------------------------


def floor_share(gib: float, gpu_gib: float) -> float:
    """The largest vLLM share, in hundredths rounded down, that stays within ``gib`` of a GPU of
    ``gpu_gib``."""
    return math.floor(gib / gpu_gib * 100 + 1e-9) / 100


def kv_tokens(kv_gib: float, kv_bytes_per_token: int, tensor_parallel: int = 1) -> int:
    """Tokens a replica's KV cache holds when each of its ``tensor_parallel`` GPUs keeps
    ``kv_gib`` of it (a GPU holds 1/tp of every token's keys and values)."""
    return max(0, math.floor(kv_gib * GIB * tensor_parallel / kv_bytes_per_token))


def sequence_slots(tokens: int, context: int) -> int:
    """Requests whose sequences of ``context`` tokens fit ``tokens`` at once (at least one)."""
    return max(1, tokens // context)


def equal_token_split(pool_gib: float, bytes_per_token: Sequence[float]) -> list[float]:
    """GiB of a GPU's KV memory ``pool_gib`` for each server sharing it, so that each caches the
    same number of tokens: in proportion to its KV bytes per token on that GPU."""
    total = sum(bytes_per_token)
    return [pool_gib * b / total for b in bytes_per_token]


# ---- the result ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Instance:
    """One vLLM process of a served model: replica ``index`` (0: the recipe's own ``gpus``)
    with its concrete settings, where its share and its ``max_num_seqs`` come from, and the KV
    cache the share leaves (``None``: size unknown)."""

    model_id: str
    index: int
    spec: ServedModel
    share_from: str  # "pinned", "derived", "as it runs", "vLLM's default"
    slots_from: str  # "pinned", "derived", "vLLM's own"
    kv_gib: float | None = None
    tokens: int | None = None

    @property
    def label(self) -> str:
        return self.model_id if self.index == 0 else f"{self.model_id} replica {self.index + 1}"


@dataclass
class Sizing:
    """The instances of each served model in one step (or one set of servers started
    together), the context each model's requests reach, and what cannot be placed."""

    instances: dict[str, list[Instance]] = field(default_factory=dict)
    contexts: dict[str, tuple[int, str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def specs(self) -> dict[str, list[ServedModel]]:
        """Model id -> the concrete settings of each of its replicas."""
        return {m: [inst.spec for inst in insts] for m, insts in self.instances.items()}

    def slots(self, model_id: str) -> int | None:
        """Requests all replicas of ``model_id`` run at once (None: one runs at vLLM's own)."""
        seqs = [inst.spec.max_num_seqs for inst in self.instances.get(model_id, [])]
        return sum(seqs) if seqs and None not in seqs else None  # type: ignore[arg-type]

    def lines(self) -> list[str]:
        """One line per model: each replica's GPUs, share, KV cache and requests at once, and
        the context they are counted at."""
        out = []
        for model_id, insts in self.instances.items():
            if len(insts) == 1 and not insts[0].spec.gpus:
                continue  # one copy on the job's GPUs (or the CPU): nothing placed or sized
            parts = [_instance_text(inst) for inst in insts]
            head = model_id if len(insts) == 1 else f"{model_id} x{len(insts)} replicas"
            total = self.slots(model_id)
            context = self.contexts.get(model_id)
            tail = ""
            if total is not None and context is not None and any(
                    inst.slots_from == "derived" for inst in insts):
                tail = (f"; {total:,} requests in flight at {context[0]:,} tokens each "
                        f"({context[1]})")
            elif total is not None:
                tail = f"; {total:,} requests in flight"
            elif any(inst.tokens is not None for inst in insts):
                length = insts[0].spec.max_model_len
                full = sum((inst.tokens or 0) // length for inst in insts)
                how = ("derived in prour run's steps only" if context is not None else
                       f"serve.models.{model_id}.context_tokens derives it")
                tail = (f"; max_num_seqs left to vLLM ({full:,} sequence(s) of max_model_len "
                        f"{length:,} fit; {how})")
            out.append(f"{head}: {'; '.join(parts)}{tail}")
        return out


def _gpus(gpus: list[int] | None) -> str:
    if gpus is None:
        return "the job's GPUs"
    return f"GPU {','.join(map(str, gpus))}" if gpus else "CPU"


def _instance_text(inst: Instance) -> str:
    spec = inst.spec
    share = spec.gpu_memory_utilization
    text = _gpus(spec.gpus)
    if spec.gpus:
        text += f" at {share:g} ({inst.share_from})" if share is not None else \
            f" at vLLM's {VLLM_DEFAULT_GPU_SHARE:g}"
    if inst.kv_gib is not None and inst.tokens is not None:
        text += f", {inst.kv_gib:.1f} GiB KV cache = {inst.tokens:,} tokens"
    if spec.max_num_seqs is not None:
        text += f", {spec.max_num_seqs:,} at once ({inst.slots_from})"
    return text


# ---- sizing ----------------------------------------------------------------------------------


@dataclass
class _Model:
    """What sizing needs of one server to size: its shape's per-GPU numbers."""

    model_id: str
    spec: ServedModel
    shape: ModelShape | None
    steps: bool = True  # sized for a step of `prour run` (size_per_step applies)

    @property
    def tp(self) -> int:
        return self.spec.tensor_parallel_size

    @property
    def bytes_per_token(self) -> int:
        assert self.shape is not None
        return self.shape.kv_bytes_per_token(DTYPE_BYTES[self.spec.dtype])

    @property
    def base_gib(self) -> float:
        """Weights on one of its GPUs and vLLM's reserve."""
        assert self.shape is not None
        weights = self.shape.params * DTYPE_BYTES[self.spec.dtype] / self.tp / GIB
        return weights + VLLM_RESERVE_GIB

    @property
    def one_sequence_gib(self) -> float:
        """KV cache of one ``max_model_len`` sequence on one of its GPUs."""
        return self.bytes_per_token * self.spec.max_model_len / self.tp / GIB

    @property
    def pinned(self) -> bool:
        """Its share is given, and not replaced by a step's (``size_per_step``)."""
        return self.spec.gpu_memory_utilization is not None and not (
            self.steps and self.spec.size_per_step)

    @property
    def fixed(self) -> bool:
        """Its share is not derived: pinned, or started outside a step (its own, else vLLM's)."""
        return self.pinned or not self.steps

    @property
    def fixed_share(self) -> float:
        return self.spec.gpu_memory_utilization or VLLM_DEFAULT_GPU_SHARE


def size_servers(servers: Mapping[str, ServedModel | Sequence[ServedModel]], *,
                 gpu_gib: float, node_gpus: int, fixed: Mapping[int, float],
                 trainer_gpus: Collection[int], shapes: Mapping[str, ModelShape | None],
                 contexts: Mapping[str, tuple[int, str]], steps: bool = True) -> Sizing:
    """The instances of ``servers`` (model id -> a spec to size, or the concrete instances of a
    server that runs already) on a node of ``node_gpus`` GPUs of ``gpu_gib`` each, where the step
    holds ``fixed`` GiB per GPU besides servers (trainer, in-process models and their CUDA
    contexts) and the trainer uses ``trainer_gpus``; ``shapes`` gives each model's size (None:
    unknown, so not sized), ``contexts`` the tokens one request reaches; ``steps``: sized for a
    step of ``prour run``, else started together (``prour serve``: every server keeps its own
    share and limit, only a number of replicas is placed). Rules: the module's docstring."""
    usable = (1 - HEADROOM) * gpu_gib
    sizing = Sizing(contexts=dict(contexts))
    held: defaultdict[int, float] = defaultdict(float, fixed)  # GiB placed before the KV split
    derived: list[tuple[_Model, int, list[int]]] = []  # (model, replica index, GPUs)
    placed: dict[str, list[Instance | tuple[int, list[int]]]] = {}
    models: dict[str, _Model] = {}
    for model_id, given in servers.items():
        if not isinstance(given, ServedModel):  # runs already: held as it runs
            placed[model_id] = []
            for index, spec in enumerate(given):
                share = spec.gpu_memory_utilization or VLLM_DEFAULT_GPU_SHARE
                for gpu in spec.gpus or []:
                    held[gpu] += share * gpu_gib + CUDA_CONTEXT_GIB
                placed[model_id].append(Instance(model_id, index, spec, "as it runs",
                                                 "pinned" if spec.max_num_seqs else "vLLM's own"))
            continue
        model = models[model_id] = _Model(model_id, given, shapes.get(model_id), steps)
        if not given.gpus:  # not placed (inherits its job's GPUs) or on CPU: copies as given
            copies = given.replicas if isinstance(given.replicas, int) else 1
            if given.replicas == "auto":
                sizing.notes.append(f"{model_id}: replicas auto places copies on GPUs it is "
                                    f"given (serve.models.{model_id}.gpus); one runs")
            copy = given.model_copy(update={"replicas": 1})
            placed[model_id] = [
                Instance(model_id, i, copy, "pinned" if model.pinned else "vLLM's default",
                         "pinned" if given.max_num_seqs else "vLLM's own")
                for i in range(copies)]
            continue
        if model.shape is None and not model.fixed:
            share = given.gpu_memory_utilization or VLLM_DEFAULT_GPU_SHARE
            sizing.notes.append(f"{model_id}: size unknown, so not sized: it takes {share:g} of "
                                f"its GPUs")
        placed[model_id] = [(0, list(given.gpus))]
        _hold(held, model, given.gpus, gpu_gib)
    for model_id, model in models.items():  # further replicas, on the GPUs with the most room
        spec = model.spec
        if not spec.gpus or spec.replicas == 1 or (spec.replicas == "auto" and model.fixed):
            continue  # auto: copies only where the server is sized
        if model.shape is None:
            sizing.problems.append(f"serve.models.{model_id}.replicas: the size of {model_id} is "
                                   f"unknown (no config.json), so its copies cannot be placed")
            continue
        wanted = node_gpus // model.tp if spec.replicas == "auto" else int(spec.replicas)
        need = (model.fixed_share * gpu_gib if model.fixed
                else model.base_gib + model.one_sequence_gib) + CUDA_CONTEXT_GIB
        while len(placed[model_id]) < wanted:
            used = {gpu for entry in placed[model_id] if isinstance(entry, tuple)
                    for gpu in entry[1]}
            room = {gpu: usable - held[gpu] for gpu in range(node_gpus)
                    if gpu not in used and gpu not in trainer_gpus}
            fits = sorted((gpu for gpu, left in room.items() if left >= need - 1e-9),
                          key=lambda gpu: (-room[gpu], gpu))
            if len(fits) < model.tp:
                break
            gpus = sorted(fits[:model.tp])
            placed[model_id].append((len(placed[model_id]), gpus))
            _hold(held, model, gpus, gpu_gib)
        if spec.replicas != "auto" and len(placed[model_id]) < wanted:
            sizing.problems.append(
                f"serve.models.{model_id}.replicas: {wanted} asked, room for "
                f"{len(placed[model_id])} ({model.base_gib + model.one_sequence_gib:.1f} GiB of "
                f"weights, reserve and one {spec.max_model_len}-token sequence per GPU; no copy "
                f"beside the trainer); lower replicas or use auto")
    for model_id, entries in placed.items():
        for entry in entries:
            if isinstance(entry, tuple):
                model = models[model_id]
                if not model.fixed and model.shape is not None:
                    derived.append((model, entry[0], entry[1]))
    shares = _derived_shares(derived, held, usable, gpu_gib)
    for model_id, entries in placed.items():
        insts = []
        for entry in entries:
            if isinstance(entry, Instance):
                insts.append(entry)
                continue
            index, gpus = entry
            insts.append(_instance(models[model_id], index, gpus, shares.get((model_id, index)),
                                   gpu_gib, contexts.get(model_id), sizing))
        sizing.instances[model_id] = insts
    return sizing


def _hold(held: defaultdict[int, float], model: _Model, gpus: list[int], gpu_gib: float) -> None:
    """Count one instance on ``gpus``: its CUDA context and its pinned share, or (derived) its
    weights, reserve and one sequence, which later replicas must leave it."""
    for gpu in gpus:
        held[gpu] += CUDA_CONTEXT_GIB
        if model.fixed or model.shape is None:  # not sized: its own share, else vLLM's
            held[gpu] += model.fixed_share * gpu_gib
        else:
            held[gpu] += model.base_gib + model.one_sequence_gib


def _derived_shares(derived: list[tuple[_Model, int, list[int]]], held: Mapping[int, float],
                    usable: float, gpu_gib: float) -> dict[tuple[str, int], float]:
    """(model id, replica) -> share of each derived instance: on each GPU, what the step leaves
    after everything else and the derived servers' weights and reserves, split so that each
    caches as many tokens; the smallest over its GPUs."""
    on_gpu: defaultdict[int, list[tuple[_Model, int]]] = defaultdict(list)
    for model, index, gpus in derived:
        for gpu in gpus:
            on_gpu[gpu].append((model, index))
    offers: defaultdict[tuple[str, int], list[float]] = defaultdict(list)
    for gpu, users in on_gpu.items():
        # held counts each derived user's base + one sequence: take those back out
        pool = usable - held[gpu] + sum(m.one_sequence_gib for m, _ in users)
        split = equal_token_split(pool, [m.bytes_per_token / m.tp for m, _ in users])
        for (model, index), kv in zip(users, split):
            offers[(model.model_id, index)].append(floor_share(model.base_gib + kv, gpu_gib))
    return {key: max(min(values), 0.01) for key, values in offers.items()}  # < 0.01: a problem


def _instance(model: _Model, index: int, gpus: list[int], share: float | None, gpu_gib: float,
              context: tuple[int, str] | None, sizing: Sizing) -> Instance:
    """The concrete instance: its share (derived, pinned or vLLM's default for a size unknown),
    the KV cache it leaves and its requests at once."""
    spec = model.spec
    share_from = "derived" if share is not None else ("pinned" if model.pinned else
                                                       "vLLM's default")
    share = share if share is not None else (spec.gpu_memory_utilization if model.fixed
                                             else None)
    update: dict[str, object] = {"gpus": gpus, "replicas": 1, "gpu_memory_utilization": share}
    if model.shape is None:  # not sized: its own share
        update["gpu_memory_utilization"] = spec.gpu_memory_utilization
        slots_from = "pinned" if spec.max_num_seqs else "vLLM's own"
        return Instance(model.model_id, index, spec.model_copy(update=update), share_from,
                        slots_from)
    kv = (share or VLLM_DEFAULT_GPU_SHARE) * gpu_gib - model.base_gib
    tokens = kv_tokens(kv, model.bytes_per_token, model.tp)
    key = f"serve.models.{model.model_id}"
    if share_from == "derived" and kv < model.one_sequence_gib - 1e-9:
        sizing.problems.append(
            f"{key}: its step leaves {share or 0:g} x {gpu_gib:g} GiB on {_gpus(gpus)} for "
            f"replica {index + 1}: {max(kv, 0):.1f} GiB of KV cache < {model.one_sequence_gib:.1f} "
            f"GiB for one {spec.max_model_len}-token sequence; free a GPU or lower max_model_len")
    slots_from = "pinned" if spec.max_num_seqs else "vLLM's own"
    if spec.max_num_seqs is None and context is not None and model.steps:
        update["max_num_seqs"] = sequence_slots(tokens, context[0])
        slots_from = "derived"
    return Instance(model.model_id, index, spec.model_copy(update=update), share_from,
                    slots_from, kv_gib=kv, tokens=tokens)


# ---- the context one request reaches ---------------------------------------------------------


def contexts(recipe: Recipe, servers: Mapping[str, object],
             measured: Mapping[str, tuple[float, int]] | None = None,
             measured_at: Path | None = None) -> dict[str, tuple[int, str]]:
    """Model id -> (tokens one request reaches on it, where the number comes from): the mean
    tokens per request of the roles it serves in a run's own results (``measured``: role ->
    (mean tokens per request, requests); the largest of its roles) when they record any, else
    ``context_tokens`` (the recipe's assumption), else, for eval's exported generator, its
    prompt budget plus its reply budget. A model with none of these is left out: its requests
    may reach ``max_model_len``, and a limit counted at that length would hold it far below what
    vLLM runs (which preempts a request when the cache runs out), so vLLM keeps its own."""
    from prour.cluster.recipe import EXPORTED_GENERATOR, served_roles

    users = served_roles(recipe)
    out: dict[str, tuple[int, str]] = {}
    for model_id, given in servers.items():
        spec = given if isinstance(given, ServedModel) else next(iter(given))  # type: ignore[call-overload]
        roles = [role for role in users.get(model_id, []) if measured and role in measured]
        if roles:
            role = max(roles, key=lambda r: measured[r][0])  # type: ignore[index]
            mean, requests = measured[role]  # type: ignore[index]
            where = (f"mean tokens per {role} request, {requests:,} requests in "
                     f"{measured_at or 'this run'}")
            out[model_id] = (max(16, math.ceil(mean)), where)
        elif spec.context_tokens is not None:
            where = (f"serve.models.{model_id}.context_tokens, assumed until a run's results "
                     "record its requests")
            out[model_id] = (spec.context_tokens, where)
        elif model_id == EXPORTED_GENERATOR and recipe.train is not None:
            prompt, reply = recipe.data.max_prompt_tokens, recipe.train.rollout.max_response_tokens
            where = (f"data.max_prompt_tokens {prompt:,} + train.rollout.max_response_tokens "
                     f"{reply:,}")
            out[model_id] = (prompt + reply, where)
    return out
