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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def plan_servers(recipe: Recipe, roles: Sequence[str] | None = None) -> list[ServerPlan]:
    """The servers the recipe asks for, restricted to those used by ``roles`` when given; a recipe
    that serves nothing is refused."""
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
    return [
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
                strict: bool = True) -> VLLMServer:
    """The :class:`VLLMServer` for one plan (port fixed now so the URL is known before start);
    its weights are local (:func:`prour.llm.weights.local_weights`), never downloaded. Without
    ``strict`` (a dry run) a model with no local weights keeps its id; preflight names it."""
    from prour.llm.weights import ModelNotFound, local_weights

    spec = plan.spec
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
        port=spec.port or free_port(probe_host),
        host=plan.host,
        served_name=plan.model_id,
        max_model_len=spec.max_model_len,
        dtype=spec.dtype,
        extra_args=[*extra, *spec.extra_args],
        env=env,
        log_path=plan.log_path,
        enforce_eager=spec.enforce_eager,
    )


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
        gpus = None if plan.spec.gpus is None else set(plan.spec.gpus)
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
        self.servers = {plan.model_id: vllm_server(plan, python, models_dir) for plan in plans}
        self.key_file = key_file
        if key_file is not None:  # in the environment: the endpoints file records command lines
            key = read_run_key(key_file)
            for server in self.servers.values():
                server.env[KEY_ENV] = key
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
            }
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
        for server in self.servers.values():
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
        """A message naming a server whose process has exited, or ``None`` if all run."""
        for model_id, server in self.servers.items():
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


def check_memory(recipe: Recipe, plans: Sequence[ServerPlan]) -> GpuPlan:
    """The GPU memory plan of these servers on this node; :class:`ServeError` with its numbers
    when they cannot fit."""
    plan = gpu_plan(recipe, "serve", {p.model_id: p.spec for p in plans})
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
