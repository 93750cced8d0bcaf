"""Hypothesis strategies of JSONL files: good records of each kind, then per line a mutation (a
field dropped, a field set to a value of any JSON type, the line replaced by bytes that are no
JSON object, the file's last newline cut), so that most files are near-valid and reach deep."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

# Text that must stay text wherever a report quotes it (HTML, table delimiters, line breaks).
NAMES = ("prour", "base", "<script>alert(1)</script>", "a|b", "x\ny", "é ü", "`tick`", "&amp;")

JSON_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 10**15),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
    st.lists(st.integers(-2, 2), max_size=3),
    st.dictionaries(st.text(max_size=6), st.integers(-2, 2) | st.text(max_size=3), max_size=3))

GARBAGE = st.one_of(
    st.sampled_from([b"{", b"[1, 2]", b'"text"', b"null", b"\xff\xfe{}", b'{"key": 1',
                     b"NaN", b"{}}", b"{\"a\": 1}\r", b"\x00"]),
    st.binary(max_size=24).filter(lambda raw: b"\n" not in raw))


def mutation(fields: tuple[str, ...]) -> st.SearchStrategy[Any]:
    """None (the line as it is, half the time), or a drop / set / garbage of one line."""
    return st.one_of(
        st.none(), st.none(),
        st.tuples(st.just("drop"), st.sampled_from(fields)),
        st.tuples(st.just("set"), st.sampled_from(fields), JSON_VALUES),
        st.tuples(st.just("garbage"), GARBAGE))


def apply(record: dict[str, Any], change: Any) -> bytes:
    """One line of the file (no newline) after ``change``."""
    if change is None:
        return json.dumps(record).encode()
    if change[0] == "drop":
        return json.dumps({k: v for k, v in record.items() if k != change[1]}).encode()
    if change[0] == "set":
        return json.dumps({**record, change[1]: change[2]}).encode()
    return change[1]


def jsonl(lines: list[bytes], torn: bool) -> bytes:
    """The file: lines joined by newlines; ``torn`` cuts the last newline (a crash mid-write)."""
    data = b"".join(line + b"\n" for line in lines)
    return data[:-1] if torn and data else data
