"""``prour tiny-model PATH``: the tiny Qwen3 the CPU recipes serve, built by a command (no file
made by hand), with the position limit tau2's retail prompts need, reused when built alike."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from prour.cli.main import app


def test_tiny_model_builds_the_served_model_once(tmp_path: Path) -> None:
    folder = tmp_path / "models" / "tiny"
    first = CliRunner().invoke(app, ["tiny-model", str(folder), "--no-warm-start"])
    assert first.exit_code == 0, first.output
    assert "tiny model ready in" in first.output and str(folder) in first.output
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["max_position_embeddings"] == 16384
    assert (folder / "tokenizer.json").is_file() and list(folder.glob("*.safetensors"))
    weights = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    again = CliRunner().invoke(app, ["tiny-model", str(folder), "--no-warm-start"])
    assert again.exit_code == 0, again.output
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == weights  # reused
    other = tmp_path / "taken"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    refused = CliRunner().invoke(app, ["tiny-model", str(other), "--no-warm-start"])
    assert refused.exit_code == 2 and "is not empty" in refused.output
