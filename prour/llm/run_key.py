"""The run's API key: every server ``prour serve`` starts for a run requires it, prour's clients send it.

One key per run, made on the first ``prour serve`` and kept in ``<run_dir>/secrets/api-key``
(folder 0700, file 0600: only the run's user reads it). vLLM takes it from the ``VLLM_API_KEY``
environment variable, never from its command line, since the endpoints file records command lines;
the endpoints file names the key's file, not the key. A client that fills a role's ``base_url`` from
the endpoints file also takes its ``api_key_file`` from there; processes on other nodes (Ray workers,
Slurm jobs) read the same file through the run folder, which a cluster shares.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

KEY_FILE = Path("secrets") / "api-key"
KEY_ENV = "VLLM_API_KEY"  # the variable vLLM's OpenAI server reads its required key from


class RunKeyError(RuntimeError):
    """The run's key file cannot be made or read."""


def run_key_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / KEY_FILE


def ensure_run_key(run_dir: str | Path) -> Path:
    """The run's key file, made (readable by its owner only) when it does not exist yet."""
    path = run_key_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    if path.exists():
        read_run_key(path)  # an unreadable or empty file is an error now, not at the first request
        return path
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_urlsafe(32) + "\n")
    try:
        os.link(tmp, path)  # a key another process made meanwhile wins: the first one is kept
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return path


def read_run_key(path: str | Path) -> str:
    """The key in ``path``; a clear error when the file is missing, unreadable or empty."""
    try:
        key = Path(path).read_text().strip()
    except OSError as exc:
        raise RunKeyError(f"run key {path}: cannot be read ({exc.strerror or exc})") from None
    if not key:
        raise RunKeyError(f"run key {path} is empty; delete it and restart `prour serve`")
    return key
