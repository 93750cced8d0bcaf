"""Checkpoints: the local trainer's ``<output_dir>/step_N/`` written atomically, and finding the
Hugging Face folder in any checkpoint path (a model folder, a local or a verl output folder).

A local checkpoint holds the policy in Hugging Face format (weights, config, generation config,
tokenizer) and ``trainer_state.pt`` (optimizer, scheduler, RNG states, data position). It is
assembled in a hidden temporary folder and renamed into place, so a ``step_N`` folder is always
complete; leftovers of a save that was killed are hidden folders that loading ignores. Each
``step_N`` also lists its files and their sizes (:data:`MANIFEST_FILE`): a folder whose files were
cut short or removed afterwards (a full disk while another tool copied it, a bad sector, a
truncated file) is not complete, so a resume takes the newest step before it. verl saves
``global_step_N/actor`` FSDP shards, which ``prour train export`` merges into ``step_N``.
torch and numpy are imported by the functions that save or restore state, so that finding a
checkpoint (evaluation, preflight) loads neither.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prour.config.train import step_dir

logger = logging.getLogger(__name__)

STATE_FILE = "trainer_state.pt"
MANIFEST_FILE = "checkpoint_files.json"  # {relative path: size in bytes} of every file saved
TEMP_PREFIX = ".tmp-"
STEP_DIR = re.compile(r"^step_(\d+)$")


def complete_checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every finished checkpoint, oldest first (temp folders are skipped)."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = STEP_DIR.match(child.name)
        if match and child.is_dir() and (child / STATE_FILE).is_file():
            damage = checkpoint_damage(child)
            if damage is None:
                found.append((int(match.group(1)), child))
            else:
                logger.warning("skipping the damaged checkpoint %s: %s", child, damage)
    return sorted(found)


def checkpoint_damage(folder: Path) -> str | None:
    """What no longer matches ``folder``'s :data:`MANIFEST_FILE` (a file missing or of another
    size than saved), or None when all does; a folder saved before manifests were written is
    taken as it is."""
    import json

    try:
        listed = json.loads((folder / MANIFEST_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return f"its {MANIFEST_FILE} is unreadable ({exc})"
    if not isinstance(listed, dict) or not all(
            isinstance(size, int) and not isinstance(size, bool) for size in listed.values()):
        return f"its {MANIFEST_FILE} is not a mapping of file names to sizes"
    for name, size in sorted(listed.items()):
        if not name or "\0" in name or Path(name).is_absolute() or ".." in Path(name).parts:
            return f"its {MANIFEST_FILE} lists {name!r}, not a file inside the checkpoint"
        try:
            actual = (folder / name).stat().st_size
        except FileNotFoundError:
            return f"{name} is missing"
        except OSError as exc:
            return f"{name} cannot be read ({exc.strerror or exc})"
        if actual != size:
            return f"{name} holds {actual} bytes, {size} were saved"
    return None


def _write_manifest(staging: Path) -> None:
    import json

    sizes = {p.relative_to(staging).as_posix(): p.stat().st_size
             for p in sorted(staging.rglob("*")) if p.is_file() and p.name != MANIFEST_FILE}
    from prour.files import write_atomic

    write_atomic(staging / MANIFEST_FILE, json.dumps(sizes, indent=1, sort_keys=True))


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest finished checkpoint folder, or None."""
    found = complete_checkpoints(output_dir)
    return found[-1][1] if found else None


def rng_state() -> dict[str, Any]:
    """Every random stream the trainer draws from."""
    import numpy as np
    import torch

    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    output_dir: str | Path, step: int, model: Any, tokenizer: Any, trainer_state: dict[str, Any]
) -> Path:
    """Write ``step_<step>`` atomically and return it (an older folder of that name is replaced)."""
    import torch

    root = Path(output_dir)
    root.mkdir(parents=True, exist_ok=True)

    def fill(staging: Path) -> None:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        torch.save(trainer_state, staging / STATE_FILE)

    final = _publish_step(root, step, fill)
    logger.info("checkpoint written: %s", final)
    return final


