"""The training set on disk: parquet rows that ``datasets``, the local trainer and verl all read.

One row is one state–mode instance:

- ``prompt``: the query-generator chat for the state's mode (rollout templates), history inside;
- ``data_source``: ``prour/<domain>``;
- ``reward_model``: ``{"style": "rule", "ground_truth": target}`` with target G* (clarify) or the
  canonical JSON of the reference next tool call (verify) — the only place ground truth lives;
- ``extra_info``: mode, domain, task and trajectory ids, step, the (truncated) history as a JSON
  string of messages, AU/EU/total, truncation, token counts and verl's ``index``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from prour.llm.base import Message
from prour.router.candidates import canonical_json

SPLITS = ("train", "validation")
MODES = ("clarify", "verify")
DATA_SOURCE_PREFIX = "prour/"
SCHEMA_VERSION = 1

_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
EXTRA_INFO = pa.struct(
    [
        ("index", pa.int64()),
        ("mode", pa.string()),
        ("domain", pa.string()),
        ("task_id", pa.string()),
        ("trajectory_id", pa.string()),
        ("step", pa.int64()),
        ("history", pa.string()),
        ("au", pa.float64()),
        ("eu", pa.float64()),
        ("total", pa.float64()),
        ("truncated", pa.bool_()),
        ("dropped_messages", pa.int64()),
        ("prompt_tokens", pa.int64()),
        ("target_tokens", pa.int64()),
        ("decomposer_calls", pa.int64()),
        ("prompts_version", pa.string()),
        ("schema_version", pa.int64()),
    ]
)
ROW_SCHEMA = pa.schema(
    [
        ("prompt", pa.list_(_MESSAGE)),
        ("data_source", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        ("extra_info", EXTRA_INFO),
    ]
)


@dataclass
class Instance:
    """One state–mode instance before it becomes a row."""

    mode: str
    domain: str
    task_id: str
    trajectory_id: str
    step: int
    history: list[Message]
    prompt: list[Message]
    target: str
    au: float
    eu: float
    total: float
    truncated: bool
    dropped_messages: int
    prompt_tokens: int
    target_tokens: int
    decomposer_calls: int
    prompts_version: str

    def to_row(self, index: int) -> dict[str, Any]:
        """The parquet row; ``index`` is verl's per-row id within the split."""
        extra = {name: getattr(self, name) for name in EXTRA_INFO.names if hasattr(self, name)}
        extra.update(index=index, history=json.dumps(self.history, ensure_ascii=False),
                     schema_version=SCHEMA_VERSION)
        return {
            "prompt": [{"role": m["role"], "content": m["content"]} for m in self.prompt],
            "data_source": f"{DATA_SOURCE_PREFIX}{self.domain}",
            "reward_model": {"style": "rule", "ground_truth": self.target},
            "extra_info": extra,
        }


def split_path(dataset_dir: str | Path, split: str) -> Path:
    """``<dataset_dir>/<split>.parquet``."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    return Path(dataset_dir) / f"{split}.parquet"


def write_rows(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Write rows with the fixed schema (atomically: a temp file renamed into place)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(list(rows), schema=ROW_SCHEMA)
    tmp = path.with_suffix(path.suffix + ".tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)
    return path


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a split file as plain dicts."""
    return pq.read_table(path).to_pylist()


