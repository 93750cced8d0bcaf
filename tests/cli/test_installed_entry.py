"""The command users run is the one the tests run: the ``prour`` console script that installing the
package makes. It enters at ``prour.cli.main:main``, the guard that ends a read-only or full disk
in one line; it used to enter the typer app directly, so `prour collect` into such a folder printed
a traceback while ``python -m prour.cli.main`` (the tests, ``prour run``'s steps) printed the
line. Here the installed script runs into a read-only and a full folder, and the entry
pyproject.toml declares is run the way a console script runs it, so that an entry that skips the
guard again fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from installed_prour import declared_entry, installed_entry, prour_argv
from test_bad_setups import _collect_recipe, tmpfs


def _fill_to(mount: Path, left: int) -> None:
    """Fill ``mount`` until the disk refuses, then give back ``left`` bytes: the provenance and
    the lock fit, a whole scripted episode does not."""
    fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        with pytest.raises(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
        os.ftruncate(fd, os.fstat(fd).st_size - left)
    finally:
        os.close(fd)


def _one_line(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    """Exit 1, no traceback, exactly one ``error:`` line holding ``fragments``."""
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize("fault", ["read-only", "full"])
def test_the_installed_prour_into_a_read_only_or_full_folder_is_one_line(tmp_path, fault):
    mount = tmp_path / "disk"
    run = mount / "run"
    with tmpfs(mount, "1m" if fault == "read-only" else "256k", read_only=fault == "read-only"):
        if fault == "full":
            _fill_to(mount, 16 * 1024)
        proc = _run(prour_argv("collect", "--recipe", str(_collect_recipe(tmp_path, run)),
                               "--no-progress"))
    if fault == "read-only":
        _one_line(proc, f"cannot write {run}", f"the file system ({mount}) is read-only",
                  "point run_dir")
    else:
        _one_line(proc, f"cannot write {run / 'data' / 'trajectories.jsonl'}",
                  f"no space left on the device ({mount})", "point run_dir at a larger disk")


def test_the_declared_console_entry_is_the_guard(tmp_path):
    """pyproject.toml's ``prour`` entry, run as pip's console script runs it (import the object,
    call it, exit with what it returns), ends a read-only folder in one line; so does the
    installed script, whose metadata names the same entry (a stale install is named)."""
    module, _, name = declared_entry().partition(":")
    script = f"import sys; from {module} import {name}; sys.exit({name}())"
    mount = tmp_path / "ro"
    with tmpfs(mount, "1m", read_only=True):
        recipe = str(_collect_recipe(tmp_path, mount / "run"))
        declared = _run([sys.executable, "-c", script, "collect", "--recipe", recipe,
                         "--no-progress"])
    _one_line(declared, f"the file system ({mount}) is read-only")
    assert installed_entry() == declared_entry()


def test_the_guard_is_what_the_entry_adds(tmp_path):
    """The same command through the bare typer app prints the traceback the guard replaces: the
    test above would fail if the entry skipped it (it is not vacuous)."""
    script = "import sys; from prour.cli.main import app; sys.exit(app())"
    mount = tmp_path / "ro"
    with tmpfs(mount, "1m", read_only=True):
        recipe = str(_collect_recipe(tmp_path, mount / "run"))
        bare = _run([sys.executable, "-c", script, "collect", "--recipe", recipe,
                     "--no-progress"])
    assert bare.returncode == 1 and "Traceback" in bare.stderr, bare.stderr[-2000:]
    assert "OSError: [Errno 30] Read-only file system" in bare.stderr, bare.stderr[-2000:]
