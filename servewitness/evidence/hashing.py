"""Hash many files fast: in parallel, with a cache of files already hashed.

sha256 is the digest ``RECORD`` files and auditors speak, so it is the one used. ``hashlib``
releases the GIL while it hashes, so threads use every core for the big files. Small files
(most of what a Python process loads: a median of ~6 kB) are hashed by the calling thread
meanwhile: each costs a few system calls and little hashing, and every system call hands the
GIL over; two threads taking turns at it over thousands of small files spent more CPU in the
handover (futex waits, context switches) than in hashing (``bench/cold_manifest.py``).

The cache is keyed by (device, inode, size, mtime_ns, ctime_ns) of the file as ``stat`` sees
it just before reading. **Trust assumption:** a file whose bytes changed also changed one of
those. ``mtime`` can be set back by anyone who can write the file, but ``ctime`` cannot be
set from user space: it changes on every write and on every ``utime`` call, so the key
changes unless the clock itself was manipulated (root, or a filesystem that fakes ctime).
Where that is not acceptable, construct ``Hasher(cache=False)``. A file changed in the last
second (``SETTLED_NS``) is read twice and its digest not kept: a write under way has moved the
ctime already and may still be moving bytes (two reads torn alike are not ruled out: a digest
of no content the file held is possible then, and says "modified", never "pristine").
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from servewitness.evidence.regular import open_regular_stat

CHUNK = 1 << 20
# The name of the hashing threads (what py-spy and a test that none is left behind see).
THREAD_NAME = "servewitness-hash"

# Files smaller than this are hashed by the caller of ``hash_files``, bigger ones by threads.
SMALL = 1 << 18
# No file the agent hashes is bigger (the largest CUDA libraries are a few GB); a sparse file of
# terabytes put where a loaded file was (a second black-box attacker, 2026-12-05) kept the
# agent reading zeros for hours, its target STALE. Bigger files are not read, and said.
MAX_HASH_BYTES = 16 << 30

Key = tuple[int, int, int, int, int]
# A write moves the ctime when it begins, before its bytes land: a file whose ctime is this
# recent may still be changing under the same key, so its digest is not kept (it is hashed
# again next time). A clock set back makes every ctime recent: nothing is kept, nothing wrong.
SETTLED_NS = 1_000_000_000


@dataclass(frozen=True)
class Hashed:
    """One file's digest, or why it has none."""

    path: str
    sha256: str | None
    size: int
    key: Key | None  # (dev, ino, size, mtime_ns, ctime_ns) when it was hashed
    error: str | None = None  # "missing", "permission denied", "changed while hashing", ...
    cached: bool = False


