"""The documentation builds: MkDocs in strict mode (a broken link or anchor, a page left out of
the nav fails), README.md stays a front door of at most 250 lines, and its links lead to files."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MKDOCS = Path(sys.executable).parent / "mkdocs"  # the venv's, installed by the `dev` extra
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_mkdocs_builds_the_docs_without_a_warning(tmp_path):
    assert MKDOCS.is_file(), f"{MKDOCS} is missing: run `make install-dev` (the dev extra)"
    result = subprocess.run([str(MKDOCS), "build", "--strict", "-d", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    assert (tmp_path / "site" / "reliability" / "index.html").is_file()


def test_the_readme_has_at_most_250_lines():
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= 250, f"README.md has {lines} lines (at most 250): move detail into docs/"


def test_the_readme_links_lead_to_files():
    targets = LINK.findall(README.read_text(encoding="utf-8"))
    assert targets, "README.md links to no docs page"
    missing = [target for target in targets
               if "://" not in target and not (ROOT / target).exists()]
    assert not missing, f"README.md links to missing files: {missing}"
