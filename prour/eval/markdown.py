"""Pieces the evaluation report and the attention tables both write: markdown table lines,
interval cells in percent, and report data made ready for ``json.dumps``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from prour.eval.stats import BootstrapResult


def pct(result: BootstrapResult) -> str:
    """``estimate [low, high]`` in percent, two decimals."""
    return f"{100 * result.estimate:.2f} [{100 * result.low:.2f}, {100 * result.high:.2f}]"


def table_row(cells: Sequence[Any]) -> str:
    """One markdown table line: ``| a | b |``."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A markdown table: header, rule, one line per row."""
    return [table_row(header), table_row(["---"] * len(header)), *(table_row(r) for r in rows)]


def jsonable(value: Any) -> Any:
    """Dataclass dumps with NaN as None and int keys as strings (valid JSON)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
