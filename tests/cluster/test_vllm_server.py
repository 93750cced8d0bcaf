"""The vLLM server harness: start-up failures, time limits and stopping by PID.

A stand-in "python" (a small script given as ``python=``) plays the server so that these run in
seconds without vLLM; one test starts real vLLM on a folder that holds no model.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx
import pytest

from prour.cluster.vllm_server import VLLMServer

FAKE_SERVER = """#!{python}
import json, os, signal, subprocess, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer

mode = os.environ["FAKE_MODE"]
record = {{"argv": sys.argv[1:], "env": {{k: os.environ.get(k) for k in
          ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CACHE_ROOT", "HF_HUB_OFFLINE", "FAKE_MODE")}}}}
with open(os.environ["FAKE_RECORD"], "w") as fh:
    json.dump(record, fh)
print("fake server starting", flush=True)
if mode == "exit":
    print("fatal: no config.json in the model folder", flush=True)
    sys.exit(3)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(os.environ["FAKE_RECORD"] + ".child", "w") as fh:
    fh.write(str(child.pid))
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if mode == "slow":
    time.sleep(600)

class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass

port = int(sys.argv[sys.argv.index("--port") + 1])
HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def alive(pid: int, settle_s: float = 5.0) -> bool:
    """Whether ``pid`` runs; a zombie (killed, not yet reaped by init) counts as gone."""
    deadline = time.monotonic() + settle_s
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return False
        if state == "Z":
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.05)


@pytest.fixture
def fake_python(tmp_path: Path) -> Path:
    script = tmp_path / "fake-python"
    script.write_text(FAKE_SERVER.format(python=sys.executable))
    script.chmod(0o755)
    return script


def fake_server(
    fake_python: Path, tmp_path: Path, mode: str, model_dir: Path | None = None
) -> VLLMServer:
    model_dir = model_dir or tmp_path
    env = {"FAKE_MODE": mode, "FAKE_RECORD": str(tmp_path / "record.json")}
    return VLLMServer(
        model_dir,
        python=fake_python,
        served_name="tiny",
        env=env,
        extra_args=("--seed", "5"),
        log_path=tmp_path / "logs" / "server.log",
    )


def test_exit_before_ready_raises_with_log_tail(fake_python: Path, tmp_path: Path) -> None:
    server = fake_server(fake_python, tmp_path, "exit")
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"exited with code 3") as info:
        server.start(timeout_s=60)
    assert time.monotonic() - start < 20
    assert "fatal: no config.json in the model folder" in str(info.value)
    assert server.pid is None


def test_not_ready_in_time_raises_and_kills_the_group(fake_python: Path, tmp_path: Path) -> None:
    server = fake_server(fake_python, tmp_path, "slow")
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"not ready within 3 s") as info:
        server.start(timeout_s=3)
    assert time.monotonic() - start < 25
    assert "fake server starting" in str(info.value)
    child = int((tmp_path / "record.json.child").read_text())
    assert not alive(child)


def test_start_passes_command_and_env_then_stop_by_pid(fake_python: Path, tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    with fake_server(fake_python, tmp_path, "serve", model_dir) as server:
        pid = server.pid
        assert (
            httpx.get(server.base_url.removesuffix("/v1") + "/health", timeout=5).status_code == 200
        )
        record = json.loads((tmp_path / "record.json").read_text())
        child = int((tmp_path / "record.json.child").read_text())
        assert alive(pid, settle_s=0) and alive(child, settle_s=0)
    argv = record["argv"]
    assert argv[:2] == ["-m", "vllm.entrypoints.openai.api_server"]
    pairs = dict(zip(argv[2::2], argv[3::2]))
    assert pairs["--model"] == str(model_dir) and pairs["--served-model-name"] == "tiny"
    assert pairs["--host"] == "127.0.0.1" and pairs["--port"] == str(server.port)
    assert pairs["--dtype"] == "float32" and pairs["--max-model-len"] == "2048"
    assert "--enforce-eager" in argv and argv[-2:] == ["--seed", "5"]
    env = record["env"]
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_CACHE_ROOT"] and not Path(env["VLLM_CACHE_ROOT"]).exists()  # removed at stop
    assert server.pid is None and not alive(pid) and not alive(child)
    assert "fake server starting" in (tmp_path / "logs" / "server.log").read_text()


def test_stop_kills_a_server_that_ignores_sigterm(fake_python: Path, tmp_path: Path) -> None:
    server = fake_server(fake_python, tmp_path, "stubborn").start(timeout_s=30)
    pid = server.pid
    start = time.monotonic()
    server.stop(grace_s=0.5)
    assert time.monotonic() - start < 10
    assert not alive(pid) and not alive(int((tmp_path / "record.json.child").read_text()))
    server.stop()  # idempotent


def test_missing_local_model_dir_fails_before_launch(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"does not exist"):
        VLLMServer(tmp_path / "missing", python=sys.executable).start(timeout_s=5)


@pytest.mark.vllm
def test_real_vllm_on_a_folder_without_a_model_fails_clearly(
    vllm_python: Path, tmp_path: Path
) -> None:
    (tmp_path / "not-a-model").mkdir()
    server = VLLMServer(tmp_path / "not-a-model", python=vllm_python)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"exited with code \d+ before it was ready") as info:
        server.start(timeout_s=300)
    assert time.monotonic() - start < 300
    assert "not-a-model" in str(info.value).split("last log lines")[1]  # vLLM's own complaint
    server.log_path.unlink()  # kept after the failed start; the test removes it


def test_temporary_log_kept_only_after_a_failed_start(fake_python: Path, tmp_path: Path) -> None:
    env = {"FAKE_MODE": "serve", "FAKE_RECORD": str(tmp_path / "record.json")}
    with VLLMServer(tmp_path, python=fake_python, env=env) as server:
        log = server.log_path
        assert log is not None and "fake server starting" in log.read_text()
    assert not log.exists() and server.log_path is None
    failing = VLLMServer(tmp_path, python=fake_python, env={**env, "FAKE_MODE": "exit"})
    with pytest.raises(RuntimeError) as info:
        failing.start(timeout_s=30)
    assert failing.log_path is not None and str(failing.log_path) in str(info.value)
    assert "no config.json" in failing.log_path.read_text()
    failing.log_path.unlink()
