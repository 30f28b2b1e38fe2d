"""SIGTERM/SIGINT stop a daemon even when they arrive while its main thread is inside
``Event.wait`` (servewitness/_stop_signals.py).

The failure, built for real: the signal is delivered while the main thread holds the stop
event's lock, as ``Event.wait`` does just after taking it back. A handler that calls
``Event.set`` there blocks on its own thread's lock for ever: the control shows that this is
what the old handler did (the process never ends). Each case runs in a process of its own, so
a hang is a timeout of that process, not of the suite.
"""

from __future__ import annotations

import subprocess
import sys

SCENARIO = """
import os, signal, sys, threading
from servewitness._stop_signals import stop_on_signals
stop = threading.Event()
if sys.argv[1] == "old":  # the handler every daemon had: set the event in the handler
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    guard = None
else:
    guard = stop_on_signals(stop)
    guard.__enter__()
with stop._cond:  # where Event.wait holds it
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(1000):  # the handler runs here, in this thread, the lock held
        pass
print("stopped" if stop.wait(30) else "not stopped", flush=True)
if guard is not None:
    guard.__exit__(None, None, None)
"""


def run(kind: str, timeout_s: float) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(
            [sys.executable, "-c", SCENARIO, kind],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None  # hung


def test_a_stop_signal_inside_the_events_lock_stops_the_daemon() -> None:
    out = run("new", 60)
    assert out is not None and out.returncode == 0, out
    assert out.stdout.splitlines()[-1] == "stopped"
    assert "signum=15" in out.stdout + out.stderr  # logged, by the watcher


def test_control_the_old_handler_hangs_there() -> None:
    assert run("old", 5) is None  # 5 s: it never ends (above: 30 s to stop)
