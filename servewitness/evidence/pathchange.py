"""When the *path* to a file last changed, beyond the file itself: for the files a process
read before its probe hashed them.

A file hashed after the fact is taken to hold the bytes the process read when its ctime is
before the process started (``judge.changed_after``). That speaks for the inode the path leads
to *now*. A path whose symbolic link was flipped after the start (``os.replace`` of a new link
over it: the attacker's bytes read at start, an honest copy made earlier hashed later) leads
to an old inode through a new link. Found by an outside tester, 2026-12-07
(``tests/test_vouched_attacks_outside.py``).

``changed_ns`` walks the path as the process sees it (``/proc/<pid>/root``), resolving each
link itself, and gives the latest ctime of every symbolic link on the way (its own ``lstat``
ctime: made, or replaced, at that time). Answers are kept per call by path prefix: the files
of one process share most of their directories.

Open: a *directory* renamed into place (the attacker's tree moved aside, an honest one
renamed to its name) leaves no link to see. Its ctime moves and its mtime does not, but in a
container an overlay filesystem's copy-up (any write below a directory of the image: a
``__pycache__`` made at the first import) gives every parent directory the same signature,
so it is not taken as evidence here (``tests/test_path_changes.py``, an xfail).
"""

from __future__ import annotations

import os
import posixpath
import stat

from servewitness.evidence.procfs import ProcFS

MAX_LINKS = 40  # what the kernel follows (ELOOP past it)

Cache = dict[str, tuple[str | None, int | None]]  # directory as given -> (resolved, latest)


def changed_ns(procfs: ProcFS, pid: int, path: str, cache: Cache | None = None) -> int | None:
    """The latest ctime (ns) of a symbolic link on the way to PATH (PATH itself included) as
    process PID sees it; None when there is none or the path cannot be walked (the
    cross-check says why it cannot read the file). CACHE keeps each directory's answer, so
    the files of one directory cost one ``lstat`` each."""
    cache = {} if cache is None else cache
    parent, _, name = path.rpartition("/")
    resolved, latest = _directory(procfs, pid, parent, cache)
    if resolved is None:
        return latest
    try:  # the file itself, as a rule no link: one lstat
        mode = os.lstat(procfs.in_root_str(pid, f"{resolved.rstrip('/')}/{name}")).st_mode
    except (OSError, ValueError):
        return latest
    if not stat.S_ISLNK(mode):
        return latest
    _, last = _walk(procfs, pid, resolved, [name])
    return _later(latest, last)


def _directory(procfs: ProcFS, pid: int, d: str, cache: Cache) -> tuple[str | None, int | None]:
    """Directory D (as given) resolved, and the latest link ctime on the way: from its
    parent's answer (each directory walked once per CACHE)."""
    hit = cache.get(d)
    if hit is None:
        if d in ("", "/"):
            hit = ("/", None)
        else:
            up, _, name = d.rpartition("/")
            resolved, latest = _directory(procfs, pid, up, cache)
            if resolved is not None:
                resolved, more = _walk(procfs, pid, resolved, [name])
                latest = _later(latest, more)
            hit = (resolved, latest)
        cache[d] = hit
    return hit


def _walk(procfs: ProcFS, pid: int, at: str, parts: list[str]) -> tuple[str | None, int | None]:
    """PARTS resolved from the directory AT, each link read and followed (at most
    MAX_LINKS): (where they lead, None when they cannot be walked; the latest ctime of a
    link on the way)."""
    resolved, latest = at, None
    todo = [c for c in parts if c][::-1]
    hops = 0
    while todo:
        part = todo.pop()
        if part == ".":
            continue
        if part == "..":
            resolved = posixpath.dirname(resolved)
            continue
        here = posixpath.join(resolved, part)
        try:
            st = os.lstat(procfs.in_root_str(pid, here))
        except (OSError, ValueError):
            return None, latest
        if not stat.S_ISLNK(st.st_mode):
            resolved = here
            continue
        latest = _later(latest, st.st_ctime_ns)
        hops += 1
        try:
            target = os.readlink(procfs.in_root_str(pid, here))
        except (OSError, ValueError):
            return None, latest
        if hops > MAX_LINKS:
            return None, latest
        todo += [c for c in target.split("/") if c][::-1]
        if target.startswith("/"):
            resolved = "/"
    return resolved, latest


def _later(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None or a >= b else b
