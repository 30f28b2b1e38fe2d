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

from servewitness_probe import _postimport
from servewitness_probe import layout as L
from servewitness_probe._state import ProbeState, identity

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


def report_error(where: str, msg: str, by: str | None = None) -> None:
    """Record a probe error; BY: the file of the code that caused it, when known."""
    if STATE is not None:
        STATE.error(where, msg, by)


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
        _gc_dead(probe_dir(), *identity())
        new = ProbeState(probe_dir(), mode if previous is None else "fork")
        if previous is not None:
            # A forked child inherits its parent's journal fd: it is not the child's to hold
            # (a reader takes the files a process holds open for its own).
            previous.close()
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
    # The directory goes first: a reader in between would find the files no longer held.
    if os.environ.get("VERIFIER_PROBE_KEEP", "") in ("", "0"):
        shutil.rmtree(st.dir, ignore_errors=True)
    st.close()


def _gc_dead(root: str, boot_id: str, pid_ns: int) -> None:
    """Remove the state directories under ROOT that can belong to no live process, and only
    those this process can judge. ROOT may be shared (``/dev/shm`` mounted into several
    containers), so a directory is removed only when its name says it is

    * of another boot (nothing of an earlier boot is alive), or
    * of this boot and this process's PID namespace (BOOT_ID, PID_NS), and its pid is dead in
      this namespace's ``/proc``, or runs with another start time (the pid was reused).

    Never a directory of another PID namespace: its pid means another process there, and this
    ``/proc`` cannot see it. Never a legacy ``<pid>-<start ticks>`` name (an older probe's): it
    carries no namespace, so on a shared ROOT it may be a live process's of another container;
    such a process removes its own at exit, and ``/dev/shm`` is emptied at reboot. Nothing is
    removed by liveness when this process's ``/proc`` is not its own namespace's (``unshare
    --pid`` without remounting ``/proc``): its pids would be another namespace's."""
    mine = L.boot_prefix(boot_id)
    if mine == L.UNKNOWN_BOOT:
        return
    try:
        names = os.listdir(root)
    except OSError:
        return
    own_proc: bool | None = None
    for name in names:
        parsed = L.parse_dir_name(name)
        if parsed is None or parsed.boot is None or parsed.boot == L.UNKNOWN_BOOT:
            continue
        if parsed.boot != mine:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            continue
        if parsed.pid_ns != pid_ns or pid_ns == 0:
            continue
        if own_proc is None:
            own_proc = _proc_is_own_namespace()
        if own_proc and not _alive(parsed.pid, parsed.start_ticks):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _alive(pid: int, start_ticks: int) -> bool:
    """Whether PID, in this process's /proc, runs and started at START_TICKS."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return L.start_ticks(data) == start_ticks
    except (OSError, ValueError, IndexError):
        return False


def _proc_is_own_namespace() -> bool:
    """Whether ``/proc`` shows this process's own PID namespace: its ``NSpid`` line then holds
    one pid, its own (a /proc of an outer namespace lists the outer pids first)."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"NSpid:"):
                    return line.split()[1:] == [str(os.getpid()).encode()]
    except OSError:
        pass
    return False
