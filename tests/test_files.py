"""The shared writers: a file replaced whole (text or bytes, plain-open permissions, no temp file
left by a failure) and the append-only JSONL log (one line per record, a torn tail skipped)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from prour.files import append_jsonl, write_atomic


def test_write_atomic_replaces_text_and_bytes_with_a_plain_files_permissions(tmp_path: Path) -> None:
    mask = os.umask(0o022)
    os.umask(mask)
    target = tmp_path / "deep" / "out.bin"
    write_atomic(target, "old\n")
    write_atomic(target, b"\x00\xffnew")
    assert target.read_bytes() == b"\x00\xffnew"
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~mask
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.bin"]


def test_a_failed_write_keeps_the_old_file_and_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    write_atomic(target, "kept\n")
    with pytest.raises(TypeError):
        write_atomic(target, 3)  # type: ignore[arg-type]
    assert target.read_text() == "kept\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_append_jsonl_adds_one_line_per_record_and_starts_fresh_after_a_torn_tail(
        tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    append_jsonl(log, {"i": 1, "text": "é"})
    with open(log, "ab") as handle:  # a crash cut the next record short
        handle.write(b'{"i": 2, "te')
    append_jsonl(log, {"i": 3})
    lines = log.read_bytes().split(b"\n")
    assert json.loads(lines[0]) == {"i": 1, "text": "é"}
    assert lines[1] == b'{"i": 2, "te'
    assert json.loads(lines[2]) == {"i": 3} and lines[3] == b""
    with pytest.raises(ValueError, match="one line"):
        append_jsonl(log, type("Multi", (), {"model_dump_json": lambda self: "a\nb"})())


def test_repair_torn_tail_cuts_a_half_line_and_ends_a_whole_one(tmp_path: Path) -> None:
    """A crash mid-append leaves half a record without its newline: it is cut off, the records
    before it kept byte for byte. A whole record without its newline (an editor's) gets one."""
    from prour.files import repair_torn_tail

    path = tmp_path / "log.jsonl"
    assert repair_torn_tail(path) == 0  # no file: nothing to do
    good = b'{"key": "a"}\n{"key": "b"}\n'
    path.write_bytes(good + b'{"key": "c", "val')
    assert repair_torn_tail(path) == len(b'{"key": "c", "val')
    assert path.read_bytes() == good
    assert repair_torn_tail(path) == 0 and path.read_bytes() == good
    path.write_bytes(good + b'{"key": "c"}')
    assert repair_torn_tail(path) == 0
    assert path.read_bytes() == good + b'{"key": "c"}\n'
    path.write_bytes(b'{"key"')  # the first record torn: the file left empty
    assert repair_torn_tail(path) == 6 and path.read_bytes() == b""
