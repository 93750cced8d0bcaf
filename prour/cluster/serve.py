"""``prour serve``: one vLLM server per frozen model of a recipe, started and stopped together.

Servers that share a GPU start one after another (each vLLM sizes its KV cache from the memory
free when it starts), the others in parallel; each waits for ``/health``. The first one that
cannot start stops the others at once (their processes are signalled, so nobody waits for a slow
start-up), and the endpoints file records the error. Once all are healthy the file says ``ready`` and the command
holds the foreground until SIGINT/SIGTERM or until a server dies, then stops every server by PID.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prour.cluster.endpoints import (
    endpoints_path,
    process_alive,
    read_endpoints,
    write_endpoints,
)
from prour.cluster.gpu_plan import GpuPlan, GpuPlanError, gpu_plan
from prour.cluster.recipe import nothing_to_serve, served_models, served_roles
from prour.cluster.vllm_server import VLLMServer, free_port, log_tail
from prour.config import MODEL_ROLES, Recipe
from prour.config.cluster import ServedModel
from prour.llm.run_key import KEY_ENV, ensure_run_key, read_run_key

if TYPE_CHECKING:  # pragma: no cover
    from prour.step import Step

logger = logging.getLogger(__name__)

WILDCARD_HOSTS = ("0.0.0.0", "::", "")
POLL_S = 0.2
# Roles whose chat requests offer tools: the task agent, the user simulator (tau2 user tools) and
# the read-only verifier. vLLM answers such a request only with tool choice enabled and a parser.
TOOL_ROLES = frozenset({"agent", "user", "verifier"})


class ServeError(RuntimeError):
    """A server could not start, died while serving, or the request makes no sense."""


@dataclass(frozen=True)
class ServerPlan:
    """One server to start: its model id (the served name), spec, roles, bind host and log file."""

    model_id: str
    spec: ServedModel
    roles: tuple[str, ...]
    host: str
    log_path: Path
    advertise: str | None = None  # serve.advertise_host
    # further copies of the server, each with its own GPUs, share and max_num_seqs
    # (prour.cluster.sizing); the first is ``spec``
    replicas: tuple[ServedModel, ...] = ()

    @property
    def specs(self) -> tuple[ServedModel, ...]:
        """The settings of every copy, the first one's first."""
        return (self.spec, *self.replicas)

    def replica_log(self, index: int) -> Path:
        """The log file of copy ``index`` (0: ``log_path``)."""
        if index == 0:
            return self.log_path
        return self.log_path.with_name(f"{self.log_path.stem}.replica{index + 1}.log")

    @property
    def advertised_host(self) -> str:
        """The host other machines use: ``serve.advertise_host``, else the bind address, or this
        node's own address (:func:`node_address`) when binding to every interface."""
        if self.advertise:
            return self.advertise
        return node_address() if self.host in WILDCARD_HOSTS else self.host


SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address


def interface_addresses() -> list[str]:
    """The IPv4 address of each network interface of this node (its network namespace) that has
    one, in interface order, loopback included."""
    import fcntl
    import struct

    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                answer = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, request)
            except OSError:  # no IPv4 address on this interface
                continue
            found.append(socket.inet_ntoa(answer[20:24]))
    return found


def node_address() -> str:
    """How other nodes reach a server bound to every interface here: this node's hostname when it
    resolves to one of this node's own non-loopback addresses (a cluster's DNS), else the first
    such address. A hostname that resolves to loopback (``127.0.1.1`` in many /etc/hosts) or to
    another machine's address (nodes simulated by network namespaces share one hostname) would
    send the other nodes' requests to themselves."""
    own = [addr for addr in interface_addresses() if not addr.startswith("127.")]
    name = socket.gethostname()
    try:
        resolved = socket.gethostbyname(name)
    except OSError:
        resolved = None
    if resolved in own or not own:
        return name
    return own[0]


