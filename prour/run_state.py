"""How each step of a run's chain stands: done, stale, partial, pending, skipped or at the gate.

A step's outputs carry a stamp (``<run_dir>/.prour/steps/<step>.json``) of the recipe values they
were made with (:attr:`prour.step.Step.keys`); :func:`table` reads the stamps and the outputs of
every step in chain order and says what a run would do with each. ``prour run``, ``prour status``
and the Slurm submission (which stages are complete) read the same table.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prour.files import write_atomic
from prour.stages import File, Stage, Step, stage_of, steps, writer_of

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe

DONE, STALE, PARTIAL, PENDING, SKIPPED, GATE = "done", "stale", "partial", "pending", "skipped", \
    "gate"
STAMP_SCHEMA = "prour.step-stamp/1"


# ---- stamps: the recipe values a step's outputs were made with ---------------------------------


def flat_values(recipe: Recipe) -> dict[str, Any]:
    """The recipe as dotted key -> leaf value, paths under ``run_dir`` written relative to it (a
    copied run folder keeps its stamps)."""
    run_dir = str(recipe.resolved_run_dir())

    def relative(value: Any) -> Any:
        if isinstance(value, str) and (value == run_dir or value.startswith(run_dir + os.sep)):
            return "${run_dir}" + value[len(run_dir):]
        if isinstance(value, list):
            return [relative(item) for item in value]
        return value

    flat: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(f"{prefix}.{key}" if prefix else str(key), value)
        else:
            flat[prefix] = relative(node)

    walk("", recipe.model_dump(mode="json"))
    return flat


def _matches(key: str, pattern: str) -> bool:
    if pattern.endswith("*"):
        return key.startswith(pattern[:-1])
    return key == pattern or key.startswith(pattern + ".")


def step_values(recipe: Recipe, step: Step, flat: dict[str, Any] | None = None) -> dict[str, Any]:
    """The values of the keys ``step`` depends on (:attr:`Step.keys`; ``-key`` leaves one out)."""
    flat = flat_values(recipe) if flat is None else flat
    wanted = [k for k in step.keys if not k.startswith("-")]
    left_out = [k[1:] for k in step.keys if k.startswith("-")]
    return {key: value for key, value in flat.items()
            if any(_matches(key, k) for k in wanted) and not any(_matches(key, k) for k in left_out)}


def stamp_path(recipe: Recipe, step: Step) -> Path:
    return recipe.resolved_run_dir() / ".prour" / "steps" / f"{step.name}.json"


def read_stamp(recipe: Recipe, step: Step) -> dict[str, Any] | None:
    try:
        stamp = json.loads(stamp_path(recipe, step).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return stamp if isinstance(stamp, dict) and stamp.get("schema") == STAMP_SCHEMA else None


def write_stamp(recipe: Recipe, step: Step, command: str | None, started: float, ended: float,
                adopted: bool = False, failed: int | None = None) -> Path:
    """Record that ``step``'s outputs were made with the recipe's current values (``failed``: the
    exit code of a run that failed, so its outputs are not taken as done)."""
    record = {"schema": STAMP_SCHEMA, "step": step.name, "values": step_values(recipe, step),
              "command": command, "started": started, "ended": ended, "adopted": adopted,
              "failed": failed, "host": socket.gethostname()}
    return write_atomic(stamp_path(recipe, step), json.dumps(record, indent=2) + "\n")


def changed_values(stamp: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """``key: old -> new`` for each value the stamp holds differently (or lacks)."""
    old = stamp.get("values", {})
    keys = sorted(set(old) | set(now))
    missing = object()
    return [f"{key}: {json.dumps(old.get(key, None))} -> {json.dumps(now.get(key, None))}"
            for key in keys if old.get(key, missing) != now.get(key, missing)]


# ---- the table: each step's state ----------------------------------------------------------------


@dataclass
class Row:
    """One step of the chain and how it stands for this recipe and run folder."""

    step: Step
    stage: Stage
    state: str
    why: str = ""
    upstream: str | None = None  # stale because of this step (None: its own values changed)


def _nonempty(path: Path) -> bool:
    if path.is_dir():
        return any(path.iterdir())
    return path.exists()


def _unreadable(files: Sequence[File]) -> list[Path]:
    """The parquet outputs among ``files`` that exist but whose footer cannot be read."""
    broken = []
    for file in files:
        if file.path.suffix == ".parquet" and file.path.is_file():
            import pyarrow as pa
            import pyarrow.parquet as pq

            try:
                pq.read_metadata(file.path)
            except (OSError, pa.ArrowException):
                broken.append(file.path)
    return broken


def skip_reason(recipe: Recipe, step: Step) -> str | None:
    """Why a run of this recipe leaves ``step`` out, or None."""
    stage = stage_of(step)
    if stage.long_running:
        return "prour run serves each step's models itself"
    return stage.skip(recipe) or (step.skip(recipe) if step.skip else None)


def _made_at(recipe: Recipe, step: Step) -> float:
    """When the step's outputs were made: the oldest modification time among them."""
    times = [f.path.stat().st_mtime for f in step.writes(recipe) if f.path.exists()]
    return min(times, default=0.0)


