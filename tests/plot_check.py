"""Read a written plot back: the PNG decodes to a picture of real size, and its sidecar JSON
(see :mod:`prour.plots`) gives the series and axis limits that were drawn."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from PIL import Image


def read_plot(png: Path, min_pixels: tuple[int, int] = (300, 200)) -> dict[str, Any]:
    """The sidecar of ``png`` after checking the PNG decodes, is at least ``min_pixels`` wide
    and high, and is not one flat colour."""
    with Image.open(png) as image:
        assert image.format == "PNG"
        width, height = image.size
        assert width >= min_pixels[0] and height >= min_pixels[1], image.size
        low, high = image.convert("L").getextrema()
        assert high - low > 100, "the picture is (nearly) one flat colour"
    sidecar = json.loads(png.with_suffix(".json").read_text())
    assert sidecar["png"] == png.name
    return sidecar
