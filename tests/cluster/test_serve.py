"""`prour serve` orchestration with a stand-in vLLM: planning, fail-fast start, endpoints, stop.

The stand-in answers /health like vLLM, so these run in seconds; the real vLLM CPU server is
exercised in test_serve_vllm.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from cluster_helpers import alive, write_recipe

from prour.cluster.endpoints import read_endpoints, write_endpoints
from prour.cluster.serve import ServeError, plan_servers, serve
from prour.config import ConfigError
from prour.recipes import load_recipe


def frozen_recipe(tmp_path: Path, python: Path, models: dict, roles: dict | None = None) -> Path:
    """A recipe whose openai roles are served by ``models`` (model id -> serve spec)."""
    roles = roles or {"decomposer": "big", "user": "big", "verifier": "big"}
    data = {
        "name": "frozen",
        "run_dir": str(tmp_path / "run"),
        "models": {role: {"backend": "openai", "model": mid} for role, mid in roles.items()},
        "serve": {"python": str(python), "startup_timeout_s": 30, "models": models},
    }
    return write_recipe(tmp_path / "recipe.yaml", data)


def model_dir(tmp_path: Path, name: str, broken: bool = False) -> str:
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text("{}")  # what makes it a model folder (prour.llm.weights)
    (folder / "model.safetensors").write_bytes(b"")  # and a weight file, as preflight asks
    if broken:
        (folder / "BROKEN").write_text("")
    return str(folder)


def run_in_thread(loaded, stop: threading.Event, **kwargs) -> tuple[threading.Thread, dict]:
    """Run serve() in a thread; the outcome (path or error) lands in the returned dict."""
    outcome: dict = {}

    def body() -> None:
        try:
            outcome["path"] = serve(loaded, stop, poll_s=0.1, **kwargs)
        except ServeError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, outcome


def wait_status(path: Path, status: str, timeout_s: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        record = read_endpoints(path)
        if record and record["status"] == status:
            return record
        time.sleep(0.05)
    raise AssertionError(f"{path} never reached status {status!r} (last: {read_endpoints(path)})")


def test_roles_sharing_a_model_share_one_server(tmp_path: Path, fake_vllm_python: Path) -> None:
    models = {
        "big": {"path": model_dir(tmp_path, "big")},
        "judge-m": {"path": model_dir(tmp_path, "j")},
    }
    roles = {"decomposer": "big", "user": "big", "judge": "judge-m"}
    loaded = load_recipe(frozen_recipe(tmp_path, fake_vllm_python, models, roles), cluster=True)
    plans = plan_servers(loaded)
    assert [(p.model_id, p.roles) for p in plans] == [
        ("big", ("decomposer", "user")),
        ("judge-m", ("judge",)),
    ]
    assert [p.model_id for p in plan_servers(loaded, ["judge"])] == ["judge-m"]
    assert plans[0].host == "127.0.0.1"
    assert plans[0].log_path == tmp_path / "run" / "serve" / "big.log"
    with pytest.raises(ServeError, match="unknown role 'jugde'"):
        plan_servers(loaded, ["jugde"])
    with pytest.raises(ServeError, match="role 'agent' is not in the recipe"):
        plan_servers(loaded, ["agent"])


def test_a_server_entry_no_role_uses_is_not_started(tmp_path: Path, fake_vllm_python: Path) -> None:
    """An extending recipe that changes the models keeps its base's serve.models entries (merged
    key by key); those no role names start nothing and take no GPU in any plan."""
    models = {"big": {"path": model_dir(tmp_path, "big")},
              "inherited": {"path": model_dir(tmp_path, "old"), "gpus": [0]}}
    loaded = load_recipe(frozen_recipe(tmp_path, fake_vllm_python, models), cluster=True)
    assert [(p.model_id, p.roles) for p in plan_servers(loaded)] == [
        ("big", ("decomposer", "user", "verifier"))]
    smoke = load_recipe(Path(__file__).parents[2] / "recipes" / "gpu-smoke.yaml", cluster=True)
    assert set(smoke.serve.models) == {"Qwen/Qwen3-8B", "Qwen/Qwen3-32B", "Qwen/Qwen3-0.6B",
                                       "exported-generator",  # eval's: the eval step serves it
                                       "Qwen/Qwen3-1.7B", "THUDM/GLM-4-32B-0414"}  # the study's
    assert [p.model_id for p in plan_servers(smoke)] == ["Qwen/Qwen3-0.6B"]


@pytest.mark.parametrize(
    ("serve_models", "key", "fragment"),
    [
        (
            {"big": {"port": 8000}, "small": {"port": 8000}},
            "serve.models.small.port",
            "already used",
        ),
        (
            {"big": {"gpus": [0], "tensor_parallel_size": 2}},
            "serve.models.big.gpus",
            "tensor_parallel_size=2",
        ),
    ],
)
def test_placement_errors_name_the_key(
    tmp_path: Path, serve_models: dict, key: str, fragment: str
) -> None:
    path = frozen_recipe(tmp_path, Path(sys.executable), serve_models)
    with pytest.raises(ConfigError) as info:
        load_recipe(path, cluster=True)
    assert info.value.key == key
    assert fragment in str(info.value)


def test_servers_of_one_step_must_split_a_gpu_those_of_two_need_not(tmp_path: Path) -> None:
    """collect-retail calls the agent and the user, so their servers run together: 0.9 + 0.9 on
    GPU 1 is refused by the collect plan, naming the key. The normalizer's server (normalize)
    and the annotator's (annotate) are never up at once: 0.9 each on GPU 0 fits every plan."""
    from prour.cluster.gpu_plan import GpuPlanError, check_stage

    together = {"big": {"gpus": [0, 1]}, "small": {"gpus": [1]}}
    roles = {"agent": "big", "user": "small", "decomposer": "big"}
    loaded = load_recipe(frozen_recipe(tmp_path, Path(sys.executable), together, roles),
                         cluster=True)
    with pytest.raises(GpuPlanError) as info:
        check_stage(loaded, "collect")
    assert ("serve.models.small.gpu_memory_utilization: GPU 1 is shared by big (0.9), small "
            "(0.9) while step collect-retail runs: shares add up to 1.8 > 1.0") in str(info.value)
    apart = {"big": {"gpus": [0]}, "small": {"gpus": [0]}}
    roles = {"normalizer": "big", "annotator": "small"}
    loaded = load_recipe(frozen_recipe(tmp_path, Path(sys.executable), apart, roles),
                         cluster=True)
    for stage in ("normalize", "calibrate"):
        assert check_stage(loaded, stage).total(0) == pytest.approx(0.9 * 80 + 0.5)


