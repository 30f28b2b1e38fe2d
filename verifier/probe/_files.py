"""Hashing a file by its path, for the probe's records made after the fact or off the import
path (the sweeper, the main script, ``.pth`` files, zip archives): what ``_imports`` does not
hash from the very bytes a loader read."""

from __future__ import annotations

import hashlib
import os
from typing import Any


def hash_file(path: str) -> tuple[str, int] | None:
    """(sha256 hex, size) of the file at PATH, or None when it cannot be read."""
    h = hashlib.sha256()
    size = 0
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
                size += len(chunk)
    except (OSError, ValueError):  # ValueError: a NUL byte in the name
        return None
    return h.hexdigest(), size


def identity(path: str) -> tuple[int, int, int, int]:
    """(device, inode, size, mtime_ns) of PATH now; (0, 0, -1, 0) when it cannot be read."""
    try:
        s = os.stat(path)
        return (s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns)
    except (OSError, ValueError):
        return (0, 0, -1, 0)


def file_record(path: str, kind: str, module: str | None, at: str) -> dict[str, Any]:
    """A ``file`` journal record of PATH hashed now (``sha256`` None and ``error`` when it
    cannot be read)."""
    rec: dict[str, Any] = {"k": "file", "path": path, "kind": kind, "module": module, "at": at}
    got = hash_file(path)
    if got is None:
        rec.update({"sha256": None, "size": -1, "error": "unreadable"})
    else:
        rec.update({"sha256": got[0], "size": got[1]})
    return rec
