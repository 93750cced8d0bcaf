"""Plot helpers the training and evaluation reports share: matplotlib on the Agg backend (imported
inside :func:`pyplot`), axis limits that stay readable, the marker cycle, and :func:`save_plot`.

Every plot is written with a sidecar ``<name>.json`` next to the PNG: the series as drawn
(x, y and error-bar extents per label) and each panel's axis limits, so a test or a reader can
check what the picture shows without reading pixels.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prour.files import write_atomic

MARKERS = ("o", "s", "D", "^", "v", "P", "X", "<", ">", "h")


def padded_limits(values: Sequence[float], min_span: float, pad: float = 0.08,
                  bounds: tuple[float, float] | None = None) -> tuple[float, float]:
    """Axis limits around ``values``: ``pad`` × span on each side, widened symmetrically to at
    least ``min_span`` (so equal values do not give a hair-thin axis), then clipped to ``bounds``
    (e.g. (0, 100) for percentages), widening on the other side to keep ``min_span``."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not finite:
        finite = [bounds[0] if bounds else 0.0]
    low, high = min(finite), max(finite)
    margin = pad * (high - low)
    low, high = low - margin, high + margin
    if high - low < min_span:
        middle = (low + high) / 2
        low, high = middle - min_span / 2, middle + min_span / 2
    if bounds is not None:
        low, high = max(low, bounds[0]), min(high, bounds[1])
        if high - low < min_span:  # clipped on one side: widen on the other
            if low == bounds[0]:
                high = min(bounds[1], low + min_span)
            else:
                low = max(bounds[0], high - min_span)
    return low, high


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_plot(fig: Any, out: str | Path, series: Mapping[str, Any]) -> Path:
    """Write the PNG and its sidecar JSON (``series`` plus every panel's title and limits)."""
    out = Path(out)
    image = io.BytesIO()
    fig.savefig(image, format=out.suffix.lstrip(".") or "png", dpi=120, bbox_inches="tight")
    write_atomic(out, image.getvalue())
    axes = [{"title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
             "xlim": list(ax.get_xlim()), "ylim": list(ax.get_ylim())} for ax in fig.axes]
    sidecar = {"png": out.name, "series": series, "axes": axes}
    write_atomic(out.with_suffix(".json"), json.dumps(sidecar, indent=2) + "\n")
    pyplot().close(fig)
    return out