def _upstreams(recipe: Recipe, step: Step) -> list[Step]:
    """The steps that write what ``step`` reads, once each, in chain order."""
    found = {writer_of(recipe, file.path).name for file in step.reads(recipe)}
    return [other for other in steps() if other.name in found]


def step_row(recipe: Recipe, step: Step, rows: dict[str, Row],
             flat: dict[str, Any] | None = None) -> Row:
    """The state of one step, given the rows of the steps before it."""
    stage = stage_of(step)
    why = skip_reason(recipe, step)
    if why:
        return Row(step, stage, SKIPPED, why)
    if step.is_gate:
        if step.is_done(recipe):
            return Row(step, stage, DONE, "labels approved")
        return Row(step, stage, GATE, "the labels wait for a person's review")
    stamp = read_stamp(recipe, step)
    changed = changed_values(stamp, step_values(recipe, step, flat)) if stamp else []
    if changed and any(_nonempty(f.path) for f in step.cleared(recipe)):
        # done or partial: what is there was made with other values
        return Row(step, stage, STALE, "made with other values: " + "; ".join(changed))
    broken = _unreadable(step.writes(recipe))
    if broken:  # there, but cut short (a crash, a copy): the step makes it again
        return Row(step, stage, PARTIAL, f"{', '.join(str(p) for p in broken)} not a readable "
                   "parquet file (cut short?): it runs again")
    failed = stamp is not None and stamp.get("failed") is not None
    if failed or not step.is_done(recipe):
        made = [f.path for f in step.cleared(recipe) if _nonempty(f.path)]
        if failed:
            return Row(step, stage, PARTIAL if made else PENDING,
                       f"its last run failed (exit code {stamp['failed']})")
        if made:
            return Row(step, stage, PARTIAL, f"resumes ({', '.join(p.name for p in made)} exist)")
        return Row(step, stage, PENDING)
    if stamp is None:
        made = _made_at(recipe, step)
        for other in _upstreams(recipe, step):
            theirs = read_stamp(recipe, other)  # it started after the outputs were there
            if theirs is not None and not theirs.get("failed") and theirs.get("started", 0) > made:
                return Row(step, stage, STALE, f"{other.name} ran again after its outputs were "
                           "made", other.name)
        return Row(step, stage, DONE, "outputs complete, no run of this step stamped them (another "
                   "step or a person made them)")
    for other in _upstreams(recipe, step):
        before = rows.get(other.name)
        if before is not None and before.state == STALE:
            return Row(step, stage, STALE, f"reads what stale step {other.name} wrote", other.name)
        theirs = read_stamp(recipe, other)
        if theirs is not None and not theirs.get("failed") \
                and theirs.get("ended", 0) > stamp.get("started", 0):
            return Row(step, stage, STALE, f"{other.name} ran again after it", other.name)
    return Row(step, stage, DONE)


def table(recipe: Recipe) -> list[Row]:
    """Every step of the chain with its state, in order."""
    flat = flat_values(recipe)
    rows: dict[str, Row] = {}
    for step in steps():
        rows[step.name] = step_row(recipe, step, rows, flat)
    return list(rows.values())


def affected_steps(made_with: Recipe, now: Recipe) -> list[str]:
    """The steps a change from ``made_with`` to ``now`` makes stale, in chain order: those whose
    key values differ, and every later one that reads what a stale one writes (what the table
    says of a finished run when the recipe changes so)."""
    before, after = flat_values(made_with), flat_values(now)
    stale: list[str] = []
    for step in steps():
        if skip_reason(now, step) or step.is_gate:
            continue
        if step_values(made_with, step, before) != step_values(now, step, after) or any(
                other.name in stale for other in _upstreams(now, step)):
            stale.append(step.name)
    return stale


def lock_folders(recipe: Recipe, step: Step) -> list[Path]:
    """The folders whose lock ``step``'s command takes: those its outputs are written in (the
    trajectories' folder for collect, ``train.output_dir``, eval's run folder, ...)."""
    folders: list[Path] = []
    for out in step.writes(recipe):
        for folder in (out.path.parent, *((out.path,) if out.path.is_dir() else ())):
            if folder not in folders:
                folders.append(folder)
    return folders


def folder_in_use(recipe: Recipe, step: Step) -> str | None:
    """Why ``step`` cannot start now: a folder it writes in is held by another live command
    (:class:`~prour.runlock.RunLocked`'s line, naming the holder); None when all are free."""
    from prour.runlock import RunLocked, live_holder

    for folder in lock_folders(recipe, step):
        holder = live_holder(folder)
        if holder is not None:
            return str(RunLocked(folder, holder))
    return None
