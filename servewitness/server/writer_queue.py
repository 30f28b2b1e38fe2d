"""The writers' queue on an SQLite database file: an exclusive ``flock`` taken before SQLite's
own lock, waited for in the kernel (woken the moment the holder is done) but never for longer
than a bound.

Why the bound: the holder may never be done. A verifier process stopped mid-transaction
(SIGSTOP, a debugger, a frozen container) keeps its lock for as long as it is stopped, and
every other writer on the file would wait with it: reports hang until their agents' deadlines,
status calls pile up behind them, nothing says why. Bounded, a writer gives up with
:class:`WriterLockTimeout` (a store error: the report is refused, not acknowledged, and the agent
keeps it spooled) naming what is wrong.

How (a blocking ``flock`` cannot be interrupted from another thread): a try without waiting
first; when that fails, a thread of its own blocks in ``flock`` and the writer waits for it,
bounded. A writer that gives up leaves that thread waiting; the next writer takes it over
rather than start another (two waits on one open file would each believe they hold its one
lock), and when it gets the lock with no writer left wanting it, it lets it go at once.
"""

from __future__ import annotations

import fcntl
import os
import threading


class WriterLockTimeout(Exception):
    """Another writer held the database for longer than the bound: nothing was written."""

    def __init__(self, name: str, waited_s: float, more: str = "") -> None:
        super().__init__(
            f"{name}: another writer has held the verifier database for more than "
            f"{waited_s:g} s (a verifier process stopped in the middle of a transaction?"
            f"{more}); nothing was written"
        )


class WriterQueue:
    """An exclusive flock on the file at PATH (opened once more: flock locks belong to an open
    file, apart from SQLite's own locks on it, and die with the process), acquired within a
    bound; one holder at a time in this process (callers serialise their own use of it: one
    transaction at a time)."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self._name = path
        self._closed = False
        self._lock = threading.Lock()
        self._waiting: threading.Event | None = None  # set by the waiter once it holds the lock
        self._wanted = False  # a writer waits for the waiter's lock
        self.waits = 0  # acquisitions that had to wait (tests, debugging)

    def acquire(self, timeout_s: float) -> None:
        """Hold the lock, or raise :class:`WriterLockTimeout` after TIMEOUT_S."""
        with self._lock:
            got = self._waiting
            if got is None:
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return
                except BlockingIOError:
                    pass
                got = self._waiting = threading.Event()
                threading.Thread(target=self._wait, args=(got,), daemon=True).start()
            self._wanted = True
            self.waits += 1
        if got.wait(timeout_s):
            self._taken()
            return
        with self._lock:
            if got.is_set():  # it came as the wait ended
                self._waiting = None
                return
            self._wanted = False
        raise WriterLockTimeout(self._name, timeout_s)

    def _taken(self) -> None:
        with self._lock:
            self._waiting = None
            self._wanted = False

    def _wait(self, got: threading.Event) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except OSError:  # closed under it (the database closed): nobody holds it
            return
        with self._lock:
            if self._closed:  # its open file is gone, and the lock with it
                return
            if self._wanted:
                got.set()  # handed to the writer waiting for it
                return
            self._waiting = None  # given up on: let it go
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def release(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Close the file: its lock, if held, goes with it."""
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self._fd)
