"""Local model weights: a hub id (``Qwen/Qwen3-1.7B``) or a folder, resolved without the network.

Recipes name models by hub id; on a GPU node the weights sit in a local folder. Lookup order of
:func:`local_weights` for a name ``N``:

1. ``N`` itself, when it is an existing folder (absolute, or relative to the working directory);
2. for each models folder ``D`` — the recipe's ``models_dir``, then ``$PROUR_MODELS_DIR`` —
   ``D/N`` (``<D>/Qwen/Qwen3-1.7B``), then ``D/<last part of N>`` (``<D>/Qwen3-1.7B``);
3. the Hugging Face cache (``$HF_HUB_CACHE``, ``$HF_HOME/hub``), read with ``local_files_only``.

A folder counts when it holds ``config.json`` or ``tokenizer_config.json``. Nothing is ever
downloaded: a missing model is one :class:`ModelNotFound` line naming the id, the places looked in
and the fix, instead of transformers' retries against an unreachable hub.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

MODELS_DIR_ENV = "PROUR_MODELS_DIR"
DEFAULT_MODELS_DIR = "~/models"  # what the download hint suggests when no models folder is set
MARKERS = ("config.json", "tokenizer_config.json")  # what makes a folder a model or tokenizer
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


class ModelNotFound(FileNotFoundError):
    """A model named by a recipe has no local weights; the message is one line with the fix."""


def models_dirs(models_dir: str | None = None) -> list[Path]:
    """The models folders searched, in order: the recipe's ``models_dir``, then the env var."""
    found: list[Path] = []
    for value in (models_dir, os.environ.get(MODELS_DIR_ENV)):
        if value:
            path = Path(value).expanduser()
            if path not in found:
                found.append(path)
    return found


def _is_model_folder(path: Path) -> bool:
    return path.is_dir() and any((path / marker).is_file() for marker in MARKERS)


def _candidates(name: str, models_dir: str | None) -> list[Path]:
    """Folders that may hold ``name``, in lookup order (steps 1 and 2)."""
    own = Path(name).expanduser()
    out = [own]
    if not own.is_absolute():
        for root in models_dirs(models_dir):
            out += [root / name, root / Path(name).name]
    return list(dict.fromkeys(out))


def _hub_cache(name: str) -> Path | None:
    """The cached snapshot of hub id ``name`` (step 3), never a download."""
    if not _HUB_ID.match(name):
        return None
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
    except ImportError:  # pragma: no cover - a dependency of transformers
        return None
    try:
        folder = Path(snapshot_download(name, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError, OSError, ValueError):
        return None
    return folder if _is_model_folder(folder) else None


def hub_cache_dir() -> str:
    """Where the Hugging Face cache lives (for messages)."""
    try:
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)
    except ImportError:  # pragma: no cover
        return "~/.cache/huggingface/hub"


def missing_message(name: str, models_dir: str | None, key: str | None = None) -> str:
    """One line: which model, where it was looked for, and how to provide it."""
    looked = [str(p) for p in _candidates(name, models_dir)]
    if _HUB_ID.match(name):
        looked.append(f"the Hugging Face cache {hub_cache_dir()}")
    roots = models_dirs(models_dir)
    # without a models folder yet, one under the home folder: both commands run as printed
    where = f"{roots[0]}/{name}" if roots else f"{DEFAULT_MODELS_DIR}/{name}"
    setting = "" if roots else (f"; then `export {MODELS_DIR_ENV}={DEFAULT_MODELS_DIR}` (or set "
                                f"models_dir in the recipe to that folder)")
    label = f"{name!r} ({key})" if key else repr(name)
    if Path(name).expanduser().is_dir():
        return (f"model {label}: folder {name} holds neither {' nor '.join(MARKERS)}; "
                "point at the folder that holds the model's files")
    if Path(name).is_absolute() or not _HUB_ID.match(name):
        fix = ("fix the path, or name a hub id whose weights are in a models folder (the CPU "
               f"recipes' tiny model: build it there with `prour tiny-model {name}`)")
    else:
        fix = f"download it once with `hf download {name} --local-dir {where}`{setting}"
    return f"model {label} has no local weights (looked in {', '.join(looked)}); {fix}"


def local_weights(name: str, models_dir: str | None = None, key: str | None = None) -> str:
    """The local folder of model ``name`` (a folder or hub id); :class:`ModelNotFound` naming
    ``key`` (the recipe key that named it), the folders looked in and the fix."""
    for folder in _candidates(name, models_dir):
        if _is_model_folder(folder):
            return str(folder)
    cached = _hub_cache(name)
    if cached is not None:
        return str(cached)
    raise ModelNotFound(missing_message(name, models_dir, key))


# What transformers and vLLM load weights from: *.safetensors, pytorch_model*.bin, or an index
# naming its shards.
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def missing_weight_files(folder: str | Path, key: str | None = None,
                         name: str | None = None) -> str | None:
    """Why the model folder ``folder`` holds no loadable weights (one line with the fix), or
    ``None``: a ``*.safetensors`` / ``pytorch_model*.bin`` file, or an index whose shards are all
    there. A folder with ``config.json`` and no weights passes :func:`local_weights` (tokenizers
    need no more) but fails to load with an ``OSError`` later; preflight asks this first.
    ``name``: the hub id the recipe named, for the download command."""
    import json

    folder = Path(folder)
    label = repr(name or str(folder)) + (f" ({key})" if key else "")
    fix = (f"download them with `hf download {name} --local-dir {shlex.quote(str(folder))}`"
           if name and _HUB_ID.match(name) and not Path(name).expanduser().is_dir()
           else "copy the model's weight files into it")
    for index in WEIGHT_INDEXES:
        if not (folder / index).is_file():
            continue
        try:
            shards = set(json.loads((folder / index).read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return f"model {label}: {folder / index} is not a weight index (no weight_map); {fix}"
        absent = sorted(shard for shard in shards if not (folder / shard).is_file())
        if absent:
            return (f"model {label}: {len(absent)} of {len(shards)} weight shard(s) named by "
                    f"{index} are missing ({', '.join(absent[:3])}"
                    f"{', ...' if len(absent) > 3 else ''}); {fix}")
        return None
    if any(folder.glob("*.safetensors")) or any(folder.glob("pytorch_model*.bin")):
        return None
    return (f"model {label}: folder {folder} holds no weight files (*.safetensors, "
            f"pytorch_model*.bin or an index of shards); {fix}")

