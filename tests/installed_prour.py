"""The ``prour`` command as users run it: the console script that installing the package puts
beside the interpreter (``.venv/bin/prour``), not ``python -m prour.cli.main``. Tests that stand
for a user at the terminal start it through :func:`prour_argv`; tests/faults/test_matrix.py holds
that every command family of the fault matrix has a CI cell doing so."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAME = "prour"


def declared_entry() -> str:
    """What pyproject.toml installs as the ``prour`` script (``module:function``)."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"][NAME]


def installed_entry(script: Path | None = None) -> str | None:
    """What the installed ``prour`` script calls (``module:function``), read from the script
    itself (``from MODULE import FUNCTION``, as pip writes it; a stray ``*.egg-info`` in the
    working folder can name something else); None when it names nothing."""
    script = script or Path(sys.executable).parent / NAME
    found = re.search(r"^from (\S+) import (\w+)$", script.read_text(), re.MULTILINE)
    return f"{found.group(1)}:{found.group(2)}" if found else None


def prour_script() -> Path:
    """The installed ``prour`` script beside this interpreter; a missing or stale one fails the
    test with the fix (a stale one calls what pyproject.toml no longer names)."""
    script = Path(sys.executable).parent / NAME
    assert script.is_file(), f"no {script}: install the package (`make install`)"
    declared, installed = declared_entry(), installed_entry(script)
    assert installed == declared, (
        f"the installed {script} calls {installed}, pyproject.toml says {declared}: reinstall "
        "(`make install`, or `pip install -e .`)")
    return script


def prour_argv(*args: str) -> list[str]:
    """The argv of ``prour <args>`` through the installed script."""
    return [str(prour_script()), *args]
