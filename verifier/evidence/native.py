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
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from verifier.errors import UnavailableError
from verifier.evidence.hashing import Hashed, Hasher
from verifier.evidence.procfs import ProcFS
from verifier.model import NativeMapping

_DELETED = " (deleted)"


@dataclass(frozen=True)
class _Exec:
    path: str
    range: str  # "start-end" of its first executable mapping
    unlinked: bool  # maps marks the mapped inode "(deleted)"
    device: str = ""  # "major:minor" as maps shows it
    inode: int = 0


def executable_files(procfs: ProcFS, pid: int) -> list[_Exec]:
    """Distinct file-backed executable mappings of PID, in first-seen order."""
    seen: dict[str, _Exec] = {}
    # "\n" only: the kernel escapes no other line break in a path ("\r", "\x85", "\u2028"
    # are valid in file names), and str.splitlines() would split a hostile name into lines.
    for line in procfs.maps(pid).split("\n"):
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or "x" not in parts[1] or not parts[5].startswith("/"):
            continue
        if parts[5].startswith("/memfd:"):
            continue  # anonymous memory with a name (JIT code), not a file on any disk
        path, deleted = parts[5], parts[5].endswith(_DELETED)
        if deleted:
            path = path[: -len(_DELETED)]
        inode = int(parts[4]) if parts[4].isdigit() else 0
        seen.setdefault(path, _Exec(path, parts[0], deleted, parts[3], inode))
    return list(seen.values())


def native_mappings(procfs: ProcFS, pid: int, hasher: Hasher) -> tuple[NativeMapping, ...]:
    """Each executable file of PID with the hash of the mapped inode and its state on disk:
    ``same`` (the path holds the same bytes), ``replaced`` (other bytes now), ``deleted``
    (nothing at the path), ``unreadable`` (the mapping could not be read; ``error`` says why).
    Maps that cannot be read give one ``unreadable`` entry whose path is the maps file."""
    try:
        execs = executable_files(procfs, pid)
    except (UnavailableError, OSError) as err:
        maps = str(procfs.root / str(pid) / "maps")
        why = err.explain() if isinstance(err, UnavailableError) else (err.strerror or str(err))
        return (NativeMapping(maps, None, -1, "unreadable", f"cannot read {maps}: {why}"),)
    mapped = hasher.hash_files(str(procfs.root / str(pid) / "map_files" / e.range) for e in execs)
    on_disk = hasher.hash_files(str(procfs.in_root(pid, e.path)) for e in execs)
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
        out.append(NativeMapping(e.path, got.sha256, got.size, state, error, e.device, e.inode))
    return tuple(out)


def _same_inode(e: _Exec, on_disk: Hashed) -> bool:
    """ON_DISK was hashed from the inode PATH's mapping names (device and inode as in maps)."""
    if on_disk.sha256 is None or on_disk.key is None or not e.inode or e.unlinked:
        return False
    dev, ino = on_disk.key[0], on_disk.key[1]
    return (ino, f"{os.major(dev):02x}:{os.minor(dev):02x}") == (e.inode, e.device)
