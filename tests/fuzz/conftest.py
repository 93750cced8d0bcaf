"""The fuzzers' settings: two Hypothesis profiles and the fixture that picks one.

Every fuzz test takes the ``fuzz`` fixture, a ``hypothesis.settings`` object it decorates its
property with. The fixture is parametrized twice: ``ci`` (:data:`CI_EXAMPLES` examples per test,
derandomized so that a CI run is the same run every time) and ``full`` (:data:`FULL_EXAMPLES`
examples, random; marked ``full``, so ``make test`` and CI deselect it and ``make test-full``
runs it). ``PROUR_FUZZ_EXAMPLES=N`` overrides both counts for a run by hand.

Figures are still drawn by every reader that draws them, but not rasterized: ``savefig`` writes a
PNG signature instead (a report's plots cost seconds each and are no reader of user files).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).parent))  # readers.py, the shared property

CI_EXAMPLES = 25
FULL_EXAMPLES = 200
_override = os.environ.get("PROUR_FUZZ_EXAMPLES")
_SLOW = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture,
         HealthCheck.filter_too_much]

settings.register_profile(
    "prour-fuzz-ci", max_examples=int(_override or CI_EXAMPLES), deadline=None,
    derandomize=True, database=None, suppress_health_check=_SLOW, print_blob=True)
settings.register_profile(
    "prour-fuzz-full", max_examples=int(_override or FULL_EXAMPLES), deadline=None,
    suppress_health_check=_SLOW, print_blob=True)


@pytest.fixture(params=["ci", pytest.param("full", marks=pytest.mark.full)])
def fuzz(request: pytest.FixtureRequest) -> settings:
    """The Hypothesis settings of this run: ``ci`` or ``full`` (module docstring)."""
    return settings.get_profile(f"prour-fuzz-{request.param}")


@pytest.fixture(autouse=True)
def _figures_not_rasterized(monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    def signature_only(self, fname, *args, **kwargs) -> None:
        if hasattr(fname, "write"):
            fname.write(b"\x89PNG\r\n\x1a\n")
        else:
            Path(fname).write_bytes(b"\x89PNG\r\n\x1a\n")

    monkeypatch.setattr(Figure, "savefig", signature_only)


@pytest.fixture(autouse=True)
def _no_models_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROUR_MODELS_DIR", raising=False)
