"""A pytest plugin (loaded by tests/conftest.py): the on-disk caches of datasets, matplotlib and
hypothesis go into the session's temp folder, not under ``~/.cache`` or the checkout; the
subprocesses the tests start inherit the variables."""

from __future__ import annotations

import os
import sys

import pytest

# Where each library that caches on disk is told to write, as (environment variable, folder under
# the session's temp folder). Each variable is read when its library is first imported or first
# writes, which in this test suite happens after pytest_configure.
CACHE_DIRS = {
    "HF_DATASETS_CACHE": "hf-datasets",  # datasets.load_dataset's Arrow copies (prour.data.dataset)
    "MPLCONFIGDIR": "matplotlib",  # matplotlib's font list and config
    "HYPOTHESIS_STORAGE_DIRECTORY": "hypothesis",  # hypothesis's example database
}
# Libraries that fix their cache folder at import: imported before pytest_configure below, they
# would still write under the home folder or the checkout.
CACHE_READ_AT_IMPORT = ("datasets", "matplotlib")


@pytest.hookimpl(trylast=True)  # after the tmpdir plugin has made config._tmp_path_factory
def pytest_configure(config: pytest.Config) -> None:
    """Point each cache of CACHE_DIRS into the session's temp folder."""
    early = [name for name in CACHE_READ_AT_IMPORT if name in sys.modules]
    if early:
        raise pytest.UsageError(
            f"{', '.join(early)} imported before tests/session_caches.py set its cache folder: "
            "a plugin or sitecustomize imports it; run pytest without that plugin"
        )
    base = config._tmp_path_factory.getbasetemp() / "caches"
    for name, folder in CACHE_DIRS.items():
        (base / folder).mkdir(parents=True, exist_ok=True)
        os.environ[name] = str(base / folder)