def plan_servers(recipe: Recipe, roles: Sequence[str] | None = None, *,
                 step: Step | None = None) -> list[ServerPlan]:
    """The servers the recipe asks for, restricted to those used by ``roles`` when given; a recipe
    that serves nothing is refused. With ``step`` (``recipe`` the run's own), the servers of the
    recipe the step runs on (eval's exported generator too), those it calls with the sizes and
    replicas of that step (:func:`prour.cluster.gpu_plan.step_sizing`), as ``prour run`` starts
    them; without, the recipe's own settings (the copies of a server without ``gpus``
    included)."""
    run = recipe
    if step is not None:
        recipe = step.served_recipe(recipe)
    why = nothing_to_serve(recipe)
    if why:
        raise ServeError(why)
    users = served_roles(recipe)
    specs = served_models(recipe)
    wanted = list(users)
    if roles:
        check_roles(recipe, roles, users)
        wanted = [model_id for model_id, used in users.items() if set(used) & set(roles)]
    log_dir = Path(recipe.serve.log_dir)
    plans = [
        ServerPlan(
            model_id=model_id,
            spec=specs[model_id],
            roles=tuple(users[model_id]),
            host=specs[model_id].host or recipe.serve.host,
            log_path=log_dir / f"{safe_name(model_id)}.log",
            advertise=recipe.serve.advertise_host,
        )
        for model_id in wanted
    ]
    if step is not None:
        from prour.cluster.gpu_plan import step_sizing

        return sized_plans(plans, step_sizing(run, step).specs())
    # copies of a server without gpus need no placing: each inherits the job's GPUs (or the CPU)
    return [replace(plan, replicas=(plan.spec,) * (plan.spec.replicas - 1))
            if plan.spec.gpus is None and isinstance(plan.spec.replicas, int) else plan
            for plan in plans]


def sized_plans(plans: Sequence[ServerPlan],
                sized: dict[str, list[ServedModel]]) -> list[ServerPlan]:
    """``plans`` with the settings ``sized`` gives each model (its first copy, then the rest as
    replicas); a model it does not name keeps its own."""
    return [replace(plan, spec=sized[plan.model_id][0],
                    replicas=tuple(sized[plan.model_id][1:])) if sized.get(plan.model_id)
            else plan for plan in plans]


def resized_servers(recipe: Recipe, step: Step, running: Mapping[str, Any]) -> set[str]:
    """The servers of ``running`` (model id -> the group that started it) that ``step`` calls
    with other sizes than they run with: ``prour run`` restarts them, so that each step's
    servers have what that step leaves free."""
    if not running:
        return set()
    try:
        fresh = {plan.model_id: plan for plan in plan_servers(recipe, step=step)}
    except ServeError:
        return set()
    return {model_id for model_id, group in running.items()
            if model_id in fresh and group.plans.get(model_id) != fresh[model_id]}


def check_roles(recipe: Recipe, roles: Sequence[str], users: dict[str, list[str]]) -> None:
    """Each requested role exists and is served by this recipe."""
    served = {role for used in users.values() for role in used}
    for role in roles:
        if role not in MODEL_ROLES:
            raise ServeError(f"--roles: unknown role {role!r}; valid: {', '.join(MODEL_ROLES)}")
        if role not in served:
            cfg = recipe.models.get(role)
            why = (
                "is not in the recipe's models"
                if cfg is None
                else (
                    f"uses backend {cfg.backend!r}"
                    if cfg.backend != "openai"
                    else "has a fixed base_url"
                )
            )
            raise ServeError(
                f"--roles: role {role!r} {why}, so no server is started for it "
                f"(served roles: {', '.join(sorted(served)) or 'none'})"
            )


