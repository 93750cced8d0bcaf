"""A JSONL cache of decomposer decisions, so extraction can stop and resume without redoing any.

A decision is keyed by the sha256 of everything it depends on: the decomposer model id, the
decomposer's sampling settings, the dialogue and the seed. Routing thresholds are *not* part of
the key: the cache keeps AU/EU, and the route is recomputed from them, so a recalibration reuses
every cached decision.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from prour.config.router import RouterConfig
from prour.env.trajectory import read_jsonl
from prour.files import append_jsonl, repair_torn_tail
from prour.llm.base import Message

log = logging.getLogger(__name__)

ROUTING_ONLY_FIELDS = {
    "tau_au", "tau_eu", "thresholds_file", "empty_route", "budget", "every_n", "calibration",
    "llm_router_fallback", "llm_router_temperature", "llm_router_max_tokens",
}


def decomposer_fingerprint(router: RouterConfig) -> dict[str, Any]:
    """The router settings that change what the decomposer outputs (not how it routes)."""
    return router.model_dump(exclude=ROUTING_ONLY_FIELDS)


def decision_key(model_id: str, fingerprint: dict[str, Any], history: Sequence[Message],
                 seed: int | None) -> str:
    """sha256 of (model id, sampling settings, dialogue, seed) as canonical JSON."""
    payload = json.dumps([model_id, fingerprint, list(history), seed], sort_keys=True,
                         ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def decomposer_calls(model_calls: dict[str, int]) -> tuple[int, int]:
    """(backend calls, model requests) of one decision: batched calls, and the K(L+2)-style count
    of sequences sampled plus sequences scored."""
    calls = int(model_calls.get("chat_calls", 0)) + int(model_calls.get("score_calls", 0))
    requests = int(model_calls.get("generated", 0)) + int(model_calls.get("score_requests", 0))
    return calls, requests


class DecisionCache:
    """Decisions by key, loaded from and appended to one JSONL file."""

    def __init__(self, path: str | Path, on_bad_line: Literal["error", "skip"]):
        self.path = Path(path)
        self.records: dict[str, dict[str, Any]] = {}
        self.skipped_lines: list[int] = []
        repair_torn_tail(self.path, "its decision is made again")
        if self.path.is_file():
            rows = read_jsonl(self.path, on_error="raise" if on_bad_line == "error" else "skip")
            self.skipped_lines = list(rows.skipped)
            for row in rows:
                if not (isinstance(row.get("key"), str) and isinstance(row.get("decision"), dict)):
                    raise ValueError(  # noqa: TRY004 - bad content, reported like a corrupt line
                        f"{self.path}: a record without key/decision: {str(row)[:120]}")
                self.records[row["key"]] = row
        self.hits = 0

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored record for ``key`` (counts a hit), or None."""
        found = self.records.get(key)
        self.hits += found is not None
        return found

    def put(self, key: str, record: dict[str, Any]) -> dict[str, Any]:
        """Store and append one record (``key`` is added to it)."""
        record = {"key": key, **record}
        append_jsonl(self.path, record)
        self.records[key] = record
        return record
