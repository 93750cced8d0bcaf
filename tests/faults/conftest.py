"""The fault cells reuse the scripted data world of the stage tests (tests/data)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
