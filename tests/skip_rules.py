"""A pytest plugin (loaded by tests/conftest.py): where PROUR_NO_SKIP=1 or CI=true a skipped test
fails the run, since a test that cannot run in CI hides a broken setup; what CI leaves out is
deselected with -m in the Makefile's target instead. Elsewhere skips stay skips, counted in the
run's summary."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

NO_SKIP_ENV = ("PROUR_NO_SKIP", "CI")  # .ci/run sets PROUR_NO_SKIP=1; CI services set CI=true


def no_skip() -> bool:
    """Whether a skip is a failure in this run (see NO_SKIP_ENV)."""
    return any(os.environ.get(name, "").lower() in ("1", "true") for name in NO_SKIP_ENV)


def _failed_instead(report: Any, where: str) -> None:
    """Turn a skipped report into a failed one that says why it was skipped."""
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = (
        f"skipped {where} while skips fail the run ({' or '.join(NO_SKIP_ENV)} set): {reason}\n"
        "Fix the setup this test needs, or deselect it with -m in the Makefile's target."
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under NO_SKIP_ENV a skip (pytest.skip, skipif, importorskip in a test or a fixture) fails
    the test; an expected failure (xfail) is left as it is."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail") and no_skip():
        _failed_instead(report, "test")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    """Under NO_SKIP_ENV a module that skips itself at import fails its collection."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and no_skip():
        _failed_instead(report, "module")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say how many tests skipped and that CI would fail them, so a skip is never quiet."""
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if not hasattr(r, "wasxfail")]
    if skipped:
        terminalreporter.write_line(
            f"{len(skipped)} skip(s); in CI (PROUR_NO_SKIP=1) each would fail the run. "
            "`make test-fast` deselects the vLLM and Slurm tests instead.",
            yellow=True,
        )
