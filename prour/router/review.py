"""The review gate of the calibrate stage (DESIGN.md §6): a person reads the annotator's labels,
corrects a wrong one in its ``corrected`` field, and approves them; the threshold search reads
only approved labels.

Approval is ``<router.calibration.out_dir>/labels.approved.json``: the sha256 of each labels file
as it was approved. A labels file changed afterwards (a correction, a new annotation) is no longer
approved. It is written by ``prour calibrate approve``, by ``prour run --approve-labels`` at the
gate, or by the runner when ``router.calibration.approve_labels`` is true.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from prour.files import file_sha256, write_atomic

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe

SCHEMA = "prour.labels-approved/1"
APPROVAL_NAME = "labels.approved.json"
UNLABELLED = "(no label)"


def approval_path(recipe: Recipe) -> Path:
    from prour.router.thresholds import calibration_dir

    return calibration_dir(recipe) / APPROVAL_NAME


def labels_files(recipe: Recipe) -> dict[str, Path]:
    """Split -> its labels file, for the splits whose states the recipe names."""
    from prour.router.thresholds import calibration_dir

    calibration = recipe.router.calibration  # the names prour.router.pipeline.labels_path gives
    return {split: calibration_dir(recipe) / f"labels_{split}.jsonl" for split in ("dev", "test")
            if getattr(calibration, f"{split}_states")}


def label_counts(path: Path) -> Counter:
    """Labels per class in one labels file, ``corrected`` winning over ``label`` (a record with
    neither counts as :data:`UNLABELLED`)."""
    counts: Counter = Counter()
    with open(path) as handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                counts["(unreadable line)"] += 1
                continue
            counts[record.get("corrected") or record.get("label") or UNLABELLED] += 1
    return counts


def describe_counts(counts: Counter) -> str:
    """``act 3, clarify 1`` (classes by name), or ``no labels``."""
    return ", ".join(f"{name} {counts[name]}" for name in sorted(counts)) or "no labels"


def is_approved(recipe: Recipe) -> bool:
    """Every labels file exists and is the one recorded as approved."""
    files = labels_files(recipe)
    path = approval_path(recipe)
    if not files or not path.is_file():
        return False
    try:
        approved = json.loads(path.read_text()).get("files", {})
    except (json.JSONDecodeError, AttributeError):
        return False
    return all(file.is_file() and approved.get(file.name) == file_sha256(file)
               for file in files.values())


def approve(recipe: Recipe, by: str) -> dict[str, Counter]:
    """Record the current labels files as approved (``by``: what approved them); returns the
    counts per class of each split. A missing labels file raises (annotate first)."""
    files = labels_files(recipe)
    if not files:
        raise ValueError("router.calibration.dev_states/test_states are not set: no labels to "
                         "approve")
    missing = [str(file) for file in files.values() if not file.is_file()]
    if missing:
        raise ValueError(f"no labels yet in {', '.join(missing)}; annotate first: "
                         f"prour calibrate --recipe RECIPE --stage label")
    counts = {split: label_counts(file) for split, file in files.items()}
    record = {
        "schema": SCHEMA,
        "files": {file.name: file_sha256(file) for file in files.values()},
        "counts": {split: dict(count) for split, count in counts.items()},
        "by": by,
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    write_atomic(approval_path(recipe), json.dumps(record, indent=2) + "\n")
    return counts


def review_mix(recipe: Recipe) -> tuple[Path, int]:
    """The dev mix's record file and how many dev states were labelled because a review's
    corrections left the mix short (``labelled_after_review``; 0 without a record)."""
    from prour.router.dev_mix import mix_path, read_mix

    return mix_path(recipe), int(read_mix(recipe).get("labelled_after_review", 0))
