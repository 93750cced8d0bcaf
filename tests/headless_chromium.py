"""Headless Chromium for the browser tests: Debian's ``chromium`` package, installed by the test
setup with apt-get when missing (as root, like the local Slurm of ``prour.cluster.local``)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

PACKAGE = "chromium"  # Debian's package; its program is /usr/bin/chromium
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", "--disable-extensions")  # --no-sandbox: the tests run as root


class ChromiumUnavailable(RuntimeError):
    """Chromium is missing and cannot be installed here."""


def ensure_chromium(timeout_s: float = 900.0) -> str:
    """The chromium program, apt-get installed first when missing (root only)."""
    found = shutil.which(PACKAGE)
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise ChromiumUnavailable("chromium is missing and this is not root with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", PACKAGE]
    done = subprocess.run(install, check=False, env=env, capture_output=True, text=True,
                          timeout=timeout_s)
    if done.returncode != 0:  # a stale package index is the usual cause: refresh it once
        subprocess.run(["apt-get", "update", "-qq"], check=False, env=env, capture_output=True,
                       timeout=timeout_s)
        done = subprocess.run(install, check=False, env=env, capture_output=True, text=True,
                              timeout=timeout_s)
    found = shutil.which(PACKAGE)
    if done.returncode != 0 or not found:
        raise ChromiumUnavailable(f"apt-get install {PACKAGE} failed:\n{done.stderr[-2000:]}")
    return found


def headless(program: str, *args: str, profile: Path, timeout_s: float = 60.0
             ) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium with its own throw-away profile folder; fails loudly on errors."""
    command = [program, *FLAGS, f"--user-data-dir={profile}", *args]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return done