def _row_count(path: Path) -> int:
    """Rows of a parquet file, read from its footer (``datasets`` cannot load an empty file)."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def load_split(path: str | Path):
    """A split file as a ``datasets.Dataset`` (what the trainers read)."""
    import datasets

    return datasets.load_dataset("parquet", data_files=str(path), split="train")


# ---------------------------------------------------------------- schema check


def _check_prompt(prompt: Any) -> list[str]:
    if not isinstance(prompt, list) or not prompt:
        return ["prompt must be a non-empty list of messages"]
    errors = []
    for i, message in enumerate(prompt):
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            errors.append(f"prompt[{i}] must have exactly the keys role and content")
        elif message["role"] not in ("system", "user", "assistant"):
            errors.append(f"prompt[{i}].role {message['role']!r} is not system/user/assistant")
        elif not isinstance(message["content"], str) or not message["content"].strip():
            errors.append(f"prompt[{i}].content must be non-empty text")
    if not errors and prompt[-1]["role"] != "user":
        errors.append("the last prompt message must come from the user role")
    return errors


def _check_target(mode: str, target: Any) -> list[str]:
    if not isinstance(target, str) or not target.strip():
        return ["reward_model.ground_truth must be non-empty text"]
    if mode != "verify":
        return []
    try:
        action = json.loads(target)
    except json.JSONDecodeError:
        return ["a verify ground_truth must be the JSON of an action"]
    if not isinstance(action, dict) or set(action) != {"tool", "arguments"}:
        return ["a verify ground_truth must have exactly the keys tool and arguments"]
    return [] if canonical_json(action) == target else ["a verify ground_truth must be canonical JSON"]


def _check_history(history: Any) -> list[str]:
    try:
        messages = json.loads(history)
    except (TypeError, json.JSONDecodeError):
        return ["extra_info.history must be a JSON string"]
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and "role" in m for m in messages
    ):
        return ["extra_info.history must be a JSON list of messages"]
    return []


def _check_uncertainty(extra: dict[str, Any]) -> list[str]:
    values = [extra.get(key) for key in ("au", "eu", "total")]
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
        return ["extra_info.au/eu/total must be finite numbers"]
    au, eu, total = values
    if min(au, eu) < -1e-6:
        return [f"extra_info.au/eu must be >= 0, got au={au} eu={eu}"]
    if abs(au + eu - total) > 1e-4:
        return [f"extra_info.total ({total}) must equal au + eu ({au + eu})"]
    return []


def _check_extra(extra: Any, data_source: Any) -> list[str]:
    if not isinstance(extra, dict) or set(extra) != set(EXTRA_INFO.names):
        missing = sorted(set(EXTRA_INFO.names) - set(extra or {}))
        return [f"extra_info must have the fields {EXTRA_INFO.names}; missing {missing}"]
    errors = []
    if extra["mode"] not in MODES:
        errors.append(f"extra_info.mode {extra['mode']!r} is not one of {MODES}")
    if data_source != f"{DATA_SOURCE_PREFIX}{extra['domain']}":
        errors.append(f"data_source {data_source!r} does not match domain {extra['domain']!r}")
    for key in ("task_id", "trajectory_id", "prompts_version"):
        if not isinstance(extra[key], str) or not extra[key]:
            errors.append(f"extra_info.{key} must be non-empty text")
    for key in ("step", "index", "dropped_messages", "decomposer_calls"):
        if not isinstance(extra[key], int) or extra[key] < 0:
            errors.append(f"extra_info.{key} must be an integer >= 0")
    for key in ("prompt_tokens", "target_tokens"):
        if not isinstance(extra[key], int) or extra[key] < 1:
            errors.append(f"extra_info.{key} must be an integer >= 1")
    if not isinstance(extra["truncated"], bool):
        errors.append("extra_info.truncated must be a boolean")
    return errors + _check_history(extra["history"]) + _check_uncertainty(extra)


def check_row(row: dict[str, Any]) -> list[str]:
    """Everything wrong with one row (empty list: the row is valid)."""
    if not isinstance(row, dict) or set(row) != set(ROW_SCHEMA.names):
        return [f"a row must have exactly the columns {ROW_SCHEMA.names}"]
    reward = row["reward_model"]
    if not isinstance(reward, dict) or reward.get("style") != "rule":
        return ["reward_model must be {'style': 'rule', 'ground_truth': ...}"]
    errors = _check_prompt(row["prompt"]) + _check_extra(row["extra_info"], row["data_source"])
    mode = row["extra_info"].get("mode") if isinstance(row["extra_info"], dict) else None
    return errors + _check_target(mode, reward.get("ground_truth"))


def check_rows(rows: Iterable[dict[str, Any]], where: str = "") -> list[str]:
    """Errors of all rows, each prefixed with ``where`` and the row number."""
    errors = []
    for i, row in enumerate(rows):
        errors.extend(f"{where}row {i}: {error}" for error in check_row(row))
    return errors


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
        errors.extend(check_rows(rows, where=f"{path}: "))
        trajectories[split] = {r["extra_info"]["trajectory_id"] for r in rows if r["extra_info"]}
    shared = set.intersection(*trajectories.values()) if len(trajectories) == 2 else set()
    if shared:
        errors.append(f"trajectories in both splits: {sorted(shared)[:5]} ({len(shared)} in all)")
    return errors