def test_shared_gpu_is_fine_when_shares_fit(tmp_path: Path) -> None:
    serve_models = {
        "big": {"gpus": [0], "gpu_memory_utilization": 0.5},
        "small": {"gpus": [0], "gpu_memory_utilization": 0.4},
    }
    loaded = load_recipe(frozen_recipe(tmp_path, Path(sys.executable), serve_models), cluster=True)
    assert set(loaded.serve.models) == {"big", "small"}


def test_unserved_openai_role_is_refused(tmp_path: Path) -> None:
    path = frozen_recipe(tmp_path, Path(sys.executable), {"bigg": {}})
    with pytest.raises(ConfigError) as info:
        load_recipe(path, cluster=True)
    assert info.value.key == "models.decomposer.model"
    assert "Did you mean 'bigg'" in str(info.value)


def test_serve_publishes_endpoints_and_stops_by_pid(tmp_path: Path, fake_vllm_python: Path) -> None:
    models = {
        "big": {"path": model_dir(tmp_path, "big"), "gpus": [3, 1], "tensor_parallel_size": 2},
        "judge-m": {"path": model_dir(tmp_path, "j")},
    }
    roles = {"decomposer": "big", "user": "big", "judge": "judge-m"}
    loaded = load_recipe(frozen_recipe(tmp_path, fake_vllm_python, models, roles), cluster=True)
    stop = threading.Event()
    thread, outcome = run_in_thread(loaded, stop)
    endpoints = tmp_path / "run" / "endpoints.json"
    record = wait_status(endpoints, "ready")
    pids = [server["pid"] for server in record["servers"].values()]
    for server in record["servers"].values():
        url = server["base_url"].removesuffix("/v1") + "/health"
        assert httpx.get(url, timeout=5).status_code == 200
    assert record["servers"]["big"]["roles"] == ["decomposer", "user"]
    assert record["roles"] == {
        "decomposer": record["servers"]["big"]["base_url"],
        "user": record["servers"]["big"]["base_url"],
        "judge": record["servers"]["judge-m"]["base_url"],
    }
    log = Path(record["servers"]["big"]["log"]).read_text()
    assert "CUDA_VISIBLE_DEVICES= 3,1" in log and "--tensor-parallel-size 2" in log
    stop.set()
    thread.join(30)
    assert not thread.is_alive() and "error" not in outcome
    assert not any(alive(pid) for pid in pids)
    assert read_endpoints(endpoints)["status"] == "stopped"


