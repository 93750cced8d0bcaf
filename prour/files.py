"""The two ways prour writes a file, and the only ones (tests/test_architecture.py holds that):

- :func:`write_atomic` replaces a file whole: readers see the old content or the new, never half
  of either (results tables, plots, datasets, markers, manifests, scripts);
- :func:`append_jsonl` adds one record to a JSONL log that a rerun resumes from (trajectories,
  results, caches, training metrics): one write of the whole line, then fsync;
  :func:`repair_torn_tail` cuts off the line a crash left half-written before a rerun appends.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Read once at import (os.umask can only be read by setting it): a replaced file gets the mode a
# plain open() would give it, not mkstemp's owner-only 0600.
_UMASK = os.umask(0o022)
os.umask(_UMASK)


def write_atomic(path: str | Path, data: str | bytes, fsync: bool = False) -> Path:
    """Write ``data`` (text, or bytes as they are) to ``path`` through a temporary file beside it
    and a rename; ``fsync`` flushes it to disk first (a file a crash must not lose). The
    temporary file never outlives a failed write."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as handle:
            handle.write(data)
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise named(exc, path) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def named(exc: OSError, path: Path) -> OSError:
    """``exc`` carrying the file it was writing (a failed ``write``/``fsync`` names none), so a
    full or read-only disk is reported with the file (:mod:`prour.cli.failures`)."""
    if exc.filename is not None or exc.errno is None:
        return exc
    return type(exc)(exc.errno, exc.strerror, str(path))


_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _path_lock(path: Path) -> threading.Lock:
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(str(path.resolve()), threading.Lock())


def append_jsonl(path: str | Path, record: Any) -> None:
    """Append one record (a dict, or a pydantic model) as one line: a single write, then fsync.

    Threads share a per-file lock and processes an ``flock``; if the file ends in a torn line
    (a crash mid-write), the new record starts on a fresh line so it stays readable.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    dump = getattr(record, "model_dump_json", None)
    text = dump() if callable(dump) else json.dumps(record)
    if "\n" in text:
        raise ValueError(f"{path}: a JSONL record must serialise to one line")
    data = (text + "\n").encode("utf-8")
    with _path_lock(path):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if _ends_torn(path):
                data = b"\n" + data
            written = os.write(fd, data)
            if written != len(data):  # the disk filled up mid-line
                raise OSError(errno.ENOSPC, f"short write ({written} of {len(data)} bytes)",
                              str(path))
            os.fsync(fd)
        except OSError as exc:
            raise named(exc, path) from None
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def repair_torn_tail(path: str | Path, redone: str = "its record is written again") -> int:
    """Before a rerun appends to a JSONL log again: a last line left without its newline by a
    crash mid-append, and not a JSON object, is cut off, with a warning that ends in ``redone``
    (what the rerun does instead); a complete object without its newline (an editor's last line)
    gets one. Returns the bytes cut (0: nothing torn, or no file)."""
    path = Path(path)
    if not path.is_file():
        return 0
    with _path_lock(path), open(path, "r+b") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            if not _ends_torn(path):
                return 0
            data = handle.read()
            start = data.rfind(b"\n") + 1
            try:
                whole = isinstance(json.loads(data[start:]), dict)
            except ValueError:
                whole = False
            if whole:
                handle.write(b"\n")
                cut = 0
            else:
                handle.truncate(start)
                cut = len(data) - start
                logger.warning("repaired %s: cut off a last line torn by a crash (%d bytes); %s",
                               path, cut, redone)
            handle.flush()
            os.fsync(handle.fileno())
            return cut
        except OSError as exc:
            raise named(exc, path) from None
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _ends_torn(path: Path) -> bool:
    """True when the file is non-empty and its last byte is not a newline."""
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        if handle.tell() == 0:
            return False
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) != b"\n"


def file_sha256(path: str | Path) -> str:
    """The sha256 hex digest of a file's bytes, read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
