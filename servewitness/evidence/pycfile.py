"""One cached ``.pyc`` file (PEP 552): reading its header, and whether its code is what its
source compiles to.

A pyc starts with a 16-byte header: the magic number of the Python that wrote it, flags (0:
timestamp; 1: unchecked hash; 3: checked hash), then the source's mtime and size or a hash
of the source. ``compare`` compiles a source and compares the code with a pyc's; what it
finds is kept in a ``CompileCache`` under both files' identity (path, device, inode, size,
mtime, ctime), since a file whose bytes changed changed its ctime.
"""

from __future__ import annotations

import _imp
import errno
import hashlib
import marshal
import os
import sys
import warnings
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from types import CodeType

from servewitness.evidence.regular import NotRegular, open_file, open_regular

HEADER = 16  # magic (4), flags (4), then mtime and size (4 + 4) or the source hash (8)
FLAG_HASH = 0b01
FLAG_CHECK = 0b10
_U32 = 0xFFFFFFFF

# A compile-and-compare outcome: None, the pyc holds what the source compiles to; (True, why):
# other code, WHY empty or " (…)"; (False, why): it cannot be told, WHY says why.
Outcome = tuple[bool, str] | None
Identity = tuple[str, int, int, int, int, int]  # path, dev, ino, size, mtime_ns, ctime_ns


@dataclass(frozen=True, slots=True)
class Checked:
    """What comparing one loaded pyc with its source found, as cached. LOADED: the pyc still
    held the bytes the process loaded (when False nothing else was looked at: a pyc changed
    since load is the cross-check's to report). OUTCOME: as ``compare`` returns it.
    SOURCE_SHA256: of the source bytes compared (hex), when they were read. HASH_MATCHES:
    whether a hash-based pyc's header holds the hash of those bytes (None: not hash-based, or
    not read)."""

    loaded: bool
    outcome: Outcome = None
    source_sha256: str | None = None
    hash_matches: bool | None = None


def cache_key(pyc: Identity, source: Identity, optimize: int, loaded_sha256: str) -> bytes:
    """The key of one comparison: both files' identity (paths as the process sees them, so
    that the processes of one container share it), the optimization level compiled at, and
    the sha256 the process loaded the pyc with. 16 bytes, to keep the cache small."""
    text = repr((pyc, source, optimize, loaded_sha256)).encode(errors="backslashreplace")
    return hashlib.blake2b(text, digest_size=16).digest()


