"""SIGTERM and SIGINT ask a daemon to stop: they set a ``threading.Event``, set from a thread of
its own, never from the signal handler.

Why: a Python signal handler runs in the main thread between two bytecodes, wherever that
thread is, also inside ``Event.wait`` just after it took the event's lock back (the lock is not
re-entrant). A handler that calls ``Event.set`` there waits for a lock its own thread holds,
for ever: a verifier's second process, sent SIGTERM by the kernel when the first died, hung
that way in ``tests/test_processes.py`` (seen once in a few hundred runs; py-spy showed the
main thread in ``Event.set`` under ``Condition.wait``). So the handler only writes the signal's
number to a pipe (``os.write`` takes no Python lock), and a watcher thread reads it, logs it,
and sets the event.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

import structlog

log = structlog.get_logger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """While inside, SIGTERM/SIGINT set STOP; the previous handlers are restored after. Call
    from the main thread (only it may install signal handlers)."""
    r, w = os.pipe2(os.O_CLOEXEC)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(OSError):  # the pipe full: a stop is already on its way
            os.write(w, bytes([signum]))

    def watch() -> None:
        while True:
            got = os.read(r, 64)
            if not got:  # the write end closed: leaving
                return
            for signum in got:
                log.info("signal", signum=signum)
            stop.set()

    os.set_blocking(w, False)
    watcher = threading.Thread(target=watch, name="stop-signals", daemon=True)
    watcher.start()
    previous = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        os.close(w)
        watcher.join(timeout=5)
        os.close(r)