def test_failed_start_stops_the_others_quickly(
    tmp_path: Path, fake_vllm_python: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_DELAY", "120")  # the healthy server would take two minutes
    models = {
        "big": {"path": model_dir(tmp_path, "big")},
        "judge-m": {"path": model_dir(tmp_path, "j", broken=True)},
    }
    roles = {"user": "big", "judge": "judge-m"}
    loaded = load_recipe(frozen_recipe(tmp_path, fake_vllm_python, models, roles), cluster=True)
    started = time.monotonic()
    thread, outcome = run_in_thread(loaded, threading.Event())
    thread.join(60)
    elapsed = time.monotonic() - started
    assert elapsed < 20, f"a failed start took {elapsed:.1f} s to report"
    error = str(outcome["error"])
    assert "server 'judge-m' could not start" in error and "no model weights" in error
    record = read_endpoints(tmp_path / "run" / "endpoints.json")
    assert record["status"] == "failed" and "judge-m" in record["error"]
    big_pid = record["servers"]["big"]["pid"]
    assert big_pid is not None and not alive(big_pid)


def test_endpoints_fill_openai_base_urls(tmp_path: Path, fake_vllm_python: Path) -> None:
    recipe_path = frozen_recipe(
        tmp_path, fake_vllm_python, {"big": {"path": model_dir(tmp_path, "big")}}
    )
    base = {
        k: v
        for k, v in __import__("yaml").safe_load(recipe_path.read_text()).items()
        if k != "serve"
    }
    plain = write_recipe(tmp_path / "plain.yaml", base)
    assert load_recipe(plain, endpoints=True).models["user"].base_url is None  # nothing published yet
    loaded = load_recipe(recipe_path, cluster=True)
    stop = threading.Event()
    thread, _ = run_in_thread(loaded, stop)
    record = wait_status(tmp_path / "run" / "endpoints.json", "ready")
    resolved = load_recipe(plain, endpoints=True)
    assert {r: m.base_url for r, m in resolved.models.items()} == {
        r: record["servers"]["big"]["base_url"] for r in ("decomposer", "user", "verifier")
    }
    stop.set()
    thread.join(30)
    assert load_recipe(plain, endpoints=True).models["user"].base_url is None  # stopped servers are not used
    from prour.llm.registry import build_llm

    with pytest.raises(ValueError, match="prour serve"):
        build_llm(load_recipe(plain, endpoints=True).models["user"])


def test_a_server_that_died_before_the_stop_request_fails_the_serve(
    tmp_path: Path, fake_vllm_python: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop request (serve_stop's SIGTERM after a failed eval) that comes before the next health
    poll still reports the server that died: the serve stage fails with its cause. The start loop
    polls rarely here, so the server launches and gets healthy between two of its polls (what a
    loaded machine does now and then): the ready record still names its PID."""
    monkeypatch.setattr("prour.cluster.serve.POLL_S", 60.0)  # the start thread's end wakes it
    loaded = load_recipe(
        frozen_recipe(tmp_path, fake_vllm_python, {"big": {"path": model_dir(tmp_path, "big")}}), cluster=True
    )
    stop, outcome = threading.Event(), {}

    def body() -> None:
        try:
            serve(loaded, stop, poll_s=600)  # no poll would see the death before the stop
        except ServeError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    endpoints = tmp_path / "run" / "endpoints.json"
    pid = wait_status(endpoints, "ready")["servers"]["big"]["pid"]
    assert isinstance(pid, int), pid  # the ready record names the server it started
    os.killpg(pid, signal.SIGKILL)
    assert not alive(pid)
    stop.set()
    thread.join(30)
    assert not thread.is_alive()
    assert f"(pid {pid}) exited while serving" in str(outcome.get("error")), outcome
    assert read_endpoints(endpoints)["status"] == "failed"


def test_cli_serve_holds_until_sigterm(tmp_path: Path, fake_vllm_python: Path) -> None:
    recipe_path = frozen_recipe(
        tmp_path, fake_vllm_python, {"big": {"path": model_dir(tmp_path, "big")}}
    )
    endpoints = tmp_path / "eps.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prour.cli.main",
            "serve",
            "--recipe",
            str(recipe_path),
            "--endpoints",
            str(endpoints),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    try:
        record = wait_status(endpoints, "ready", timeout_s=60)
        time.sleep(0.5)
        assert proc.poll() is None  # still in the foreground
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "big: http://127.0.0.1:" in out
    assert "GPUs inherited  roles: decomposer, user, verifier" in out
    assert not alive(record["servers"]["big"]["pid"])
    assert json.loads(endpoints.read_text())["status"] == "stopped"


def serve_cli(recipe_path: Path) -> subprocess.CompletedProcess[str]:
    """`prour serve --recipe PATH` in a subprocess, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "prour.cli.main", "serve", "--recipe", str(recipe_path)],
        capture_output=True, text=True, timeout=120, check=False,
    )


def test_cli_reports_a_start_failure(tmp_path: Path, fake_vllm_python: Path) -> None:
    recipe_path = frozen_recipe(
        tmp_path, fake_vllm_python, {"big": {"path": model_dir(tmp_path, "big", broken=True)}}
    )
    done = serve_cli(recipe_path)
    assert done.returncode == 1
    assert "server 'big' could not start" in done.stderr and "exited with code 3" in done.stderr


def test_a_second_serve_on_the_same_endpoints_is_refused(
    tmp_path: Path, fake_vllm_python: Path
) -> None:
    recipe_path = frozen_recipe(
        tmp_path, fake_vllm_python, {"big": {"path": model_dir(tmp_path, "big")}}
    )
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        endpoints = tmp_path / "run" / "endpoints.json"
        write_endpoints(
            endpoints,
            {"status": "ready", "pid": owner.pid, "node": socket.gethostname(), "servers": {}},
        )
        with pytest.raises(
            ServeError, match=f"owned by a running `prour serve` \\(pid {owner.pid}\\)"
        ):
            serve(load_recipe(recipe_path, cluster=True), threading.Event())
    finally:
        owner.kill()
        owner.wait()
    stopped = threading.Event()
    stopped.set()  # the owner is gone: a new serve may take the file over (and stops at once here)
    path = serve(load_recipe(recipe_path, cluster=True), stopped)
    assert read_endpoints(path)["status"] == "stopped"


def test_server_flags_merge_what_the_sharing_roles_need(tmp_path: Path) -> None:
    """A server with a tool-calling role gets tool choice and its parser; every server gets the
    reasoning parser and prefix caching unless its spec says otherwise."""
    from prour.cluster.serve import server_flags
    from prour.config.cluster import ServedModel

    spec = ServedModel()
    assert server_flags(spec, ["decomposer", "agent"]) == [
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--reasoning-parser",
        "qwen3",
        "--enable-prefix-caching",
    ]
    assert server_flags(spec, ["teacher"]) == [
        "--reasoning-parser",
        "qwen3",
        "--enable-prefix-caching",
    ]
    plain = ServedModel(reasoning_parser=None, enable_prefix_caching=False)
    assert server_flags(plain, ["judge"]) == ["--no-enable-prefix-caching"]
    with pytest.raises(ServeError, match="roles agent, verifier send tool-calling requests"):
        server_flags(ServedModel(tool_call_parser=None), ["verifier", "agent"])


def test_cpu_build_never_chunks_a_prefill() -> None:
    """vLLM's CPU build kills its engine on a seeded request whose prefill is chunked; the CPU
    command line keeps every prefill whole, unless the recipe's extra_args decide."""
    from prour.cluster.vllm_server import unchunked_prefill_args

    assert unchunked_prefill_args(4096, []) == [
        "--no-enable-chunked-prefill",
        "--max-num-batched-tokens",
        "4096",
    ]
    assert unchunked_prefill_args(512, [])[-1] == "2048"  # never below vLLM's CPU default
    assert unchunked_prefill_args(4096, ["--max-num-batched-tokens", "8192"]) == [
        "--no-enable-chunked-prefill"
    ]
    assert unchunked_prefill_args(4096, ["--enable-chunked-prefill"]) == []


def test_without_serve_models_each_model_id_of_the_openai_roles_gets_a_server(
    tmp_path: Path,
) -> None:
    """No serve.models: one default server per distinct model id; roles sharing it share it; a
    role with a fixed base_url or another backend is not served."""
    data = {
        "name": "derived",
        "run_dir": str(tmp_path / "run"),
        "models": {
            "agent": {"backend": "openai", "model": "Qwen/Qwen3-8B"},
            "verifier": {"backend": "openai", "model": "Qwen/Qwen3-8B"},
            "teacher": {"backend": "openai", "model": "Qwen/Qwen3-32B"},
            "judge": {"backend": "openai", "model": "ext", "base_url": "http://judge:9/v1"},
            "generator": {"backend": "hf", "path": "Qwen/Qwen3-1.7B"},
        },
    }
    loaded = load_recipe(write_recipe(tmp_path / "r.yaml", data), cluster=True)
    plans = plan_servers(loaded)
    assert [(p.model_id, p.roles) for p in plans] == [
        ("Qwen/Qwen3-8B", ("agent", "verifier")),
        ("Qwen/Qwen3-32B", ("teacher",)),
    ]
    assert plans[0].log_path == tmp_path / "run" / "serve" / "Qwen_Qwen3-8B.log"


def test_a_recipe_that_serves_nothing_is_refused_and_publishes_nothing(tmp_path: Path) -> None:
    data = {
        "name": "nothing",
        "run_dir": str(tmp_path / "run"),
        "models": {
            "generator": {"backend": "hf", "path": "Qwen/Qwen3-1.7B"},
            "verifier": {"backend": "openai", "model": "m", "base_url": "http://127.0.0.1:8000/v1"},
        },
    }
    path = write_recipe(tmp_path / "r.yaml", data)
    done = serve_cli(path)
    assert done.returncode == 1
    assert done.stderr.startswith("error: nothing to serve: no openai role of recipe 'nothing'")
    assert "models.verifier: base_url http://127.0.0.1:8000/v1" in done.stderr
    assert not (tmp_path / "run" / "endpoints.json").exists()


@pytest.mark.parametrize(
    ("serve_section", "advertised"),
    [
        ({"host": "0.0.0.0"}, "this node"),
        ({"host": "0.0.0.0", "advertise_host": "node7.ib"}, "node7.ib"),
        ({}, "127.0.0.1"),
    ],
)
def test_endpoints_name_a_host_other_nodes_can_reach(
    tmp_path: Path, fake_vllm_python: Path, serve_section: dict, advertised: str
) -> None:
    models = {"big": {"path": model_dir(tmp_path, "big"), "port": free_tcp_port()}}
    path = frozen_recipe(tmp_path, fake_vllm_python, models)
    loaded = load_recipe(path, [f"serve.{k}={v}" for k, v in serve_section.items()], cluster=True)
    (plan,) = plan_servers(loaded)
    assert plan.host == serve_section.get("host", "127.0.0.1")
    advertised = this_node() if advertised == "this node" else advertised
    assert plan.advertised_host == advertised
    from prour.cluster.serve import ServerGroup

    record = ServerGroup([plan], str(fake_vllm_python), 5).record("starting")
    assert record["servers"]["big"]["base_url"] == f"http://{advertised}:{models['big']['port']}/v1"
    assert "--host" in record["servers"]["big"]["command"]


def this_node() -> str:
    """What other nodes can reach here, as `ip` lists this node's addresses: the hostname when it
    resolves to one that is not loopback, else the first such address."""
    listed = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True,
                            check=True).stdout
    own = [line.split()[3].split("/")[0] for line in listed.splitlines()]
    own = [addr for addr in own if not addr.startswith("127.")]
    name = socket.gethostname()
    return name if not own or socket.gethostbyname(name) in own else own[0]