def _key(st: os.stat_result) -> Key:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class Hasher:
    """Thread-safe; reuse one instance so its cache pays off across scans."""

    def __init__(self, workers: int | None = None, cache: bool = True) -> None:
        self.workers = workers or max(2, os.cpu_count() or 2)
        self.use_cache = cache
        self._cache: dict[Key, str] = {}
        self._lock = threading.Lock()

    def hash_file(self, path: str) -> Hashed:
        opened = _open(path)
        if isinstance(opened, Hashed):
            return opened
        fd, st = opened
        try:
            before = _key(st)
            if before[2] > MAX_HASH_BYTES:
                return Hashed(path, None, before[2], before, _too_big(before[2]))
            if self.use_cache:
                with self._lock:
                    hit = self._cache.get(before)
                if hit is not None:
                    return Hashed(path, hit, before[2], before, cached=True)
            settled = time.time_ns() - before[4] > SETTLED_NS
            digest, size, after = _read(fd, before, settled)
        except OSError as e:
            return Hashed(path, None, -1, None, e.strerror or type(e).__name__)
        finally:
            os.close(fd)
        if digest is None or after != before or size != before[2]:
            return Hashed(path, None, size, after, "changed while hashing")
        if self.use_cache and settled:
            with self._lock:
                self._cache[before] = digest
        return Hashed(path, digest, size, before)

    def hash_files(self, paths: Iterable[str]) -> list[Hashed]:
        """Digests of PATHS, in order (unique paths are hashed once).

        One ``stat`` per path answers cache hits without opening the file; only misses go to
        the thread pool, largest first so that it stays busy to the end.
        """
        unique = list(dict.fromkeys(paths))
        results: dict[str, Hashed] = {}
        misses: list[tuple[int, str]] = []
        for path in unique:
            try:
                key = _key(os.stat(path))
            except (OSError, ValueError):  # ValueError: a NUL byte, a lone surrogate
                misses.append((0, path))  # hash_file reports why
                continue
            hit = self._cache.get(key) if self.use_cache else None
            if hit is not None:
                results[path] = Hashed(path, hit, key[2], key, cached=True)
            else:
                misses.append((key[2], path))
        if misses:
            order = sorted(misses, reverse=True)
            results.update(zip((p for _, p in order), self._hash_all(order), strict=True))
        return [results[p] for p in unique]

    def _hash_all(self, order: list[tuple[int, str]]) -> list[Hashed]:
        """``hash_file`` of every path of ORDER ((size, path), largest first), in order: the
        files of SMALL bytes or more by WORKERS threads that each take the next one when done
        with one (no future, no queue per file), the smaller ones by this thread meanwhile."""
        out: list[Hashed | None] = [None] * len(order)
        big = next((i for i, (size, _) in enumerate(order) if size < SMALL), len(order))
        take = iter(range(big))
        lock = threading.Lock()
        raised: list[BaseException] = []

        def work() -> None:
            try:
                while not raised:
                    with lock:
                        i = next(take, None)
                    if i is None:
                        return
                    out[i] = self.hash_file(order[i][1])
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller, as the pool did
                raised.append(e)

        threads = [
            threading.Thread(target=work, name=THREAD_NAME) for _ in range(min(self.workers, big))
        ]
        for t in threads:
            t.start()
        try:
            for i in range(big, len(order)):
                if raised:
                    break
                out[i] = self.hash_file(order[i][1])
        except BaseException:
            raised.append(_Stop())  # the threads take no more files
            raise
        finally:
            for t in threads:
                t.join()
        if raised:
            raise raised[0]
        return [h for h in out if h is not None]


class _Stop(Exception):
    """Told to the hashing threads when their caller raised: they take no more files."""


def _read(fd: int, before: Key, settled: bool) -> tuple[str | None, int, Key]:
    """FD's sha256 (hex), the bytes read and its key after; BEFORE: its key before. A file
    not SETTLED (changed in the last ``SETTLED_NS``) is read twice: a write under way moves
    the ctime when it begins, so a read that overlapped its bytes has the same key before and
    after it, and only a second read that differs tells (None: they differ)."""
    h, size = _digest(fd, before[2])
    after = _key(os.fstat(fd))
    if settled or after != before or size != before[2]:
        return h.hexdigest(), size, after
    os.lseek(fd, 0, os.SEEK_SET)
    again, size_again = _digest(fd, before[2])
    if (again.digest(), size_again) != (h.digest(), size):
        return None, size_again, after
    return h.hexdigest(), size, _key(os.fstat(fd))


def _digest(fd: int, expected: int) -> tuple[hashlib._Hash, int]:
    """The sha256 of what FD reads to its end, and how many bytes that was; EXPECTED: its size
    as ``fstat`` said. A file under CHUNK takes one read of one byte more than that: a file
    that grew since reads long, and one that reads exactly as long needs no read for its end.
    (A read short of that, which a network or FUSE file system may give, is read on.)"""
    if expected < CHUNK:
        want = expected + 1
        data = os.read(fd, want)
        while 0 < len(data) < expected:
            more = os.read(fd, want - len(data))
            if not more:
                break
            data += more
        return hashlib.sha256(data), len(data)
    h = hashlib.sha256()
    size = 0
    while chunk := os.read(fd, CHUNK):
        h.update(chunk)
        size += len(chunk)
    return h, size


def _too_big(size: int) -> str:
    return f"{size} bytes, over the {MAX_HASH_BYTES} the agent hashes: not read"


def _open(path: str) -> tuple[int, os.stat_result] | Hashed:
    """A read-only descriptor for PATH and what it is, or a Hashed saying why there is none."""
    try:
        return open_regular_stat(path)  # a FIFO put there would hang the hash
    except FileNotFoundError:
        return Hashed(path, None, -1, None, "missing")
    except PermissionError:
        return Hashed(path, None, -1, None, "permission denied")
    except OSError as e:
        return Hashed(path, None, -1, None, e.strerror or type(e).__name__)
    except ValueError:  # a NUL byte or an unencodable character: no file has that name
        return Hashed(path, None, -1, None, "invalid path")
