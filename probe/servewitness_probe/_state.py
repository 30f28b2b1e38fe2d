"""Per-process probe state: the shared counters and the append-only journal.

One ``ProbeState`` exists per process (``current()``); after ``fork`` the child gets a fresh
one for its own pid (registered with ``os.register_at_fork``). Nothing here raises into the
caller: a failure to create the shared files degrades to private in-memory counters and is
recorded as an error record (and in the ``S_PROBE_ERRORS`` slot).

The state directory is named for the process (boot id, PID namespace, pid, start time: see
``layout``) and is always created fresh, with its files: one already there under this name is
either this very process's from before an ``exec`` (its mapping and its journal went with the
old image) or planted by someone else, and is removed rather than written into. A reader then
knows the files the process holds (mapped, open) are files the probe created.
"""

from __future__ import annotations

import array
import json
import mmap
import os
import shutil
import sys
import threading
import time
from typing import Any

from servewitness_probe import layout as L

PROBE_VERSION = "0.1.0"


def _self_start_ticks() -> int:
    try:
        with open("/proc/self/stat", "rb") as f:
            data = f.read()
        return L.start_ticks(data)
    except (OSError, ValueError, IndexError):
        return 0


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _pid_ns() -> int:
    """The inode of this process's PID namespace (0: unknown)."""
    try:
        return L.ns_inode(os.readlink("/proc/self/ns/pid"))
    except (OSError, ValueError):
        return 0


def identity() -> tuple[str, int]:
    """This process's boot id and PID namespace inode: what its state directory's name and
    garbage collection (``_core._gc_dead``) go by."""
    return _boot_id(), _pid_ns()


# Files of the state directory are created by the probe, never opened when already there (a
# file planted in advance, or a link to another process's, is never written into).
_CREATE = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _fresh_dir(root: str, path: str) -> None:
    """Create PATH (under ROOT, created if missing) as a new, empty directory. Something already
    there under this process's name is removed first (see the module docstring). Raises
    OSError when that cannot be done."""
    os.makedirs(root, mode=0o755, exist_ok=True)
    try:
        os.mkdir(path, 0o755)
        return
    except FileExistsError:
        pass
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)
    os.mkdir(path, 0o755)


ERRORS_JOURNALED_PER_WHERE = 8  # then one record saying the rest are only counted


