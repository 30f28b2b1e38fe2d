"""One cached ``.pyc`` file (PEP 552): reading its header, and whether its code is what its
source compiles to.

A pyc starts with a 16-byte header: the magic number of the Python that wrote it, flags (0:
timestamp; 1: unchecked hash; 3: checked hash), then the source's mtime and size or a hash
of the source. ``compare`` compiles a source and compares the code with a pyc's; its
outcomes are kept in a ``CompileCache`` under both files' identity (path, device, inode,
size, mtime, ctime), since a file whose bytes changed changed its ctime.
"""

from __future__ import annotations

import _imp
import marshal
import os
import warnings
from pathlib import Path
from types import CodeType

HEADER = 16  # magic (4), flags (4), then mtime and size (4 + 4) or the source hash (8)
FLAG_HASH = 0b01
FLAG_CHECK = 0b10
_U32 = 0xFFFFFFFF

# A compile-and-compare outcome: None, the pyc holds what the source compiles to; (True, why):
# other code, WHY empty or " (…)"; (False, why): it cannot be told, WHY says why.
Outcome = tuple[bool, str] | None
Identity = tuple[str, int, int, int, int, int]  # path, dev, ino, size, mtime_ns, ctime_ns
CacheKey = tuple[Identity, Identity, int]  # pyc, source, optimization level


class CompileCache:
    """Compile-and-compare outcomes keyed by the identity of both files (path, device, inode,
    size, mtime_ns, ctime_ns) and the optimization level: a file whose bytes changed changed
    its ctime. Bounded: emptied when LIMIT entries are reached (0: caches nothing)."""

    def __init__(self, limit: int = 1 << 16) -> None:
        self.limit = limit
        self._outcomes: dict[CacheKey, Outcome] = {}

    def get(self, key: CacheKey) -> tuple[bool, Outcome]:
        """(True, outcome) if KEY is cached, else (False, None)."""
        if key in self._outcomes:
            return True, self._outcomes[key]
        return False, None

    def put(self, key: CacheKey, outcome: Outcome) -> None:
        if self.limit <= 0:
            return
        if len(self._outcomes) >= self.limit:
            self._outcomes.clear()
        self._outcomes[key] = outcome

    def __len__(self) -> int:
        return len(self._outcomes)


def read_head(path: Path) -> tuple[bytes, os.stat_result]:
    """The first HEADER bytes of PATH (fewer if it is shorter) and its stat. Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)  # os.*, not open(): the hot path
    try:
        return os.read(fd, HEADER), os.fstat(fd)
    finally:
        os.close(fd)


def read(path: Path) -> tuple[bytes, os.stat_result]:
    """The whole of PATH and its stat. Raises OSError."""
    with open(path, "rb") as f:
        return f.read(), os.fstat(f.fileno())


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
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the source's SyntaxWarning, DeprecationWarning...
            compiled = compile(source, filename, "exec", dont_inherit=True, optimize=optimize)
    except (SyntaxError, ValueError) as e:
        return True, f" (the source does not compile: {type(e).__name__}: {e})"
    except (RecursionError, MemoryError) as e:
        return False, repr(e)
    if marshal.dumps(compiled) == data[HEADER:]:
        return None  # the same bytes; when not, unmarshal (references may be laid out otherwise)
    try:
        # Only bytes this process's interpreter unmarshalled itself (sha256 as recorded), with
        # this Python's magic number, reach here.
        loaded = marshal.loads(data[HEADER:])  # noqa: S302
    except (EOFError, ValueError, TypeError):
        return None  # the interpreter cannot have run this: importing it failed
    if not isinstance(loaded, CodeType):
        return None  # likewise ("Non-code object")
    # Code objects compare by value (bytecode, constants, names, line and exception tables,
    # nested code), not by co_filename.
    return None if loaded == compiled else (True, "")


def compare_cached(
    cache: CompileCache | None,
    key: CacheKey,
    data: bytes,
    source: bytes,
    *,
    filename: str,
    optimize: int,
) -> Outcome:
    """``compare``, through CACHE (None: no cache) under KEY."""
    if cache is not None:
        hit, outcome = cache.get(key)
        if hit:
            return outcome
    outcome = compare(data, source, filename, optimize)
    if cache is not None:
        cache.put(key, outcome)
    return outcome
