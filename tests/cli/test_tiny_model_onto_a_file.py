"""``prour tiny-model PATH`` where PATH (or a folder above it) is a file: one error line naming
it, exit 2, and nothing built beside it (no half-built ``PATH-base`` folder left behind)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from prour.cli.main import app


@pytest.mark.parametrize("below, warm", [(False, True), (False, False), (True, True)])
def test_tiny_model_onto_a_file_is_refused_before_anything_is_built(tmp_path: Path, below: bool,
                                                                     warm: bool) -> None:
    file = tmp_path / "model"
    file.write_text("not a folder")
    target = file / "sub" if below else file
    result = CliRunner().invoke(app, ["tiny-model", str(target),
                                      "--warm-start" if warm else "--no-warm-start"])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    expected = f"error: {file} is a file, not a folder; pick a new or empty folder for the tiny model"
    assert errors == [expected], result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no model-base, no staging
    assert file.read_text() == "not a folder"