class CompileCache:
    """Comparisons keyed by ``cache_key``: a file whose bytes changed changed its ctime, so a
    rescan of unchanged files costs a lookup. Bounded to LIMIT entries (0: caches nothing):
    when full, the older half is dropped. An entry takes about 300 bytes (``footprint``), so
    the default limit, several times the pycs of a vLLM container, bounds it near 20 MB."""

    def __init__(self, limit: int = 1 << 16) -> None:
        self.limit = limit
        self._checked: dict[bytes, Checked] = {}

    def get(self, key: bytes) -> Checked | None:
        return self._checked.get(key)

    def put(self, key: bytes, checked: Checked) -> None:
        if self.limit <= 0:
            return
        if len(self._checked) >= self.limit:
            for old in list(islice(self._checked, max(1, self.limit // 2))):
                del self._checked[old]
        self._checked[key] = checked

    def clear(self) -> None:
        self._checked.clear()

    def footprint(self) -> int:
        """The bytes the cache holds (its table, keys, entries and their strings)."""
        total = sys.getsizeof(self._checked)
        for key, c in self._checked.items():
            total += sys.getsizeof(key) + sys.getsizeof(c) + sys.getsizeof(c.source_sha256)
            if c.outcome is not None:
                total += sys.getsizeof(c.outcome) + sys.getsizeof(c.outcome[1])
        return total

    def __len__(self) -> int:
        return len(self._checked)


def read_head(path: Path) -> tuple[bytes, os.stat_result]:
    """The first HEADER bytes of PATH (fewer if it is shorter) and its stat. Raises OSError."""
    fd = open_regular(path, look=False)  # os.*, not open(): the hot path
    try:
        return os.read(fd, HEADER), os.fstat(fd)
    finally:
        os.close(fd)


MAX_READ = 256 << 20  # a pyc or source of the serving side read whole: a sparse terabyte is not


def read(path: Path) -> tuple[bytes, os.stat_result]:
    """The whole of PATH and its stat. Raises OSError (NotRegular over MAX_READ bytes)."""
    with open_file(path) as f:
        st = os.fstat(f.fileno())
        _bounded(path, st)
        return f.read(), st


def read_stable(path: Path) -> tuple[bytes, os.stat_result] | None:
    """The whole of PATH and its stat, if its identity was the same before and after the read
    (None: it changed while read, so the bytes may not be those of either stat). Raises
    OSError."""
    with open_file(path) as f:
        before = os.fstat(f.fileno())
        _bounded(path, before)
        data = f.read(MAX_READ + 1)
        after = os.fstat(f.fileno())
    return (data, after) if identity("", before) == identity("", after) else None


def _bounded(path: Path, st: os.stat_result) -> None:
    if st.st_size > MAX_READ:
        raise NotRegular(errno.EFBIG, f"{st.st_size} bytes, over {MAX_READ}: not read", str(path))


def identity(path: str, st: os.stat_result) -> Identity:
    return (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def u32(data: bytes, at: int) -> int:
    return int.from_bytes(data[at : at + 4], "little")


def stamp_matches(head: bytes, src_st: os.stat_result) -> bool:
    """Whether a timestamp pyc's header holds the mtime and size of SRC_ST (each modulo 2**32,
    as the interpreter compares them)."""
    header = (u32(head, 8), u32(head, 12))
    return header == (int(src_st.st_mtime) & _U32, src_st.st_size & _U32)


def hash_matches(head: bytes, source: bytes) -> bool:
    """Whether a hash-based pyc's header holds SOURCE's hash, keyed with the header's magic."""
    return _imp.source_hash(int.from_bytes(head[:4], "little"), source) == head[8:]


def optimization(name: str) -> int:
    """The optimization level a cached pyc's name carries (``mod.cpython-311.opt-2.pyc``)."""
    parts = name.split(".")
    if len(parts) >= 4 and parts[-2] in ("opt-1", "opt-2"):
        return int(parts[-2][-1])
    return 0


def compare(data: bytes, source: bytes, filename: str, optimize: int) -> Outcome:
    """Whether the pyc DATA (header included) holds the code SOURCE compiles to."""
    compiled = _compile(source, filename, optimize)
    if not isinstance(compiled, CodeType):
        return compiled  # the source does not compile, or cannot be compiled here
    if marshal.dumps(compiled) == data[HEADER:]:
        return None  # the same bytes; when not, unmarshal (references may be laid out otherwise)
    try:
        # Only bytes this process's interpreter unmarshalled itself (sha256 as recorded), with
        # this Python's magic number, reach here.
        loaded = marshal.loads(data[HEADER:])  # noqa: S302
    except (EOFError, ValueError, TypeError) as e:
        # Importing it failed in the process too: nothing ran from it, nothing is shown.
        return False, f"its code cannot be unmarshalled ({type(e).__name__}: {e})"
    if not isinstance(loaded, CodeType):
        return False, f"it holds a {type(loaded).__name__}, not code"  # likewise
    # Code objects compare by value (bytecode, constants, names, line and exception tables,
    # nested code), not by co_filename.
    try:
        return None if loaded == compiled else (True, "")
    except RecursionError as e:
        return False, repr(e)


def _compile(source: bytes, filename: str, optimize: int) -> CodeType | Outcome:
    """SOURCE compiled at OPTIMIZE, or the outcome of a source that does not compile (other
    code than any pyc holds) or cannot be compiled here."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the source's SyntaxWarning, DeprecationWarning...
            return compile(source, filename, "exec", dont_inherit=True, optimize=optimize)
    except (SyntaxError, ValueError) as e:
        return True, f" (the source does not compile: {type(e).__name__}: {e})"
    except (RecursionError, MemoryError) as e:
        return False, repr(e)
