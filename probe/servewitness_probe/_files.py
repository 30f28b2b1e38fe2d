"""Hashing a file by its path, for the probe's records made after the fact or off the import
path (the sweeper, the main script, ``.pth`` files, zip archives): what ``_imports`` does not
hash from the very bytes a loader read. Every record carries the file's identity when its
bytes were hashed (``stat``: device, inode, size, mtime_ns, ctime_ns), so the agent can tell
a file changed after the process started (``provenance.file.changed_after_start``)."""

from __future__ import annotations

import hashlib
import os
from typing import Any


def identity_of(s: os.stat_result) -> list[int]:
    """A file's identity as a journal record carries it: dev, ino, size, mtime_ns, ctime_ns."""
    return [s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns]


def identity(path: str) -> list[int] | None:
    """PATH's identity now (None: it cannot be stat'ed)."""
    try:
        return identity_of(os.stat(path))
    except (OSError, ValueError):  # ValueError: a NUL byte in the name
        return None


def hash_file(path: str) -> tuple[str, int, list[int]] | None:
    """(sha256 hex, size, identity) of the file at PATH, or None when it cannot be read. The
    identity is the descriptor's, before and after the read; a file that changed meanwhile is
    read again (once), so the identity recorded is that of the bytes hashed."""
    for _ in range(2):
        h = hashlib.sha256()
        size = 0
        try:
            with open(path, "rb") as f:
                before = identity_of(os.fstat(f.fileno()))
                while chunk := f.read(1 << 20):
                    h.update(chunk)
                    size += len(chunk)
                after = identity_of(os.fstat(f.fileno()))
        except (OSError, ValueError):
            return None
        if after == before:
            break
    return h.hexdigest(), size, after


def file_record(path: str, kind: str, module: str | None, at: str) -> dict[str, Any]:
    """A ``file`` journal record of PATH hashed now, with its identity (``sha256`` None and
    ``error`` when it cannot be read)."""
    rec: dict[str, Any] = {"k": "file", "path": path, "kind": kind, "module": module, "at": at}
    got = hash_file(path)
    if got is None:
        rec.update({"sha256": None, "size": -1, "error": "unreadable"})
    else:
        rec.update({"sha256": got[0], "size": got[1], "stat": got[2]})
    return rec
