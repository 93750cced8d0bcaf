"""Failures of the node rather than of the recipe, as one line naming the cause and the fix:
a run folder on a read-only or full disk (any command, caught where ``prour`` starts), and a
model server that answers with errors while a stage calls it."""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe

DISK_ERRNOS = {errno.EROFS: "read-only", errno.ENOSPC: "full", errno.EDQUOT: "full",
               errno.EACCES: "denied", errno.EPERM: "denied"}
FAILED_EXIT = 1  # the command ran and failed (2 is kept for a recipe or setup refused up front)


def _mount_of(path: Path) -> Path:
    """The mount point holding ``path`` (or its nearest existing parent)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def _size(count: int) -> str:
    for unit, power in (("GiB", 3), ("MiB", 2)):
        if count >= 1024**power:
            return f"{count / 1024**power:.1f} {unit}"
    return f"{count / 1024:.0f} KiB"


def disk_failure_line(exc: OSError) -> str | None:
    """One line for a write refused by the disk (read-only, full, over quota, not permitted),
    naming the file, its file system and the fix; ``None`` for any other error."""
    kind = DISK_ERRNOS.get(exc.errno or 0)
    if kind is None or (kind == "denied" and not exc.filename):  # e.g. a signal not permitted
        return None
    target = Path(str(exc.filename)) if exc.filename else None
    where = f"cannot write {target}" if target else "cannot write to the run folder"
    mount = _mount_of(target) if target else None
    on = f" ({mount})" if mount else ""
    if kind == "read-only":
        return (f"{where}: the file system{on} is read-only; remount it read-write or point "
                f"run_dir (or the recipe key naming this path) at a writable disk, then rerun")
    if kind == "denied":  # reading or writing: the error does not say which
        return (f"cannot open {target}: permission denied; make it accessible to this user or "
                f"point run_dir (or the recipe key naming this path) at a folder that is")
    usage = shutil.disk_usage(mount) if mount else None
    space = f"{_size(usage.free)} free of {_size(usage.total)}" if usage else "no space"
    return (f"{where}: no space left on the device{on}, {space}; free space there or point "
            f"run_dir at a larger disk, then rerun the same command: what was saved is kept")


def run_app(app: typer.Typer) -> None:
    """Run the CLI; a disk that refuses a write ends it with :func:`disk_failure_line` and exit
    1 instead of a traceback."""
    try:
        app()
    except OSError as exc:
        line = disk_failure_line(exc)
        if line is None:
            raise
        typer.echo(f"error: {line}", err=True)
        raise SystemExit(FAILED_EXIT) from None


def _roles_at(recipe: Recipe, message: str) -> list[str]:
    """The recipe's roles whose ``base_url`` the backend error names."""
    return [f"models.{role}" for role, cfg in recipe.models.items()
            if cfg.base_url and cfg.base_url.rstrip("/") in message]


def _server_log(recipe: Recipe, message: str) -> str | None:
    """The log file of the served model whose URL the error names (from the endpoints file)."""
    from prour.cluster.endpoints import EndpointsError, endpoints_path, read_endpoints

    try:
        record = read_endpoints(endpoints_path(recipe)) or {}
    except (EndpointsError, OSError):
        return None
    for server in (record.get("servers") or {}).values():
        url = str(server.get("base_url") or "").rstrip("/")
        if url and url in message and server.get("log"):
            return str(server["log"])
    return None


@contextmanager
def backend_failures(recipe: Recipe, *argv: str) -> Iterator[None]:
    """A model server that keeps failing (HTTP 5xx after the retries, refused connections) ends
    the command with one line naming the roles, the server's answer, its log and the command
    that resumes (``prour <argv>`` on the same recipe); exit 1."""
    from prour.llm.base import BackendError
    from prour.recipes import prour_command

    try:
        yield
    except BackendError as exc:
        message = " ".join(str(exc).split())
        roles = ", ".join(_roles_at(recipe, message)) or "a model server"
        log = _server_log(recipe, message)
        look = f"read its log {log}" if log else "read the server's log"
        typer.echo(f"error: {roles}: {message}; the server failed the request: {look}, fix or "
                   f"restart it, then rerun `{prour_command(recipe, *argv)}` (it redoes only what "
                   f"is not saved)", err=True)
        raise typer.Exit(FAILED_EXIT) from None


_QUOTED_COMMAND = re.compile(r"(?<=run )`(prour [^`]*)`")  # "run `…`" / "rerun `…`": a hint


def _reads_a_recipe(words: list[str], root: Any) -> bool:
    """Whether the ``prour`` subcommand ``words`` names takes ``--recipe`` (by the CLI's tree
    under the click command ``root``)."""
    command = root
    for word in words:
        if word not in getattr(command, "commands", {}):
            break
        command = command.commands[word]  # type: ignore[attr-defined]
    return command is not root and any(
        "--recipe" in getattr(param, "opts", ()) for param in command.params)


def complete_hints(text: str, recipe: Recipe, root: Any = None) -> str:
    """``text`` with each hint "run `prour …`" whose command reads a recipe but names none completed
    with this recipe's ``--recipe`` and ``--set`` items, so it runs as printed (library code
    that raises the message does not know the command line). ``root``: the ``prour`` click
    command (default: that of the running command; outside one, ``text`` is left as it is)."""
    import shlex

    try:  # typer >= 0.2x carries its own copy of click; older releases use click itself
        from typer._click.globals import get_current_context
    except ImportError:  # pragma: no cover - depends on the typer release
        from click import get_current_context

    if root is None:
        context = get_current_context(silent=True)
        if context is None:
            return text
        root = context.find_root().command

    def complete(match: re.Match[str]) -> str:
        try:
            words = shlex.split(match.group(1))
        except ValueError:
            return match.group(0)
        if "--recipe" in words or "-r" in words or not _reads_a_recipe(words[1:], root):
            return match.group(0)
        return f"`{shlex.join([*words, *recipe.recipe_args()])}`"

    return _QUOTED_COMMAND.sub(complete, text)


def complete_from_records(text: str, *folders: str | Path) -> str:
    """:func:`complete_hints` for a command that takes folders, not a recipe (``prour data
    stats``, ``prour report``): with the resolved recipe the first of ``folders`` recorded
    (:mod:`prour.provenance`), which loads as it is; ``text`` unchanged when none did."""
    from prour.config import ConfigError
    from prour.provenance import RECIPE_FILE
    from prour.recipes import load_recipe

    for folder in folders:
        recorded = Path(folder) / RECIPE_FILE
        if recorded.is_file():
            try:
                return complete_hints(text, load_recipe(recorded))
            except (ConfigError, OSError):
                return text
    return text
