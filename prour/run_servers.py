"""The vLLM servers of one ``prour run``: before each step those it calls are started and the
others stopped (:class:`StepServers`); the endpoints file lists the live ones for the steps'
child processes. Under ``serve.colocate_train: false`` the train stage's servers run on another
node (``prour serve``) and the step waits for the recipe's endpoints file to list them ready."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prour.run_summary import step_servers
from prour.stages import Step, served_elsewhere

if TYPE_CHECKING:  # pragma: no cover
    from prour.cluster.serve import ServerGroup
    from prour.config import Recipe


def runner_endpoints(recipe: Recipe) -> Path:
    """This runner's endpoints file: ``<run_dir>/endpoints/<host>-<pid>.json``."""
    return recipe.resolved_run_dir() / "endpoints" / f"{socket.gethostname()}-{os.getpid()}.json"


class StepServers:
    """The vLLM servers of one ``prour run``: before each step, those it calls are started (in
    parallel, by :class:`~prour.cluster.serve.ServerGroup`) and the others stopped; the endpoints
    file lists the live ones."""

    def __init__(self, recipe: Recipe, path: Path, say: Callable[[str], None]):
        self.recipe, self.path, self.say = recipe, path, say
        self.groups: dict[str, ServerGroup] = {}  # model id -> the group that started it
        self.stop_event = threading.Event()

    def ensure(self, step: Step) -> None:
        """Serve exactly what ``step`` calls; raises ServeError when a server cannot start."""
        from prour.cluster import serve as serving
        from prour.cluster.serve import ServeError, ServerGroup, check_memory, plan_servers
        from prour.llm.run_key import ensure_run_key
        from prour.llm.weights import ModelNotFound

        wanted = step_servers(self.recipe, step)
        elsewhere = served_elsewhere(self.recipe, step)
        resized = set() if elsewhere else serving.resized_servers(self.recipe, step, self.groups)
        for model_id in [m for m in self.groups if m not in wanted or elsewhere or m in resized]:
            self._stop(model_id)
        if elsewhere and wanted:
            self.await_elsewhere(step, wanted)
            return
        missing = [m for m in wanted if m not in self.groups]
        if not missing:
            return
        roles = sorted({role for m in missing for role in wanted[m]})
        served = step.served_recipe(self.recipe)  # eval: the exported generator's server too
        plans = [p for p in plan_servers(self.recipe, roles, step=step) if p.model_id in missing]
        check_memory(served, [*plans, *(g.plans[m] for m, g in self.groups.items())])
        try:
            group = ServerGroup(plans, self.recipe.serve.python,
                                self.recipe.serve.startup_timeout_s, self.recipe.models_dir,
                                ensure_run_key(self.recipe.resolved_run_dir()))
        except ModelNotFound as exc:
            raise ServeError(str(exc)) from None
        self.say(f"   serving for {step.name}: {', '.join(missing)} (roles {', '.join(roles)})")
        started = time.monotonic()
        try:
            group.start(self.stop_event)
        except BaseException:  # a signal or a failed start: no server of this group outlives it
            group.stop()
            raise
        if self.stop_event.is_set():
            group.stop()
            raise KeyboardInterrupt
        self.groups.update({model_id: group for model_id in missing})
        self.say(f"   ready after {time.monotonic() - started:.0f} s: "
                 + ", ".join(f"{m} at {self._url(m)}" for m in missing))
        self.publish("ready")

    def await_elsewhere(self, step: Step, wanted: dict[str, list[str]]) -> None:
        """Wait (up to ``serve.startup_timeout_s``) for the recipe's endpoints file, which a
        ``prour serve`` on another node writes, to list ``wanted``'s servers ready; ServeError
        naming the file and the fix when it does not."""
        from prour.cluster.endpoints import EndpointsError, endpoints_path, wait_for_endpoints
        from prour.cluster.serve import ServeError

        path = endpoints_path(self.recipe)
        fix = ("serve them elsewhere with `prour serve` on this recipe (Slurm: prour slurm submit "
               "--stages serve), or set serve.colocate_train: true to serve them in this job")
        self.say(f"   {step.name} calls {', '.join(wanted)}, served on another node "
                 f"(serve.colocate_train: false): waiting for {path}")
        try:
            record = wait_for_endpoints(path, self.recipe.serve.startup_timeout_s)
        except EndpointsError as exc:
            raise ServeError(f"{exc}; {fix}") from None
        servers = record.get("servers") or {}
        absent = [m for m in wanted if m not in servers]
        if absent:
            raise ServeError(f"{path} is ready but lists no server for {', '.join(absent)} "
                             f"(roles {', '.join(r for m in absent for r in wanted[m])}); {fix}")
        self.say(f"   using the servers of `prour serve` on {record.get('node')}: "
                 + ", ".join(f"{m} at {servers[m]['base_url']}" for m in wanted))

    def _url(self, model_id: str) -> str:
        return self.groups[model_id].record("ready")["servers"][model_id]["base_url"]

    def _stop(self, model_id: str) -> None:
        group = self.groups.pop(model_id)
        pid = group.servers[model_id].pid
        group.servers[model_id].stop()
        self.say(f"   stopped server {model_id} (pid {pid}): the next step does not call it")
        self.publish("ready" if self.groups else "stopped")

    def publish(self, status: str, error: str | None = None) -> None:
        """Write the endpoints file for the live servers (what children read)."""
        from prour.cluster.endpoints import write_endpoints
        from prour.llm.run_key import run_key_path

        servers: dict[str, Any] = {}
        for model_id, group in self.groups.items():
            servers[model_id] = group.record(status)["servers"][model_id]
        roles = {role: entry["base_url"] for entry in servers.values() for role in entry["roles"]}
        key_file = run_key_path(self.recipe.resolved_run_dir())
        write_endpoints(self.path, {"status": status, "error": error, "pid": os.getpid(),
                                    "node": socket.gethostname(), "servers": servers,
                                    "key_file": str(key_file) if key_file.exists() else None,
                                    "roles": roles})

    def dead(self) -> str | None:
        """Why a live server exited, or None."""
        from prour.cluster.serve import process_alive
        from prour.cluster.vllm_server import log_tail

        for model_id, group in self.groups.items():
            server = group.servers[model_id]
            if not process_alive(server.pid):
                log = group.plans[model_id].log_path
                return (f"server {model_id!r} at {self._url(model_id)} (pid {server.pid}) "
                        f"exited while serving; last log lines of {log}:\n{log_tail(log)}")
        return None

    def stop_all(self, error: str | None = None) -> None:
        if not self.groups:
            return
        for group in {id(g): g for g in self.groups.values()}.values():
            group.stop()
        names = ", ".join(self.groups)
        self.groups.clear()
        self.publish("failed" if error else "stopped", error)
        self.say(f"   stopped server(s) {names}")
