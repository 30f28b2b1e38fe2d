"""The processes this process's own code starts, journaled as it starts them.

The agent reads a process's parent from ``/proc``, and the kernel's parent says nothing about
*who made* a child: a process forked before its parent ``exec``ed the judged server is the
server's child, and so is one a sibling makes with ``clone(CLONE_PARENT)`` (found by an
outside tester, 2026-12-07). ``all_code_claimed`` accepts a child's title-hidden ``-c`` code
only as its judged parent's choice (``policy/rules_claims._started_by``), so the parent's
probe says which children it started: one ``child`` record per process started through the
calls Python code starts processes with::

    {"k": "child", "pid": PID, "start_ticks": TICKS|null}

(``os.fork``, ``os.forkpty``, ``os.posix_spawn``, ``os.posix_spawnp``, and
``_posixsubprocess.fork_exec``: ``subprocess`` and ``multiprocessing``'s spawn and forkserver
start their processes with it), PID in this process's PID namespace, TICKS its start time
read from ``/proc`` at once (null if it already exited). A process started from C without
these calls is not recorded: its ``-c`` is then not taken as the parent's (fails closed).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from servewitness_probe import _core
from servewitness_probe import layout as L

MAX_RECORDED = 1024  # children journaled per process: more are counted as an error
_installed = False
_recorded: dict[int, int] = {}  # pid -> children journaled (a forked child starts at 0)


def install() -> None:
    """Wrap the calls that start processes (once per interpreter; never raises)."""
    global _installed
    if _installed:
        return
    _installed = True
    _wrap(os, "fork", lambda r: r)
    _wrap(os, "forkpty", lambda r: r[0])
    _wrap(os, "posix_spawn", lambda r: r)
    _wrap(os, "posix_spawnp", lambda r: r)
    try:
        import _posixsubprocess
    except ImportError:
        return
    original = getattr(_posixsubprocess, "fork_exec", None)
    _wrap(_posixsubprocess, "fork_exec", lambda r: r)
    # subprocess binds fork_exec at its import (``from _posixsubprocess import fork_exec as
    # _fork_exec``): imported before the probe started (the plugin probe, always), it keeps
    # the original unless its own name is rebound too
    sub = sys.modules.get("subprocess")
    if sub is not None and original is not None and getattr(sub, "_fork_exec", None) is original:
        setattr(sub, "_fork_exec", _posixsubprocess.fork_exec)  # noqa: B010 - not typed


def _wrap(module: Any, name: str, pid_of: Callable[[Any], Any]) -> None:
    original = getattr(module, name, None)
    if original is None or getattr(original, "_servewitness_child", False):
        return

    def started(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        try:
            pid = pid_of(result)
            if isinstance(pid, int) and pid > 0:  # 0: this is the child
                _record(pid)
        except Exception:  # noqa: BLE001 - never break the caller
            pass
        return result

    started._servewitness_child = True  # type: ignore[attr-defined]
    started.__wrapped__ = original  # type: ignore[attr-defined]
    started.__name__ = getattr(original, "__name__", name)
    started.__doc__ = getattr(original, "__doc__", None)
    setattr(module, name, started)


def _record(pid: int) -> None:
    st = _core.STATE
    if st is None or st.pid != os.getpid():
        return
    n = _recorded.get(st.pid, 0)
    _recorded[st.pid] = n + 1
    if n >= MAX_RECORDED:
        if n == MAX_RECORDED:
            _core.report_error("children", f"more than {MAX_RECORDED} children: not journaled")
        return
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            ticks: int | None = L.start_ticks(f.read())
    except (OSError, ValueError, IndexError):
        ticks = None
    st.emit({"k": "child", "pid": pid, "start_ticks": ticks})
