"""A file the agent keeps in its state directory to save time across its restarts (compile
verdicts, judgements): one JSON document, written atomically (a temporary file, then
``os.replace``), its first line the sha256 of the rest. A file that cannot be read, is larger
than its bound, or whose digest does not match (truncated, edited) is not used at all, with a
log line; the caller checks the document's format and ignores it whole when that is wrong.
Never trusted in part, and never raises: such a file only saves time.

The digest is no MAC: whoever can write the state directory can write a valid file, as they
can write the reports spooled beside it (docs/threat-model.md).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, TypeVar

import structlog

log = structlog.get_logger(__name__)

K = TypeVar("K")
V = TypeVar("V")

MAX_BYTES = 64 << 20  # a file larger than this is not read (the stores hold a few MB at most)


def load(path: Path, event: str) -> Any:
    """The JSON document PATH holds, or None: no file (quietly), or one that cannot be read,
    is over MAX_BYTES (not read past that), has a digest that does not match or is no JSON
    (each logged as ``<EVENT>_ignored`` with its reason)."""
    max_bytes = MAX_BYTES
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except FileNotFoundError:
        return None
    except OSError as e:
        log.warning(f"{event}_ignored", path=str(path), reason=str(e))
        return None
    if len(data) > max_bytes:
        log.warning(f"{event}_ignored", path=str(path), reason="too large")
        return None
    digest, _, body = data.partition(b"\n")
    if digest != hashlib.sha256(body).hexdigest().encode():
        log.warning(f"{event}_ignored", path=str(path), reason="digest mismatch")
        return None
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as e:  # json.JSONDecodeError, nesting
        log.warning(f"{event}_ignored", path=str(path), reason=str(e))
        return None


def save(path: Path, doc: dict[str, Any], event: str) -> bool:
    """Write DOC to PATH atomically; whether it was written (a failure is logged as
    ``<EVENT>_unwritable``, never raised)."""
    body = json.dumps(doc, separators=(",", ":")).encode()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        log.warning(f"{event}_unwritable", path=str(path), error=str(e))
        tmp.unlink(missing_ok=True)
        return False
    return True


def put_bounded(items: dict[K, V], key: K, value: V, limit: int) -> None:
    """ITEMS[KEY] = VALUE as the most recent entry, the least recent ones dropped past LIMIT
    (a store's memory: insertion order is recency)."""
    items.pop(key, None)
    items[key] = value
    while len(items) > limit:
        del items[next(iter(items))]
