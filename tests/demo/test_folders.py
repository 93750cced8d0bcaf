"""Reuse of built folders (prour.demo.folders): markers, staging, and a concurrent builder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prour.demo.folders import build_folder, read_marker

MARKER = "built.json"


def _writer(args: dict, calls: list[Path], race: dict | None = None):
    """A build that writes one file and the marker; ``race`` first publishes a rival build."""

    def write(folder: Path) -> None:
        calls.append(folder)
        if race is not None:
            rival = folder.parent / "out"
            rival.mkdir()
            (rival / "weights").write_text("rival")
            (rival / MARKER).write_text(json.dumps(race))
        (folder / "weights").write_text(json.dumps(args))
        (folder / MARKER).write_text(json.dumps(args))

    return write


def test_same_arguments_reuse_the_folder_and_new_ones_rebuild_it(tmp_path: Path):
    calls: list[Path] = []
    out = tmp_path / "out"
    assert build_folder(out, MARKER, {"a": 1}, _writer({"a": 1}, calls), "test build") == out
    assert build_folder(out, MARKER, {"a": 1}, _writer({"a": 1}, calls), "test build") == out
    assert len(calls) == 1
    build_folder(out, MARKER, {"a": 2}, _writer({"a": 2}, calls), "test build")
    assert len(calls) == 2 and read_marker(out, MARKER) == {"a": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # staging removed


def test_marker_key_compares_one_entry(tmp_path: Path):
    out = tmp_path / "out"
    out.mkdir()
    (out / MARKER).write_text(json.dumps({"args": {"a": 1}, "stats": {"loss": 0.5}}))
    calls: list[Path] = []
    build_folder(out, MARKER, {"a": 1}, _writer({"a": 1}, calls), "test build", key="args")
    assert calls == []


def test_a_rival_build_of_the_same_arguments_is_kept(tmp_path: Path):
    calls: list[Path] = []
    out = tmp_path / "out"
    build_folder(out, MARKER, {"a": 1}, _writer({"a": 1}, calls, race={"a": 1}), "test build")
    assert (out / "weights").read_text() == "rival"


def test_a_rival_build_of_other_arguments_is_replaced(tmp_path: Path):
    calls: list[Path] = []
    out = tmp_path / "out"
    build_folder(out, MARKER, {"a": 1}, _writer({"a": 1}, calls, race={"a": 0}), "test build")
    assert json.loads((out / "weights").read_text()) == {"a": 1}


def test_a_foreign_folder_is_never_overwritten(tmp_path: Path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"holds no test build \(built.json missing\)"):
        build_folder(out, MARKER, {"a": 1}, _writer({"a": 1}, []), "test build")
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
