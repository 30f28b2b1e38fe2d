"""What a judgement read from the disk, kept so that reusing it can tell whether it still
holds (``judge.judge``'s REUSE, a running agent's and a restarted one's).

The static part of a process's judgement reads files the process did not load: each site's
``*.dist-info`` directories, each distribution's ``METADATA``, ``RECORD`` and
``direct_url.json``, the directories searched for a ``*.dist-info`` and the standard library's
top-level modules. A workload that stages those for the moment the agent reads them (a
``RECORD`` row forged to match a patched file, a ``.dist-info`` moved away to hide a shadowed
install), then puts them back, would otherwise have that judgement kept for the life of the
process (found by an attacker who had not read this code, 2026-12-06).

So each read is kept as an ``Input``: the path, what kind of read it was, the path's identity
just before (device, inode, size, mtime, ctime) and a digest of what was read (the bytes; the
names of the ``*.dist-info`` directories listed; whether a file was there). ``unchanged``
takes each identity again: the same one answers at the cost of a ``stat``; any other (a file
written, a directory with an entry added or removed: its ctime moves, and no unprivileged
process can set a ctime back) is read again and its digest compared, so an unrelated change
(``/tmp`` gaining a file) costs a listing, not a judgement. Timestamps are coarse (a clock
tick): an identity whose ctime is less than ``YOUNG_S`` old when taken is kept as
``CHANGING`` and always read again, so a file changed twice within one tick is caught by its
digest. Anything that cannot be read again counts as changed.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from servewitness.evidence.regular import read_regular

# (dev, ino, size, mtime_ns, ctime_ns), or ABSENT, or CHANGING
Ident = tuple[int, ...]
ABSENT: Ident = ()
CHANGING: Ident = (-1,)
YOUNG_S = 1.0  # far above any filesystem's timestamp granularity
MAX_READ = 64 << 20  # an installer file read again larger than this counts as changed

# Kinds of read: a file's bytes, a directory's *.dist-info names, what is at a path
FILE, LISTING, EXISTS = "file", "listing", "exists"
DIST_INFO = ".dist-info"
# (path as the process names it, kind, identity before the read, digest of what was read)
Input = tuple[str, str, Ident, str]
UNREADABLE = "unreadable"  # the digest of a read that failed: never equal to a read again


def snapshot(host: str | Path) -> Ident:
    """The identity of HOST (a path this code can read) now, as kept for a judgement."""
    try:
        st = os.stat(host)
    except (FileNotFoundError, NotADirectoryError):
        return ABSENT
    except (OSError, ValueError):  # permission, a loop; ValueError: NUL, a lone surrogate
        return CHANGING
    return ident_of(st)


def ident_of(st: os.stat_result) -> Ident:
    """The identity ST gives, as kept for a judgement (``CHANGING`` when under YOUNG_S old)."""
    if st.st_ctime_ns > time.time_ns() - int(YOUNG_S * 1e9):
        return CHANGING
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def of_bytes(data: bytes | None) -> str:
    """The digest of a file read: its bytes' sha256, "" where there was no file."""
    return "" if data is None else hashlib.sha256(data).hexdigest()


def of_names(names: Iterable[str]) -> str:
    """The digest of a directory's ``*.dist-info`` names (NAMES, in any order)."""
    return hashlib.sha256("\0".join(sorted(names)).encode(errors="surrogateescape")).hexdigest()


def kind_of(st: os.stat_result | None) -> str:
    """The digest of a look at a path (``EXISTS``): what ``stat`` (links followed) says is
    there: "file", "dir", "other", or "" for nothing."""
    if st is None:
        return ""
    return "file" if stat.S_ISREG(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) else "other"


def look(host: str | Path) -> tuple[Ident, str]:
    """One ``stat`` of HOST: its identity and what is there (``kind_of``), from the same
    call."""
    try:
        st = os.stat(host)
    except (FileNotFoundError, NotADirectoryError):
        return ABSENT, kind_of(None)
    except (OSError, ValueError):
        return CHANGING, UNREADABLE
    return ident_of(st), kind_of(st)


def dist_infos(host: str | Path | int) -> list[str]:
    """The names of HOST's ``*.dist-info`` subdirectories (HOST: a path, or a descriptor of
    the directory). Raises OSError (FileNotFoundError and NotADirectoryError where there is
    no such directory) or ValueError (a bad name)."""
    return [name for name, is_dir, _ in _entries(host) if is_dir]


def linked_dist_infos(host: str | Path | int) -> list[str]:
    """The names of HOST's ``*.dist-info`` entries that are symbolic links, whatever they
    point at (nothing yet, a file): where they point can change without HOST changing."""
    return [name for name, _, linked in _entries(host) if linked]


def _entries(host: str | Path | int) -> list[tuple[str, bool, bool]]:
    with os.scandir(host) as it:  # an int: a descriptor of the directory
        return [(e.name, e.is_dir(), e.is_symlink()) for e in it if e.name.endswith(DIST_INFO)]


def unchanged(
    kept: Iterable[Input],
    to_host: Callable[[str], str | Path],
    memo: dict[Input, bool] | None = None,
) -> bool:
    """Whether every read of KEPT (paths as the process names them; TO_HOST: where this code
    reads each) would read the same now. MEMO: answers already found for reads of the same
    files (processes that see the same filesystem, at the same moment), added to."""
    for read in kept:
        same = memo.get(read) if memo is not None else None
        if same is None:
            path, kind, ident, digest = read
            host = to_host(path)
            same = (ident != CHANGING and snapshot(host) == ident) or (
                _digest_now(kind, host) == digest
            )
            if memo is not None:
                memo[read] = same
        if not same:
            return False
    return True


def _digest_now(kind: str, host: str | Path) -> str:
    read = _READS.get(kind)
    if read is None:
        return UNREADABLE  # a kind this code does not know: never the same
    try:
        return read(host)
    except (FileNotFoundError, NotADirectoryError):
        return of_bytes(None) if kind == FILE else of_names([])
    except ValueError:  # a name no file can have (NUL, a lone surrogate): as the index read it
        return of_names([]) if kind == LISTING else UNREADABLE
    except OSError:
        return UNREADABLE


_READS: dict[str, Callable[[str | Path], str]] = {
    FILE: lambda host: of_bytes(read_regular(host, MAX_READ)),
    LISTING: lambda host: of_names(dist_infos(host)),
    EXISTS: lambda host: look(host)[1],
}
