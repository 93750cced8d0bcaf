"""Baseline tests share the scripted world of ``tests/eval`` (eval_world.py, method_run.py)."""

from __future__ import annotations

import sys
from pathlib import Path

EVAL_TESTS = str(Path(__file__).resolve().parents[1])
if EVAL_TESTS not in sys.path:
    sys.path.insert(0, EVAL_TESTS)
