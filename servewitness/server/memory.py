"""Giving memory back after a large transient allocation.

A 200,000-file report allocates a few hundred MiB while it is decoded, checked and stored
(protobuf arenas, one object per file, the JSON rows of its manifest). CPython frees the
objects, but glibc's allocator keeps much of the freed memory mapped, so the process's
resident size stays far above where it was. Two remedies, both glibc only (elsewhere nothing
is done): ``fix_mmap_threshold`` keeps large buffers in their own mappings, returned when
freed, and ``Trimmer`` asks glibc to return free heap pages (``malloc_trim(0)``) whenever the
resident size moved by more than a threshold since the last trim. The history keeper calls it
about twice a second, so every large allocation (a report stored, or one refused after
decoding) is followed by a trim, and quiet times cost one read of ``/proc/self/statm``.
Measured numbers: docs/operations.md, "Contention and memory".
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import threading
from collections.abc import Callable
from typing import Any

import structlog

log = structlog.get_logger("verifier.serve")
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
TRIM_ABOVE_BYTES = 32 * 1024 * 1024  # change since the last trim that makes one worth it
# glibc serves allocations this large or larger with their own mmap, returned to the system
# when freed. Its default (128 KiB) rises as large blocks are freed, up to 32 MiB; after one
# large report, the next one's big buffers then came from the heap and stayed: fixed here.
MMAP_THRESHOLD_BYTES = 128 * 1024
_M_MMAP_THRESHOLD = -3  # malloc.h


def rss_bytes(pid: int | str = "self") -> int:
    """The resident set size of process PID (Linux; 0 where /proc cannot say)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return 0


def _glibc(symbol: str) -> Any | None:
    """A function of glibc's allocator, or None on another C library (musl has neither)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return getattr(ctypes.CDLL(name), symbol)
    except (OSError, AttributeError):
        return None


def _glibc_trim() -> Callable[[], int] | None:
    fn = _glibc("malloc_trim")
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return lambda: int(fn(0))


def fix_mmap_threshold(size: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Pin glibc's mmap threshold at SIZE (``MMAP_THRESHOLD_BYTES``); whether it was set.
    Process-wide: called once by the verifier's history keeper as it starts."""
    fn = _glibc("mallopt")
    if fn is None:
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return bool(fn(_M_MMAP_THRESHOLD, size))


GC_YOUNG_THRESHOLD = 10_000
"""Allocations less deallocations of container objects before the cyclic collector looks at
the youngest generation (CPython's default: 700). Each report makes thousands of short-lived
objects; at the default, most collections find them alive (still in use by a call in flight),
walk them, and promote them toward the old generation, whose full collections then walk every
target's latest snapshot. Measured: BENCHMARKS.md, "Status reads first"."""


def tune_gc(young: int = GC_YOUNG_THRESHOLD) -> None:
    """Set up the cyclic garbage collector for a long-running server, once it has loaded what
    it keeps for good (modules, the evidence loaded at start): that is moved out of the
    collector's reach (``gc.freeze``: never walked again; freed normally when its references
    go), and the youngest generation is collected every YOUNG allocations instead of 700."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, old)


FOLLOW_UP_MAX_BEATS = 64  # the longest wait between follow-up trims that give nothing back


class Trimmer:
    """``maybe_trim``, called on every beat of the history keeper: trim when the resident
    size moved by more than THRESHOLD bytes since the last trim (or start), either way: up (a
    large report being handled) or down (one handled: what glibc keeps of it is given back).

    A trim taken while the memory is still in use (the report not yet freed) gives nothing
    back, and the freed memory that follows does not move the resident size, so the first rule
    alone would never trim again (CI once read +68 MiB that stayed). Hence a follow-up: while
    the resident size is more than THRESHOLD above the lowest it was after a trim, trim again
    on the next beat; each follow-up that gives back less than a quarter of THRESHOLD doubles
    the wait before the next (up to ``FOLLOW_UP_MAX_BEATS``), so memory really in use costs
    one trim per half minute. A quiet verifier at its low-water mark is never trimmed."""

    def __init__(self, threshold: int = TRIM_ABOVE_BYTES) -> None:
        self.threshold = threshold
        self._trim = _glibc_trim()
        self._lock = threading.Lock()
        self._base = rss_bytes()
        self._low = self._base  # the lowest resident size seen at start or after a trim
        self._wait = 1  # beats before the next follow-up trim
        self._beats = 0  # beats since the last trim
        self.trims = 0
        self.released = 0  # bytes of resident size given back by trims, in all

    @property
    def available(self) -> bool:
        return self._trim is not None

    def maybe_trim(self) -> int:
        """Trim if due; the bytes given back (0 when not due or not glibc)."""
        with self._lock:
            now = rss_bytes()
            self._beats += 1
            moved = abs(now - self._base) > self.threshold
            follow_up = self._beats >= self._wait and now - self._low > self.threshold
            if self._trim is None or not (moved or follow_up):
                return 0
            self._trim()
            after = rss_bytes()
            given = max(0, now - after)
            self._base = after
            self._low = min(self._low, after)
            self._beats = 0
            if moved or given >= self.threshold // 4:
                self._wait = 1
            else:
                self._wait = min(2 * self._wait, FOLLOW_UP_MAX_BEATS)
            self.trims += 1
            self.released += given
        log.debug("malloc_trim", rss_before=now, rss_after=after, follow_up=not moved)
        return given
