"""The test session's own rules: caches stay in pytest's temp folder (tests/session_caches.py),
and with PROUR_NO_SKIP=1 or CI=true a skipped test fails the run while elsewhere it stays a skip
(tests/skip_rules.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from session_caches import CACHE_DIRS
from skip_rules import NO_SKIP_ENV

# One of each way to skip: in the test, by a mark, in a fixture, by a failed import; an xfail
# stays an xfail (the test ran), a pass a pass.
PLANTED = '''
import pytest

@pytest.fixture
def missing():
    pytest.skip("no such service")

def test_skips():
    pytest.skip("not here")

@pytest.mark.skipif(True, reason="marked")
def test_marked():
    pass

def test_fixture(missing):
    pass

def test_import():
    pytest.importorskip("no_such_module_anywhere")

@pytest.mark.xfail(reason="known", strict=True)
def test_known():
    assert False

def test_passes():
    pass
'''
SKIPPED_MODULE = '''
import pytest

pytest.skip("whole module", allow_module_level=True)
'''


def test_caches_live_in_the_session_temp_folder(tmp_path_factory: pytest.TempPathFactory):
    import datasets.config
    import matplotlib
    from hypothesis.configuration import storage_directory

    base = tmp_path_factory.getbasetemp()
    assert set(CACHE_DIRS) == {"HF_DATASETS_CACHE", "MPLCONFIGDIR", "HYPOTHESIS_STORAGE_DIRECTORY"}
    for name in CACHE_DIRS:
        assert Path(os.environ[name]).is_relative_to(base), name
    assert Path(datasets.config.HF_DATASETS_CACHE).is_relative_to(base)
    assert Path(matplotlib.get_cachedir()).is_relative_to(base)
    assert storage_directory("examples", intent_to_write=False).path.is_relative_to(base)


@pytest.mark.parametrize("no_skip", [True, False])
def test_a_skip_fails_only_where_skips_are_refused(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, no_skip: bool
):
    for name in NO_SKIP_ENV:
        monkeypatch.delenv(name, raising=False)
    if no_skip:
        monkeypatch.setenv("PROUR_NO_SKIP", "1")
    pytester.makepyfile(test_planted=PLANTED, test_skipped_module=SKIPPED_MODULE)
    result = pytester.runpytest_inprocess("-p", "skip_rules", "-p", "no:cacheprovider", "-rA",
                                          "--continue-on-collection-errors")
    if no_skip:
        result.assert_outcomes(passed=1, failed=2, xfailed=1, errors=3)  # setup-time skips: errors
        result.stdout.fnmatch_lines(["*skipped module while skips fail the run*whole module*",
                                     "*skipped test while skips fail the run*not here*"])
    else:
        result.assert_outcomes(passed=1, skipped=5, xfailed=1)
        result.stdout.fnmatch_lines(["5 skip(s); in CI (PROUR_NO_SKIP=1)*"])
