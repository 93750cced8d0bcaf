"""The training set on disk: one parquet file per split, rows as :mod:`prour.data.schema` defines.

Writing (atomic), reading (refusing rows of an older schema version), loading with ``datasets``,
and the whole-dataset check (row schema plus split disjointness).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from prour.data.schema import ROW_SCHEMA, check_rows, version_problem
from prour.files import write_atomic

SPLITS = ("train", "validation")


def split_path(dataset_dir: str | Path, split: str) -> Path:
    """``<dataset_dir>/<split>.parquet``."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    return Path(dataset_dir) / f"{split}.parquet"


def write_rows(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Write rows with the fixed schema (atomically: the parquet bytes through a renamed temp file)."""
    table = pa.Table.from_pylist(list(rows), schema=ROW_SCHEMA)
    buffer = pa.BufferOutputStream()
    pq.write_table(table, buffer)
    return write_atomic(path, buffer.getvalue().to_pybytes())


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a split file as plain dicts; a file of another schema version, or one that is
    not parquet (corrupt, truncated, 0 bytes), is a one-line ValueError naming the file."""
    try:
        rows = pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:  # a text column's bytes too
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"{path}: not a readable parquet file ({reason}); rerun `prour extract` "
                         "to write it again") from None
    first = rows[0].get("extra_info") if rows else None
    if rows and not isinstance(first, dict):
        raise ValueError(f"{path}: row 0 has no extra_info struct (got {type(first).__name__}); "
                         "rerun `prour extract` to write it again")
    problems = version_problem(first) if rows else []
    if problems:
        raise ValueError(f"{path}: {problems[0]}")
    return rows


def _row_count(path: Path) -> int:
    """Rows of a parquet file, read from its footer (``datasets`` cannot load an empty file)."""
    return pq.ParquetFile(path).metadata.num_rows


def load_split(path: str | Path):
    """A split file as a ``datasets.Dataset`` (what the trainers read)."""
    import datasets

    return datasets.load_dataset("parquet", data_files=str(path), split="train")


# ---------------------------------------------------------------- dataset check


def check_dataset(dataset_dir: str | Path) -> list[str]:
    """Schema errors of both split files, plus any trajectory that appears in both splits."""
    errors: list[str] = []
    trajectories: dict[str, set[str]] = {}
    for split in SPLITS:
        path = split_path(dataset_dir, split)
        if not path.is_file():
            errors.append(f"{path}: missing")
            continue
        if _row_count(path) == 0:
            errors.append(
                f"{path}: no rows (every decision state routed to act, or no valid candidate "
                "survived; see the dataset card's route counts, and check the thresholds and "
                "the decomposer model)"
            )
            continue
        rows = [dict(row) for row in load_split(path)]
        outdated = version_problem(rows[0]["extra_info"] or {})
        if outdated:  # one error per file, not one per row
            errors.append(f"{path}: {outdated[0]}")
            continue
        errors.extend(check_rows(rows, where=f"{path}: "))
        trajectories[split] = {r["extra_info"]["trajectory_id"] for r in rows if r["extra_info"]}
    shared = set.intersection(*trajectories.values()) if len(trajectories) == 2 else set()
    if shared:
        errors.append(f"trajectories in both splits: {sorted(shared)[:5]} ({len(shared)} in all)")
    return errors