def safe_name(model_id: str) -> str:
    """A file name for a model id (``Qwen/Qwen3-8B`` -> ``Qwen_Qwen3-8B``)."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in model_id)


def server_flags(spec: ServedModel, roles: Sequence[str]) -> list[str]:
    """vLLM flags the roles sharing one server need, merged: tool calling with its parser when any
    role offers tools, the reasoning parser, and prefix caching."""
    flags = []
    if TOOL_ROLES & set(roles):
        if not spec.tool_call_parser:
            raise ServeError(
                f"roles {', '.join(sorted(TOOL_ROLES & set(roles)))} send tool-calling requests, "
                f"but this server's tool_call_parser is null; set it (Qwen3: hermes)"
            )
        flags += ["--enable-auto-tool-choice", "--tool-call-parser", spec.tool_call_parser]
    if spec.reasoning_parser:
        flags += ["--reasoning-parser", spec.reasoning_parser]
    flags.append(
        "--enable-prefix-caching" if spec.enable_prefix_caching else "--no-enable-prefix-caching"
    )
    return flags


def vllm_server(plan: ServerPlan, python: str | None, models_dir: str | None = None,
                strict: bool = True, replica: int = 0) -> VLLMServer:
    """The :class:`VLLMServer` for one plan (port fixed now so the URL is known before start);
    its weights are local (:func:`prour.llm.weights.local_weights`), never downloaded. Without
    ``strict`` (a dry run) a model with no local weights keeps its id; preflight names it.
    ``replica``: which copy (a copy after the first takes a free port and a log of its own)."""
    from prour.llm.weights import ModelNotFound, local_weights

    spec = plan.specs[replica]
    try:
        weights = local_weights(spec.path or plan.model_id, models_dir,
                                f"serve.models.{plan.model_id}")
    except ModelNotFound:
        if strict:
            raise
        weights = spec.path or plan.model_id
    extra = ["--tensor-parallel-size", str(spec.tensor_parallel_size)]
    extra += server_flags(spec, plan.roles)
    if spec.gpu_memory_utilization is not None:
        extra += ["--gpu-memory-utilization", str(spec.gpu_memory_utilization)]
    if spec.max_num_seqs is not None:
        extra += ["--max-num-seqs", str(spec.max_num_seqs)]
    env = dict(spec.env)
    if spec.gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(gpu) for gpu in spec.gpus)
    probe_host = "127.0.0.1" if plan.host in WILDCARD_HOSTS else plan.host
    return VLLMServer(
        weights,
        python=python,
        port=(spec.port if replica == 0 else None) or free_port(probe_host),
        host=plan.host,
        served_name=plan.model_id,
        max_model_len=spec.max_model_len,
        dtype=spec.dtype,
        extra_args=[*extra, *spec.extra_args],
        env=env,
        log_path=plan.replica_log(replica),
        enforce_eager=spec.enforce_eager,
    )


class ReplicaSet:
    """The copies of one served model, started one after another and stopped together. It
    answers where one server is asked: its first copy's port and command, and a PID that is a
    live copy's while any copy runs (a copy that dies leaves the others serving; the client
    spreads requests over those that answer)."""

    def __init__(self, replicas: Sequence[VLLMServer]):
        self.replicas = list(replicas)

    def __repr__(self) -> str:
        return f"ReplicaSet({self.replicas!r})"

    @property
    def port(self) -> int | None:
        return self.replicas[0].port

    @property
    def model_dir(self) -> str:
        return self.replicas[0].model_dir

    @property
    def pid(self) -> int | None:
        live = [r.pid for r in self.replicas if process_alive(r.pid)]
        return live[0] if live else self.replicas[0].pid

    @property
    def launched_pid(self) -> int | None:
        return self.replicas[0].launched_pid

    def command(self) -> list[str]:
        return self.replicas[0].command()

    def start(self, timeout_s: float = 180.0) -> ReplicaSet:
        """Start each copy once the one before is healthy; a failure stops those started."""
        try:
            for replica in self.replicas:
                replica.start(timeout_s=timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for replica in self.replicas:
            replica.stop()


def instances(server: VLLMServer | ReplicaSet) -> list[VLLMServer]:
    """The processes of one served model: its copies, or the one server."""
    return server.replicas if isinstance(server, ReplicaSet) else [server]


def plan_gpus(plan: ServerPlan) -> set[int] | None:
    """The GPUs every copy of ``plan`` uses together (None: one inherits its job's GPUs)."""
    if any(spec.gpus is None for spec in plan.specs):
        return None
    return {gpu for spec in plan.specs for gpu in spec.gpus or []}


def start_chains(plans: Sequence[ServerPlan], gpu_node: bool | None = None) -> list[list[str]]:
    """The model ids in start order: servers that share a GPU (directly or through another) form
    one chain that starts one after another, since each vLLM sizes its KV cache from the GPU
    memory it finds free at start; separate chains start in parallel. A server without ``gpus``
    sees every GPU of its job, so on a node with GPUs (``gpu_node``; default: any visible) it
    shares with every server; on a node without, nothing is shared."""
    if gpu_node is None:
        from prour.cluster.devices import visible_gpus

        gpu_node = visible_gpus() > 0
    order = {plan.model_id: i for i, plan in enumerate(plans)}
    chains: list[tuple[set[int] | None, list[str]]] = []  # (GPUs held, None: all), model ids
    for plan in plans:
        gpus = plan_gpus(plan)
        if gpus is None and not gpu_node:
            chains.append((set(), [plan.model_id]))
            continue
        joined = [c for c in chains if gpus is None or c[0] is None or c[0] & gpus]
        held: set[int] | None = None if gpus is None else set(gpus)
        ids: list[str] = []
        for chain in joined:
            held = None if held is None or chain[0] is None else held | chain[0]
            ids += chain[1]
            chains.remove(chain)
        chains.append((held, [*sorted(ids, key=order.__getitem__), plan.model_id]))
    return sorted((ids for _, ids in chains), key=lambda ids: order[ids[0]])


class ServerGroup:
    """The servers of one ``prour serve`` run; one failure stops them all."""

    def __init__(self, plans: Sequence[ServerPlan], python: str | None, timeout_s: float,
                 models_dir: str | None = None, key_file: Path | None = None):
        self.plans = {plan.model_id: plan for plan in plans}
        self.servers: dict[str, VLLMServer | ReplicaSet] = {}
        for plan in plans:
            copies = [vllm_server(plan, python, models_dir, replica=i)
                      for i in range(len(plan.specs))]
            self.servers[plan.model_id] = copies[0] if len(copies) == 1 else ReplicaSet(copies)
        self.key_file = key_file
        if key_file is not None:  # in the environment: the endpoints file records command lines
            key = read_run_key(key_file)
            for server in self.servers.values():
                for copy in instances(server):
                    copy.env[KEY_ENV] = key
        self._lost: set[int] = set()  # copies already reported dead while others serve
        self.timeout_s = timeout_s
        self.errors: list[tuple[str, str]] = []  # (model id, message) in the order they happened
        self.pids: dict[str, int] = {}  # last known PID of each launched server (kept after stop)
        self._lock = threading.Lock()

    def record(self, status: str, error: str | None = None) -> dict[str, Any]:
        """The endpoints record for the current state."""
        servers = {}
        for model_id, server in self.servers.items():
            plan = self.plans[model_id]
            servers[model_id] = {
                "base_url": f"http://{plan.advertised_host}:{server.port}/v1",
                "model": model_id,
                "path": server.model_dir,
                "roles": list(plan.roles),
                "pid": self.pids.get(model_id),
                "alive": process_alive(self.pids.get(model_id)),
                "host": plan.host,
                "port": server.port,
                "gpus": plan.spec.gpus,
                "log": str(plan.log_path),
                "command": server.command(),
                # requests all copies run at once (the eval queue's limit; None: vLLM's own)
                "slots": _slots(plan),
            }
            if isinstance(server, ReplicaSet):
                copies = [{"base_url": f"http://{plan.advertised_host}:{copy.port}/v1",
                           "pid": copy.launched_pid, "alive": process_alive(copy.launched_pid),
                           "port": copy.port, "gpus": spec.gpus, "log": str(copy.log_path),
                           "command": copy.command()}
                          for copy, spec in zip(server.replicas, plan.specs)]
                servers[model_id]["replicas"] = copies
                servers[model_id]["alive"] = any(copy["alive"] for copy in copies)
        return {
            "status": status,
            "error": error,
            "pid": os.getpid(),
            "node": socket.gethostname(),
            "servers": servers,
            "key_file": str(self.key_file) if self.key_file else None,
            "roles": {r: entry["base_url"] for entry in servers.values() for r in entry["roles"]},
        }

    def start(self, stop: threading.Event, on_change: Callable[[], None] = lambda: None) -> None:
        """Start the servers, those sharing a GPU one after another (:func:`start_chains`) and
        the chains in parallel; raise :class:`ServeError` as soon as one fails."""
        chains = start_chains(list(self.plans.values()))
        threads = [
            threading.Thread(
                target=self._start_chain, args=(chain, stop), daemon=True, name=f"serve-{chain[0]}"
            )
            for chain in chains
        ]
        for thread in threads:
            thread.start()
        signalled: set[int] = set()
        while any(thread.is_alive() for thread in threads):
            self._note_launched(on_change)
            if self.errors or stop.is_set():
                self._signal_all(signalled)
            for thread in threads:
                thread.join(POLL_S / len(threads))
        self._note_launched(on_change)  # a server may launch and be healthy between two polls
        if self.errors:
            self.stop()
            raise ServeError(self.failure_message())
        if stop.is_set():
            self.stop()

    def _note_launched(self, on_change: Callable[[], None]) -> None:
        """Record the PID of every server launched since the last call (kept by the server even
        once it has stopped, so a quick start or a quick failure is not missed); ``on_change``
        when there is a new one."""
        launched = {m: s.launched_pid for m, s in self.servers.items() if s.launched_pid}
        if launched.items() - self.pids.items():
            self.pids.update(launched)
            on_change()

    def _start_chain(self, chain: Sequence[str], stop: threading.Event) -> None:
        """Thread body: start the servers of one chain in turn, each once the one before is
        healthy."""
        for before, model_id in zip([None, *chain], chain):
            if before is not None:
                logger.info("starting %s once %s is up (they share a GPU: vLLM sizes its KV "
                            "cache from the memory free when it starts)", model_id, before)
            self._start_one(model_id, stop)

    def _start_one(self, model_id: str, stop: threading.Event) -> None:
        """Thread body: start one server unless the group is already giving up."""
        if stop.is_set() or self.errors:
            return
        try:
            self.servers[model_id].start(timeout_s=self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - every start failure is reported to the user
            with self._lock:
                self.errors.append((model_id, str(exc)))

    def _signal_all(self, signalled: set[int]) -> None:
        """TERM every launched server once, so threads still waiting for health return quickly."""
        for server in (copy for group in self.servers.values() for copy in instances(group)):
            pid = server.pid
            if pid is None or pid in signalled:
                continue
            signalled.add(pid)
            try:
                os.killpg(pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass

    def failure_message(self) -> str:
        """The first failure in full; the servers stopped because of it by name only."""
        first_id, first = self.errors[0]
        others = [model_id for model_id, _ in self.errors[1:]]
        tail = f"\n(also stopped: {', '.join(others)})" if others else ""
        return f"server {first_id!r} could not start: {first}{tail}"

    def first_dead(self) -> str | None:
        """A message naming a server whose process has exited, or ``None`` if all run; a model
        served by several copies is dead once all are (one that dies is logged, once)."""
        for model_id, server in self.servers.items():
            for index, copy in enumerate(instances(server)):
                if isinstance(server, ReplicaSet) and not process_alive(copy.pid) \
                        and copy.launched_pid not in self._lost:
                    self._lost.add(copy.launched_pid or 0)
                    logger.warning("%s replica %d (pid %s) exited; the other copies serve on; "
                                   "last log lines of %s:\n%s", model_id, index + 1, copy.pid,
                                   copy.log_path, log_tail(copy.log_path) if copy.log_path
                                   else "")
            if not process_alive(server.pid):
                plan = self.plans[model_id]
                url = f"http://{plan.advertised_host}:{server.port}/v1"
                return (
                    f"server {model_id!r} at {url} (pid {server.pid}) exited while serving; "
                    f"last log lines of {plan.log_path}:\n{log_tail(plan.log_path)}"
                )
        return None

    def watch(self, stop: threading.Event, poll_s: float = 1.0) -> str | None:
        """Hold until ``stop`` is set or a server dies; returns why a server died (checked once more
        when ``stop`` is set), else ``None``."""
        while not stop.wait(poll_s):
            dead = self.first_dead()
            if dead:
                return dead
        return self.first_dead()  # one that died before the stop request still failed

    def stop(self) -> None:
        """Stop every server by PID (TERM, then KILL); safe to call more than once."""
        for server in self.servers.values():
            server.stop()


def _slots(plan: ServerPlan) -> int | None:
    """Requests all copies of ``plan`` run at once (None: one runs at vLLM's own limit)."""
    seqs = [spec.max_num_seqs for spec in plan.specs]
    return sum(seqs) if None not in seqs else None  # type: ignore[arg-type]


def check_memory(recipe: Recipe, plans: Sequence[ServerPlan]) -> GpuPlan:
    """The GPU memory plan of these servers (every copy, as planned) on this node;
    :class:`ServeError` with its numbers when they cannot fit."""
    plan = gpu_plan(recipe, "serve", {p.model_id: list(p.specs) for p in plans})
    try:
        plan.check()
    except GpuPlanError as exc:
        raise ServeError(str(exc)) from None
    for warning in plan.warnings:  # fits, with little to spare: said before the servers start
        logger.warning("GPU memory plan: %s", warning)
    return plan


def refuse_if_serving(path: Path) -> None:
    """Refuse to start when a live ``prour serve`` on this node already owns the endpoints file."""
    record = read_endpoints(path)
    if not record or record["status"] not in ("starting", "ready"):
        return
    pid, node = record.get("pid"), record.get("node")
    if node == socket.gethostname() and pid != os.getpid() and process_alive(pid):
        raise ServeError(
            f"{path} is owned by a running `prour serve` (pid {pid}); stop it first "
            f"(`kill {pid}`: it stops its servers) or pass another --endpoints file"
        )


def serve(
    recipe: Recipe,
    stop: threading.Event,
    roles: Sequence[str] | None = None,
    endpoints: Path | None = None,
    on_ready: Callable[[dict[str, Any]], None] = lambda r: None,
    poll_s: float = 1.0,
) -> Path:
    """Start the recipe's servers, publish the endpoints, hold until ``stop``; raise on failure."""
    path = endpoints or endpoints_path(recipe)
    refuse_if_serving(path)
    plans = plan_servers(recipe, roles)
    from prour.cluster.gpu_plan import together_sizing

    plans = sized_plans(plans, together_sizing(recipe, {p.model_id: p.spec for p in plans}).specs())
    check_memory(recipe, plans)
    from prour.llm.weights import ModelNotFound

    try:
        group = ServerGroup(plans, recipe.serve.python, recipe.serve.startup_timeout_s,
                            recipe.models_dir, ensure_run_key(recipe.resolved_run_dir()))
    except ModelNotFound as exc:
        raise ServeError(str(exc)) from None
    started = time.monotonic()
    try:
        group.start(stop, on_change=lambda: write_endpoints(path, group.record("starting")))
    except ServeError as exc:
        write_endpoints(path, group.record("failed", str(exc)))
        raise
    if stop.is_set():
        write_endpoints(path, group.record("stopped", "stopped before the servers were ready"))
        return path
    logger.info("%d server(s) ready after %.1f s", len(plans), time.monotonic() - started)
    write_endpoints(path, group.record("ready"))
    on_ready(group.record("ready"))
    dead = None
    try:
        dead = group.watch(stop, poll_s)
    finally:
        group.stop()
        write_endpoints(path, group.record("failed" if dead else "stopped", dead))
    if dead:
        raise ServeError(dead)
    return path
