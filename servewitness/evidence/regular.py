"""Opening a file the serving side may have swapped: regular files only, never blocking.

The serving process can replace a file it loaded, a RECORD or METADATA of its site-packages,
or a file of its probe directory with a FIFO (an open for reading waits for a writer: the
agent's collect hung for good and its target went STALE, the message blaming the network), a
device (``/dev/zero`` reads for ever; opening some devices acts) or a socket. Every read of
such a path here looks first (``stat``, or ``lstat`` where links are refused), opens with
``O_NONBLOCK`` and reads only what ``fstat`` says is a regular file; anything else is
:class:`NotRegular`, an ``OSError`` whose ``strerror`` says what it is, so each caller's
"unreadable (why)" path reports it. LIMIT bounds what one read takes into memory.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symbolic link"),
)


class NotRegular(OSError):
    """Not a regular file (or over the size asked): not opened, or closed unread."""


def _kind(mode: int) -> str:
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def _refuse(path: str | Path, st: os.stat_result) -> NotRegular:
    why = f"not a regular file: {_kind(st.st_mode)}"
    code = errno.ELOOP if stat.S_ISLNK(st.st_mode) else errno.EINVAL
    return NotRegular(code, why, str(path))


def open_regular(path: str | Path, *, nofollow: bool = False, look: bool = True) -> int:
    """A read-only descriptor for the regular file PATH (NOFOLLOW: a symbolic link is refused,
    errno ELOOP, as ``O_NOFOLLOW`` does). Raises OSError (NotRegular for anything else).
    LOOK=False skips the look before the open (the hasher's hot path): a FIFO is then opened
    without waiting and closed unread all the same."""
    if look:
        st = os.lstat(path) if nofollow else os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, st)  # a FIFO or a device is never opened
    return open_regular_stat(path, nofollow=nofollow)[0]


def open_regular_stat(path: str | Path, *, nofollow: bool = False) -> tuple[int, os.stat_result]:
    """``open_regular(PATH, look=False)`` and the ``fstat`` of the descriptor it checked: what
    the file is as opened (one system call fewer for a caller that needs it)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    fd = os.open(path, flags | (os.O_NOFOLLOW if nofollow else 0))
    try:
        now = os.fstat(fd)  # swapped between the look and the open
        if not stat.S_ISREG(now.st_mode):
            raise _refuse(path, now)
    except BaseException:
        os.close(fd)
        raise
    return fd, now


def open_file(path: str | Path, *, nofollow: bool = False) -> BinaryIO:
    """``open_regular`` as a binary file object."""
    return os.fdopen(open_regular(path, nofollow=nofollow), "rb")


def read_regular(path: str | Path, limit: int, *, nofollow: bool = False) -> bytes:
    """The whole of the regular file PATH, refused (NotRegular) when it holds more than LIMIT
    bytes. Raises OSError."""
    with open_file(path, nofollow=nofollow) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise NotRegular(errno.EFBIG, f"larger than {limit} bytes: not read", str(path))
    return data
