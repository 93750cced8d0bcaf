"""The plot helpers the training and evaluation reports share (prour/plots.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from plot_check import read_plot

from prour.plots import padded_limits, pyplot, save_plot


def test_padded_limits() -> None:
    assert padded_limits([2.0, 4.0], min_span=1.0) == (pytest.approx(1.84), pytest.approx(4.16))
    assert padded_limits([3.0], min_span=1.0) == (2.5, 3.5)
    assert padded_limits([0.5], min_span=4.0, bounds=(0.0, 100.0)) == (0.0, 4.0)
    assert padded_limits([99.0], min_span=4.0, bounds=(0.0, 100.0)) == (96.0, 100.0)
    assert padded_limits([], min_span=2.0, bounds=(0.0, 100.0)) == (0.0, 2.0)


def test_save_plot_writes_the_png_and_what_was_drawn(tmp_path: Path) -> None:
    fig, ax = pyplot().subplots()
    ax.plot([1, 2], [3, 5])
    ax.set(title="t", xlabel="x", ylabel="y", xlim=(0, 4), ylim=(2, 6))
    out = save_plot(fig, tmp_path / "sub" / "p.png", {"line": {"x": [1, 2], "y": [3, 5]}})
    assert out == tmp_path / "sub" / "p.png"
    drawn = read_plot(out)
    assert drawn["series"] == {"line": {"x": [1, 2], "y": [3, 5]}}
    assert drawn["axes"] == [{"title": "t", "xlabel": "x", "ylabel": "y", "xlim": [0.0, 4.0],
                              "ylim": [2.0, 6.0]}]