def free_tcp_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_slurm_submit_refuses_a_serve_stage_that_would_serve_nothing(tmp_path: Path) -> None:
    """The serve job would fail at once (nothing to serve): `prour slurm submit` refuses it
    before submitting anything, naming why."""
    data = {"name": "inproc", "models": {"generator": {"backend": "hf", "path": "gen"}}}
    path = write_recipe(tmp_path / "r.yaml", data)
    done = subprocess.run(
        [sys.executable, "-m", "prour.cli.main", "slurm", "submit", "--recipe", str(path),
         "--stages", "serve", "--dry-run", "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--stages serve: nothing to serve" in done.stderr
    assert "models.generator: hf" in done.stderr and "leave serve out of --stages" in done.stderr


def test_preflight_of_serve_roles_checks_only_the_servers_it_starts() -> None:
    """`prour serve --roles strict_user,verifier` (the paper's training-time serving) needs the
    8B's weights only: the 32B that serves other roles is not named."""
    from typer.testing import CliRunner

    from prour.cli.main import app

    paper = Path(__file__).resolve().parents[2] / "recipes" / "paper.yaml"
    result = CliRunner().invoke(
        app, ["serve", "--recipe", str(paper), "--roles", "strict_user,verifier", "--dry-run"]
    )
    weights = [line for line in result.output.splitlines() if line.startswith("error: weights:")]
    assert result.exit_code == 2, result.output
    assert len(weights) == 1 and "'Qwen/Qwen3-8B'" in weights[0], result.output
    full = CliRunner().invoke(app, ["serve", "--recipe", str(paper), "--dry-run"])
    assert sum(line.startswith("error: weights:") for line in full.output.splitlines()) == 2


def _started_at(log: Path) -> float:
    """When the stand-in server began (its log's "started at <epoch seconds>" line)."""
    line = next(line for line in log.read_text().splitlines() if line.startswith("started at "))
    return float(line.split()[-1])


def test_servers_sharing_a_gpu_start_one_after_another(
    tmp_path: Path, fake_vllm_python: Path
) -> None:
    """a and b share GPU 0: b starts only once a answers /health (after its 1.5 s start-up);
    c, alone on GPU 1, starts beside a."""
    delay = {"FAKE_DELAY": "1.5"}
    models = {
        "a": {"path": model_dir(tmp_path, "a"), "gpus": [0], "gpu_memory_utilization": 0.4,
              "env": delay},
        "b": {"path": model_dir(tmp_path, "b"), "gpus": [0], "gpu_memory_utilization": 0.4,
              "env": delay},
        "c": {"path": model_dir(tmp_path, "c"), "gpus": [1], "env": delay},
    }
    roles = {"user": "a", "judge": "b", "verifier": "c"}
    loaded = load_recipe(frozen_recipe(tmp_path, fake_vllm_python, models, roles), cluster=True)
    stop = threading.Event()
    thread, outcome = run_in_thread(loaded, stop)
    record = wait_status(tmp_path / "run" / "endpoints.json", "ready")
    stop.set()
    thread.join(30)
    assert "error" not in outcome
    start = {m: _started_at(Path(server["log"])) for m, server in record["servers"].items()}
    assert start["b"] - start["a"] >= 1.5
    assert abs(start["c"] - start["a"]) < 1.0


def test_start_chains_join_servers_through_shared_gpus() -> None:
    """GPU sets {0}, {1}, {1, 2}, {3}: the 2nd and 3rd share GPU 1; a server without ``gpus``
    shares every GPU of a GPU node and none on a node without GPUs."""
    from prour.cluster.serve import ServerPlan, start_chains
    from prour.config.cluster import ServedModel

    def plan(name: str, gpus: list[int] | None) -> ServerPlan:
        return ServerPlan(name, ServedModel(gpus=gpus), (), "127.0.0.1", Path(f"{name}.log"))

    plans = [plan("p", [0]), plan("q", [1]), plan("r", [1, 2]), plan("s", [3])]
    assert start_chains(plans, gpu_node=True) == [["p"], ["q", "r"], ["s"]]
    assert start_chains([*plans, plan("t", None)], gpu_node=True) == [["p", "q", "r", "s", "t"]]
    assert start_chains([plan("t", None), *plans, plan("u", None)], gpu_node=False) == [
        ["t"], ["p"], ["q", "r"], ["s"], ["u"]]
    assert start_chains([plan("x", [0]), plan("y", [1]), plan("z", [0, 1])], gpu_node=True) == [
        ["x", "y", "z"]]


def test_a_starting_endpoints_file_says_wait_with_a_command_that_waits(
    tmp_path: Path, fake_vllm_python: Path
) -> None:
    """While `prour serve` is still loading (the stand-in takes 3 s), a stage's preflight says
    to wait, not to start another serve; the `prour endpoints --wait` command it prints, run as
    printed, returns once the servers are ready."""
    import shlex

    from typer.testing import CliRunner

    from prour.cli.main import app
    from prour.preflight import check_endpoints

    models = {"big": {"path": model_dir(tmp_path, "big"), "env": {"FAKE_DELAY": "3"}}}
    path = frozen_recipe(tmp_path, fake_vllm_python, models, {"normalizer": "big"})
    stop = threading.Event()
    thread, outcome = run_in_thread(load_recipe(path, cluster=True), stop)
    try:
        wait_status(tmp_path / "run" / "endpoints.json", "starting")
        problems = check_endpoints(load_recipe(path, ["seed=1"], endpoints=True), ["normalizer"])
        assert len(problems) == 1
        line = problems[0].line()
        assert "says starting" in line and "prour serve" not in line, line
        command = shlex.split(line.split("wait for them with `")[1].split("`")[0])
        assert command == ["prour", "endpoints", "--wait", "30", "--recipe", str(path),
                           "--set", "seed=1"]
        result = CliRunner().invoke(app, command[1:])
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["status"] == "ready"
    finally:
        stop.set()
        thread.join(30)
    assert "error" not in outcome
