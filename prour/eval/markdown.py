"""Pieces every evaluation report writes: markdown tables and escaped text (:func:`md`,
:func:`table`: defined once in :mod:`prour.markdown`, where every stage's report finds them, and
re-exported here), interval cells in percent, and report data made ready for ``json.dumps``."""

from __future__ import annotations

import math
from typing import Any

from prour.eval.stats import BootstrapResult
from prour.markdown import md, table, table_row

__all__ = ["jsonable", "md", "pct", "table", "table_row"]


def pct(result: BootstrapResult) -> str:
    """``estimate [low, high]`` in percent, two decimals."""
    return f"{100 * result.estimate:.2f} [{100 * result.low:.2f}, {100 * result.high:.2f}]"


def jsonable(value: Any) -> Any:
    """Dataclass dumps with NaN as None and int keys as strings (valid JSON)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