def _publish_step(root: Path, step: int, fill: Callable[[Path], None]) -> Path:
    """``step_<step>`` under ``root``, made whole or not at all: ``fill`` writes a staging folder,
    which is synced and renamed into place (an older folder of that step, from a rerun or a
    resume, is moved aside first); on any error the staging folder is removed."""
    staging = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}step_{step}-", dir=root))
    try:
        fill(staging)
        _write_manifest(staging)
        _fsync_tree(staging)
        final = step_dir(root, step)
        if final.exists():
            old = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}old-step_{step}-", dir=root))
            os.replace(final, old / final.name)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(staging, final)
        _fsync_dir(root)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        refused = _os_error_of(exc, step_dir(root, step))
        if refused is not None:
            raise refused from None
        raise
    return final


_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def _os_error_of(exc: BaseException, target: Path) -> OSError | None:
    """The :class:`OSError` behind a writer's own exception (safetensors reports a full disk as
    ``SafetensorError: ... (os error 28)``), naming ``target``, so that it ends the command as a
    disk failure line; None for an OSError already or any other error."""
    match = _OS_ERROR.search(str(exc)) if not isinstance(exc, OSError) else None
    if match is None:
        return None
    number = int(match.group(1))
    return OSError(number, os.strerror(number), str(target))


HF_FILES = ("config.json", "tokenizer_config.json")
# What transformers loads weights from: one file, or the index of a sharded save (safetensors by
# default, ``pytorch_model*.bin`` with ``safe_serialization=False``).
HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
              "pytorch_model.bin.index.json")


def export_hf(output_dir: str | Path, step: int | None = None, target: Path | None = None) -> Path:
    """The Hugging Face folder of a finished local checkpoint (newest when ``step`` is None).

    ``step_N`` already is one (weights, config, tokenizer; loaders ignore the trainer state
    beside them), so without ``target`` it is checked and returned; with ``target`` its files
    except the trainer state are copied there. Missing steps or files raise FileNotFoundError.
    """
    found = dict(complete_checkpoints(output_dir))
    if not found:
        raise FileNotFoundError(
            f"no finished checkpoint (step_N with {STATE_FILE}) under {output_dir}; "
            "run `prour train` first"
        )
    step = max(found) if step is None else step
    if step not in found:
        steps = ", ".join(map(str, sorted(found)))
        raise FileNotFoundError(f"no finished step_{step} under {output_dir} (steps: {steps})")
    folder = found[step]
    missing = [name for name in HF_FILES if not (folder / name).is_file()]
    if not any((folder / name).is_file() for name in HF_WEIGHTS):
        missing.append("weights (" + " or ".join(HF_WEIGHTS) + ")")
    if missing:
        raise FileNotFoundError(f"{folder} is not a Hugging Face folder: no {', '.join(missing)}")
    if target is None:
        return folder
    shutil.copytree(folder, target, ignore=shutil.ignore_patterns(STATE_FILE, MANIFEST_FILE),
                    dirs_exist_ok=True)
    return target


def load_trainer_state(folder: str | Path) -> dict[str, Any]:
    """The trainer state of a finished checkpoint (optimizer, scheduler, RNG, data position)."""
    path = Path(folder) / STATE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{folder} is not a finished checkpoint: {STATE_FILE} is missing")
    import torch

    return torch.load(path, map_location="cpu", weights_only=False)


def remove_temporaries(output_dir: str | Path) -> list[Path]:
    """Delete hidden leftovers of interrupted saves; returns what was removed."""
    root = Path(output_dir)
    removed = [p for p in root.glob(f"{TEMP_PREFIX}*") if p.is_dir()] if root.is_dir() else []
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
        logger.info("removed an unfinished checkpoint: %s", path)
    return removed


def prune_checkpoints(output_dir: str | Path, keep: int | None) -> None:
    """Keep only the ``keep`` newest finished checkpoints (None: keep all)."""
    if keep is None:
        return
    for _, folder in complete_checkpoints(output_dir)[:-keep]:
        shutil.rmtree(folder, ignore_errors=True)


def _fsync_tree(folder: Path) -> None:
    """Flush every file of ``folder`` to disk before it is renamed into place."""
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---- finding the Hugging Face folder of a checkpoint ---------------------------------------

