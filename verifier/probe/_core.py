"""The probe's process-wide singleton: start once per pid, survive fork, clean up at exit.

``COUNTERS`` is the current process's counter view; hot paths read it through this module
(``_core.COUNTERS``) so that a fork, which replaces the state, is picked up without any
per-call pid check.
"""

from __future__ import annotations

import array
import atexit
import os
import shutil
import threading
from collections.abc import Callable

from verifier.probe import _postimport
from verifier.probe import layout as L
from verifier.probe._state import ProbeState

STATE: ProbeState | None = None
# Private counters until the probe starts, so a hook fired early never fails.
COUNTERS: memoryview = (
    memoryview(array.array("Q", bytes(L.SLOT_BYTES * L.N_SLOTS))).cast("B").cast("Q")
)
_start_lock = threading.Lock()
_fork_registered = False
_after_fork_starters: list[Callable[[], None]] = []  # e.g. restart the sweeper thread


def probe_dir() -> str:
    return os.environ.get(L.ENV_PROBE_DIR) or L.DEFAULT_PROBE_DIR


def disabled() -> bool:
    return os.environ.get(L.ENV_PROBE_DISABLE, "") not in ("", "0")


def report_error(where: str, msg: str) -> None:
    if STATE is not None:
        STATE.error(where, msg)


def state(mode: str = "lazy") -> ProbeState:
    """The current process's state, created on first use."""
    global STATE, COUNTERS, _fork_registered
    st = STATE
    if st is not None and st.pid == os.getpid():
        return st
    with _start_lock:
        if STATE is not None and STATE.pid == os.getpid():
            return STATE
        previous = STATE
        _gc_dead(probe_dir())
        new = ProbeState(probe_dir(), mode if previous is None else "fork")
        if previous is not None:
            new.emit({"k": "fork", "parent_pid": previous.pid})
            for name, target, source in previous.declared:
                new.hook_index(name, target, source)
            for rec in previous.replay:
                new.remember({**rec, "inherited": True})
        STATE = new
        COUNTERS = new.counters
        if previous is None:
            atexit.register(_cleanup)
            _postimport.install(report_error)
        if not _fork_registered:
            os.register_at_fork(after_in_child=_after_fork)
            _fork_registered = True
    return new


def _after_fork() -> None:
    # The child keeps the parent's wrappers and declarations; give it its own state.
    st = STATE
    if st is None:
        return
    st.lock = threading.Lock()
    try:
        state("fork")
        for starter in _after_fork_starters:
            starter()
    except Exception as e:  # noqa: BLE001 - a probe never raises
        report_error("fork", f"{type(e).__name__}: {e}")


def on_fork(starter: Callable[[], None]) -> None:
    """Run STARTER in a forked child once its state exists (threads do not survive fork)."""
    if starter not in _after_fork_starters:
        _after_fork_starters.append(starter)


def _cleanup() -> None:
    st = STATE
    if st is None or st.pid != os.getpid():
        return
    st.close()
    if os.environ.get("VERIFIER_PROBE_KEEP", "") in ("", "0"):
        shutil.rmtree(st.dir, ignore_errors=True)


def _gc_dead(root: str) -> None:
    """Remove state directories of processes that no longer exist (same boot only)."""
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        pid_s, _, ticks_s = name.partition("-")
        if not (pid_s.isdigit() and ticks_s.isdigit()):
            continue
        try:
            with open(f"/proc/{pid_s}/stat", "rb") as f:
                data = f.read()
            alive = L.start_ticks(data) == int(ticks_s)
        except (OSError, ValueError, IndexError):
            alive = False
        if not alive:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