class ProbeState:
    """Counters (``counters``, a memoryview of unsigned 64-bit slots) and the journal."""

    def __init__(self, probe_dir: str, mode: str) -> None:
        self.pid = os.getpid()
        self.start_ticks = _self_start_ticks()
        self.mode = mode
        self.lock = threading.Lock()
        self._journal_lock = threading.Lock()  # a record's seq is its place in the journal
        self._seq = 0
        self.hook_names: dict[str, int] = {}
        self.declared: list[tuple[str, str, str]] = []
        self.replay: list[dict[str, Any]] = []  # records a forked child inherits
        self.errors = 0
        self._journaled_errors: dict[str, int] = {}  # error records journaled, per where
        self.boot_id, self.pid_ns = identity()
        name = L.process_dir_name(self.boot_id, self.pid_ns, self.pid, self.start_ticks)
        self.dir = os.path.join(probe_dir, name)
        self._fd = -1
        self._mmap: mmap.mmap | None = None
        self.shared = False
        self.counters: memoryview = (
            memoryview(array.array("Q", bytes(L.SLOT_BYTES * L.N_SLOTS))).cast("B").cast("Q")
        )
        try:
            _fresh_dir(probe_dir, self.dir)
            self._fd = os.open(
                os.path.join(self.dir, L.JOURNAL_FILE), os.O_WRONLY | os.O_APPEND | _CREATE, 0o644
            )
            cpath = os.path.join(self.dir, L.COUNTERS_FILE)
            cfd = os.open(cpath, os.O_RDWR | _CREATE, 0o644)
            try:
                os.ftruncate(cfd, L.SLOT_BYTES * L.N_SLOTS)
                self._mmap = mmap.mmap(cfd, L.SLOT_BYTES * L.N_SLOTS, mmap.MAP_SHARED)
            finally:
                os.close(cfd)
            self.counters = memoryview(self._mmap).cast("Q")
            self.shared = True
        except OSError as e:
            self.error("state", f"cannot create shared state in {self.dir}: {e}")
        c = self.counters
        c[L.H_VERSION] = L.LAYOUT_VERSION
        c[L.H_PID] = self.pid
        c[L.H_NSLOTS] = L.N_SLOTS
        c[L.H_MAGIC] = L.MAGIC  # written last: a reader trusts the header once magic is set
        self.emit(
            {
                "k": "start",
                "pid": self.pid,
                "start_ticks": self.start_ticks,
                # when this probe started, on the clock /proc/<pid>/stat's start ticks count
                # (CLOCK_BOOTTIME): a child this process started began after it
                "boottime": time.clock_gettime(time.CLOCK_BOOTTIME),
                "boot_id": self.boot_id,
                "pid_ns": self.pid_ns,
                "argv": list(sys.argv),
                "executable": sys.executable,
                "python": sys.version.split()[0],
                "probe": PROBE_VERSION,
                "mode": mode,
                "shared": self.shared,
                "fd": self._fd,  # the journal's descriptor: a reader's hint (see layout)
            }
        )

    def emit(self, record: dict[str, Any]) -> None:
        """Append one record to the journal (one ``write``; never raises). Under one lock
        (imports, the sweeper and hooks emit from several threads) the record gets ``seq``,
        its index in the journal, and is counted in ``S_JOURNAL_RECORDS`` once written (and
        in ``S_FILES_RECORDED`` when it is a file record): a reader can then tell a journal
        with a line deleted, inserted, reordered or cut off from the one written here."""
        if self._fd < 0:
            return
        record.setdefault("t", time.time())
        with self._journal_lock:
            seq = self._seq
            try:
                record["seq"] = seq
                line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
                # Counted before it is written: a reader that finds the count ahead of the
                # journal reads again; one that found a record not yet counted would take it
                # for a forgery.
                self._seq = seq + 1
                self.counters[L.S_JOURNAL_RECORDS] = seq + 1
                os.write(self._fd, line)
            except (OSError, TypeError, ValueError):
                self._seq = seq
                self.counters[L.S_JOURNAL_RECORDS] = seq
                self.errors += 1
                return
            if record.get("k") == "file":
                self.counters[L.S_FILES_RECORDED] += 1

    def remember(self, record: dict[str, Any]) -> None:
        """Journal a record that a forked child must inherit (files, hook status)."""
        self.emit(record)
        self.replay.append(record)

    def error(self, where: str, msg: str, by: str | None = None) -> None:
        """Record a probe error: counted in shared memory, and journaled while fewer than
        ``ERRORS_JOURNALED_PER_WHERE`` came from WHERE. An error that recurs on every step
        (the H200's V2 speculation path: 3,270 in 12 s) would otherwise add a journal line per
        step and a report entry per line; past the bound one record says the rest are counted
        only. Bounded per WHERE, not in all, so a flood from one place never hides the first
        error from another."""
        self.errors += 1
        try:
            self.counters[L.S_PROBE_ERRORS] += 1
        except (IndexError, TypeError):
            pass
        n = self._journaled_errors.get(where, 0)
        if n > ERRORS_JOURNALED_PER_WHERE:
            return
        self._journaled_errors[where] = n + 1
        if n == ERRORS_JOURNALED_PER_WHERE:
            msg = "more errors here: counted in the probe's error slot, not journaled"
        self.emit({"k": "error", "where": where, "msg": msg, **({"by": by} if by else {})})

    def hook_index(self, name: str, target: str, source: str) -> int:
        """Slot base for hook NAME, allocating it (and journaling it) on first use."""
        with self.lock:
            base = self.hook_names.get(name)
            if base is not None:
                return base
            index = len(self.hook_names)
            if index >= L.MAX_HOOKS:
                self.error("hooks", f"too many hooks; {name!r} shares the overflow slot")
                index = L.MAX_HOOKS - 1
            base = L.hook_slot(index)
            self.hook_names[name] = base
            self.declared.append((name, target, source))
            self.counters[L.H_HOOKS_USED] = len(self.hook_names)
            self.emit({"k": "hook", "name": name, "target": target, "source": source, "slot": base})
            return base

    def close(self) -> None:
        if self._fd >= 0:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = -1
