"""Native code a process runs: every file-backed executable mapping, hashed as mapped.

The mapped bytes are read through ``/proc/<pid>/map_files/<range>``, which opens the inode
that is really mapped even if its path was replaced or deleted since. The file now at the
same path (as the process sees it, through ``/proc/<pid>/root``) is hashed too; comparing
contents rather than device and inode numbers keeps overlay filesystems, which report other
numbers in ``maps`` than ``stat`` does, from looking like replacements.

Opening ``map_files`` needs CAP_CHECKPOINT_RESTORE (or CAP_SYS_ADMIN), which a sidecar with
only SYS_PTRACE lacks. Then the path is hashed instead, but only where ``stat`` through the
process's root names the very device and inode that ``maps`` shows: the same inode is the
same bytes. Anything else stays ``unreadable``, never a guess. When ``maps`` itself cannot
be read, that is one ``unreadable`` entry for ``/proc/<pid>/maps``: unreadable maps is not
"no native code".

A library overwritten *in place* (the same inode, as ``cp`` over it does) reads the same
through the mapping and through the path: both are the inode now. What was mapped before
the write is gone from the disk (and from the page cache the mapping shares), and what ran
before it (its constructors, code already executed) ran unseen. Two things show it (state
``changed``): the mapped inode's ctime is after the process started (a write moves it, and
user space cannot set it back), and, for an agent that looks again and again
(``NativeMemory``), mapped bytes other than the first it saw. Libraries under the process's
compile caches and temporary directories are written by the process itself after it started
(Triton's launchers, torch inductor's kernels): their ctime alone says nothing, only the
memory judges them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from servewitness.errors import UnavailableError
from servewitness.evidence.hashing import Hashed, Hasher
from servewitness.evidence.places import GeneratedFiles, is_generated
from servewitness.evidence.procfs import CHANGED_SLACK_S, ProcFS
from servewitness.model import NativeMapping, ProcessKey

_DELETED = " (deleted)"


@dataclass(frozen=True)
class _Exec:
    path: str
    range: str  # "start-end" of its first executable mapping
    unlinked: bool  # maps marks the mapped inode "(deleted)"
    device: str = ""  # "major:minor" as maps shows it
    inode: int = 0
    memfd: bool = False  # anonymous memory with a name (memfd_create): no file on any disk


def executable_files(procfs: ProcFS, pid: int) -> list[_Exec]:
    """Distinct file-backed executable mappings of PID, in first-seen order."""
    seen: dict[str, _Exec] = {}
    # "\n" only: the kernel escapes no other line break in a path ("\r", "\x85", "\u2028"
    # are valid in file names), and str.splitlines() would split a hostile name into lines.
    for line in procfs.maps(pid).split("\n"):
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or "x" not in parts[1] or not parts[5].startswith("/"):
            continue
        memfd = parts[5].startswith("/memfd:")  # JIT code, libffi's trampolines, or a library
        path, deleted = parts[5], parts[5].endswith(_DELETED)
        if deleted:
            path = path[: -len(_DELETED)]
        inode = int(parts[4]) if parts[4].isascii() and parts[4].isdigit() else 0
        seen.setdefault(path, _Exec(path, parts[0], deleted, parts[3], inode, memfd))
    return list(seen.values())


ELF_MAGIC = b"\x7fELF"


def _from_memory(procfs: ProcFS, pid: int, e: _Exec) -> bool:
    """Whether the executable memfd mapping E holds a shared object (its file starts with
    ELF's magic): a library ``dlopen``ed from memory (``/proc/self/fd/N`` of a memfd), which
    no file on any disk holds. Code a JIT or libffi writes there is no ELF file."""
    try:
        with open(procfs.root / str(pid) / "map_files" / e.range, "rb") as f:
            return f.read(4) == ELF_MAGIC
    except OSError:
        return False


def native_mappings(
    procfs: ProcFS,
    pid: int,
    hasher: Hasher,
    *,
    start_time: float | None = None,
    generated: Sequence[str] | GeneratedFiles = (),
) -> tuple[NativeMapping, ...]:
    """Each executable file of PID with the hash of the mapped inode and its state on disk:
    ``same`` (the path holds the same bytes), ``replaced`` (other bytes now), ``deleted``
    (nothing at the path), ``unreadable`` (the mapping could not be read; ``error`` says why),
    ``memory`` (a shared object ``dlopen``ed from a memfd: no file on any disk holds it).
    Maps that cannot be read give one ``unreadable`` entry whose path is the maps file.
    START_TIME (the process's start, unix seconds): a ``same`` mapping whose inode changed
    (ctime) after it is ``changed`` (``detail`` says when), unless it is a generated file:
    under one of GENERATED's directories (the process's compile caches and temporary
    directories) and, with ``places.GeneratedFiles``, claimed by no distribution."""
    try:
        execs = executable_files(procfs, pid)
    except (UnavailableError, OSError) as err:
        maps = str(procfs.root / str(pid) / "maps")
        why = err.explain() if isinstance(err, UnavailableError) else (err.strerror or str(err))
        return (NativeMapping(maps, None, -1, "unreadable", f"cannot read {maps}: {why}"),)
    loaded = [e for e in execs if e.memfd and _from_memory(procfs, pid, e)]
    execs = [e for e in execs if not e.memfd]
    mapped = hasher.hash_files(str(procfs.root / str(pid) / "map_files" / e.range) for e in execs)
    on_disk = hasher.hash_files(procfs.in_root_str(pid, e.path) for e in execs)
    out = []
    for e, m, d in zip(execs, mapped, on_disk, strict=True):
        # maps says "(deleted)" whenever the mapped inode was unlinked, also when another file
        # was renamed over it: what the path holds now decides between deleted and replaced.
        got = m
        if m.sha256 is None and _same_inode(e, d):
            got, state, error = d, "same", None  # map_files refused; the path is that inode
        elif m.sha256 is None:
            state, error = "unreadable", m.error
        elif d.error == "missing":
            state, error = "deleted", None
        elif d.sha256 != m.sha256:
            state, error = "replaced", d.error
        else:
            state, error = "same", None  # the same bytes (a reinstall of the same file)
        detail = None
        if state == "same" and start_time is not None:
            detail = _changed_since(e.path, got, start_time, generated)
            state = "changed" if detail else state
        out.append(
            NativeMapping(e.path, got.sha256, got.size, state, error, e.device, e.inode, detail)
        )
    files = procfs.root / str(pid) / "map_files"
    from_memory = hasher.hash_files(str(files / e.range) for e in loaded)
    for e, m in zip(loaded, from_memory, strict=True):
        why = "a shared object loaded from memory (memfd_create), which no file on any disk holds"
        out.append(
            NativeMapping(e.path, m.sha256, m.size, "memory", m.error, e.device, e.inode, why)
        )
    return tuple(out)


def _changed_since(
    path: str, mapped: Hashed, start_time: float, generated: Sequence[str] | GeneratedFiles
) -> str | None:
    """Why the inode MAPPED (hashed through the mapping) may have been rewritten in place
    after the process started; None when its ctime says it was not."""
    if mapped.key is None:
        return None
    after = mapped.key[4] / 1e9 - start_time
    if after <= CHANGED_SLACK_S or (generated and is_generated(path, generated)):
        return None
    return (
        f"the mapped inode changed (ctime) {after:.3f} s after the process started: "
        "rewritten in place while mapped, or before the agent first read it"
    )


Seen = dict[tuple[str, int], str]  # (device "major:minor", inode) -> first sha256


class NativeMemory:
    """The mapped bytes the agent first saw, per process and mapping, so that a library
    rewritten in place between two of its looks is seen even when its ctime cannot say so
    (a library created after the process started, under its compile caches). One process is
    (boot id, pid, start ticks): a pid reused is another process; one mapping is (device,
    inode), remembered while it is mapped (an inode number freed by an unmapped, deleted
    library and reused by another file is another library). Bounded: at most MAX_PROCESSES
    processes (the oldest forgotten first) and MAX_MAPPINGS mappings each (later ones are not
    remembered: only their ctime judges them); ``forget`` drops the processes that are
    gone."""

    MAX_PROCESSES = 1024
    MAX_MAPPINGS = 8192

    def __init__(self) -> None:
        self._seen: dict[ProcessKey, Seen] = {}

    def check(
        self, process: ProcessKey, mappings: Sequence[NativeMapping]
    ) -> tuple[NativeMapping, ...]:
        """MAPPINGS of PROCESS (all of its executable mappings, as ``native_mappings`` read
        them), each ``same`` one whose mapped bytes differ from the first the agent saw made
        ``changed``; remembers those seen for the first time and forgets those no longer
        mapped."""
        seen = self._seen.get(process)
        if seen is None:
            while len(self._seen) >= self.MAX_PROCESSES:
                del self._seen[next(iter(self._seen))]
            seen = self._seen[process] = {}
        mapped = {(m.device, m.inode) for m in mappings if m.inode}
        if mapped:  # maps was read (an unreadable maps file is one entry without an inode)
            for key in [k for k in seen if k not in mapped]:
                del seen[key]
        out = []
        for m in mappings:
            if m.sha256 is None or not m.inode:
                out.append(m)
                continue
            key = (m.device, m.inode)
            first = seen.get(key)
            if first is None:
                if len(seen) < self.MAX_MAPPINGS:
                    seen[key] = m.sha256
            elif first != m.sha256 and m.state in ("same", "changed"):
                detail = (
                    f"the mapped bytes were {first[:12]} when the agent first read them and are "
                    f"{m.sha256[:12]} now: the library was rewritten in place while mapped"
                )
                out.append(dataclasses.replace(m, state="changed", detail=detail))
                continue
            out.append(m)
        return tuple(out)

    def forget(self, alive: Collection[ProcessKey]) -> None:
        """Drop every process not in ALIVE."""
        for key in [k for k in self._seen if k not in alive]:
            del self._seen[key]

    def __len__(self) -> int:
        return len(self._seen)


def _same_inode(e: _Exec, on_disk: Hashed) -> bool:
    """ON_DISK was hashed from the inode PATH's mapping names (device and inode as in maps)."""
    if on_disk.sha256 is None or on_disk.key is None or not e.inode or e.unlinked:
        return False
    dev, ino = on_disk.key[0], on_disk.key[1]
    return (ino, f"{os.major(dev):02x}:{os.minor(dev):02x}") == (e.inode, e.device)