_VERL_STEP = re.compile(r"^global_step_(\d+)$")
_VERL_SHARD = "model_world_size_*_rank_*.pt"


def is_hf_folder(path: Path) -> bool:
    """A folder transformers can load: a config and weights."""
    return (path / "config.json").is_file() and any((path / w).is_file() for w in HF_WEIGHTS)


def _newest(children: list[tuple[int, Path]]) -> Path | None:
    return max(children)[1] if children else None


def _verl_steps(root: Path) -> list[tuple[int, Path]]:
    return [(int(m.group(1)), p) for p in root.iterdir()
            if p.is_dir() and (m := _VERL_STEP.match(p.name))]


def latest_verl_step(output_dir: str | Path) -> int | None:
    """The newest ``global_step_N`` that verl saved under ``output_dir`` (with its ``actor/``
    folder), or None; the verl counterpart of :func:`latest_checkpoint`."""
    root = Path(output_dir)
    steps = [step for step, folder in _verl_steps(root) if (folder / "actor").is_dir()] \
        if root.is_dir() else []
    return max(steps) if steps else None


UNTRAINED_FILE = "untrained.json"  # in verl's global_step_N (and its step_N): why no update ran


def save_untrained_verl(output_dir: str | Path, step: int, policy: Path, reason: str) -> Path:
    """verl's final step when there was nothing to train on (the local trainer's
    ``_save_untrained``): ``step_<step>``, what ``prour train export`` would write, becomes a
    copy of the initial policy's Hugging Face folder, and ``global_step_<step>/untrained.json``
    says why, where the chain looks for verl's steps. Returns ``step_<step>``."""
    import json

    from prour.files import write_atomic

    root = Path(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    record = json.dumps({"step": step, "untrained": reason, "initial_policy": str(policy)})

    def fill(staging: Path) -> None:
        shutil.copytree(policy, staging, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(STATE_FILE, UNTRAINED_FILE, MANIFEST_FILE,
                                                     TEMP_PREFIX + "*"))
        write_atomic(staging / UNTRAINED_FILE, record)

    final = _publish_step(root, step, fill)
    write_atomic(root / f"global_step_{step}" / UNTRAINED_FILE, record, fsync=True)
    return final


def untrained_verl_step(output_dir: str | Path) -> int | None:
    """The N of the ``global_step_N`` that :func:`save_untrained_verl` wrote (its ``step_N`` a
    Hugging Face folder), or None."""
    root = Path(output_dir)
    steps = [step for step, folder in (_verl_steps(root) if root.is_dir() else [])
             if (folder / UNTRAINED_FILE).is_file() and is_hf_folder(root / f"step_{step}")]
    return max(steps) if steps else None


def _newest_verl_step(root: Path) -> Path | None:
    """The newest ``global_step_N`` of a verl output folder, or its export ``step_N`` (an HF
    folder written by ``prour train export``) when there is one."""
    newest = _newest(_verl_steps(root))
    if newest is None:
        return None
    exported = root / newest.name.removeprefix("global_")
    return exported if is_hf_folder(exported) else newest


def _export_hint(actor: Path) -> str:
    """What to run when a checkpoint holds verl FSDP shards only."""
    step = actor.parent.name if actor.name == "actor" else actor.name
    match = _VERL_STEP.match(step)
    output = actor.parent.parent if actor.name == "actor" else actor.parent
    number = match.group(1) if match else "N"
    return (f"{actor} holds verl FSDP shards, not a Hugging Face model; export them with "
            f"`prour train export --recipe RECIPE --step {number}` (the recipe that trained "
            f"them; it writes {output / f'step_{number}'}) and pass {output} again")


def resolve_checkpoint(path: str | Path) -> Path:
    """The HF folder inside a checkpoint path: the folder itself, a verl ``huggingface`` folder,
    or the newest step of a trainer output folder (local ``step_N``; verl ``global_step_N`` as
    ``prour train export`` left it in ``step_N``)."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"checkpoint {root} does not exist or is not a folder")
    for candidate in (root, root / "huggingface", root / "actor" / "huggingface"):
        if is_hf_folder(candidate):
            return _with_tokenizer(candidate)
    newest = latest_checkpoint(root) or _newest_verl_step(root)
    if newest is not None:
        return resolve_checkpoint(newest)
    shards = list(root.glob(_VERL_SHARD)) + list(root.glob(f"actor/{_VERL_SHARD}"))
    if shards:
        raise ValueError(_export_hint(shards[0].parent))
    raise ValueError(f"{root} is not a checkpoint: no config.json with weights in it, in "
                     "huggingface/ or actor/huggingface/, and no step_N or global_step_N folder")


def checkpoint_step(folder: str | Path) -> int | None:
    """The training step of a resolved checkpoint folder: the ``step_N`` (local trainer) or
    ``global_step_N`` (verl) folder it is or lies in; None for a model folder of no run."""
    for part in (Path(folder), *Path(folder).parents):
        match = STEP_DIR.match(part.name) or _VERL_STEP.match(part.name)
        if match:
            return int(match.group(1))
    return None


def checkpoint_steps(root: str | Path) -> dict[int, Path]:
    """Every saved step of a trainer output folder, step -> folder: local ``step_N``, verl
    ``global_step_N`` (its ``prour train export`` in ``step_N`` when there is one)."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"checkpoint {root} does not exist or is not a folder")
    found = {}
    for step, folder in _verl_steps(root):
        exported = root / f"step_{step}"
        found[step] = exported if is_hf_folder(exported) else folder
    found.update(complete_checkpoints(root))
    return dict(sorted(found.items()))


def select_checkpoints(root: str | Path, steps: list[str]) -> dict[int, Path]:
    """The HF folders of the chosen steps of a trainer output folder (``["all"]`` or numbers),
    step -> folder; every folder is resolved (a verl step must be merged) before any runs."""
    available = checkpoint_steps(root)
    if not available:
        raise ValueError(f"{root} holds no step_N or global_step_N checkpoint to sweep")
    if steps == ["all"]:
        chosen = list(available)
    else:
        try:
            chosen = sorted({int(s) for s in steps})
        except ValueError:
            raise ValueError(
                f"--steps takes 'all' or step numbers, got {','.join(steps)}") from None
        missing = [s for s in chosen if s not in available]
        if missing:
            raise ValueError(f"{root} has no checkpoint of step {', '.join(map(str, missing))}; "
                             f"saved steps: {', '.join(map(str, available))}")
    return {step: resolve_checkpoint(available[step]) for step in chosen}


def _with_tokenizer(folder: Path) -> Path:
    if not (folder / "tokenizer_config.json").is_file():
        raise ValueError(f"checkpoint {folder} has weights but no tokenizer "
                         "(tokenizer_config.json); save the tokenizer next to the model")
    return folder


def holds_checkpoints(folder: str | Path) -> bool:
    """A trainer output folder with at least one saved step (local ``step_N``, verl
    ``global_step_N``)."""
    root = Path(folder)
    return root.is_dir() and bool(complete_checkpoints(root) or _verl_steps(root))


def old_checkpoints(output_dir: str | Path, run_dir: str | Path, name: str,
                    cwd: str | Path | None = None) -> str | None:
    """One line when a run has no checkpoints in ``output_dir`` but has them where prour put them
    before ``train.output_dir`` was relative to ``run_dir``: ``./checkpoints/<name>`` (the old
    default) or the same relative path taken from the working directory; None otherwise."""
    output_dir, here = Path(output_dir), Path(cwd or Path.cwd())
    if holds_checkpoints(output_dir):
        return None
    places = [here / "checkpoints" / name]
    if output_dir.is_relative_to(run_dir):
        places.append(here / output_dir.relative_to(run_dir))
    for old in dict.fromkeys(places):
        if old.resolve() != output_dir.resolve() and holds_checkpoints(old):
            move = (f"`mkdir -p {output_dir.parent} && mv {old} {output_dir}`"
                    if not output_dir.exists() else f"the contents of {old} into {output_dir}")
            return (f"the checkpoints of recipe {name!r} are in {old}, where older prour put them; "
                    f"train.output_dir is now relative to run_dir ({output_dir}): move them "
                    f"({move}) or set train.output_dir={old}")
    return None
