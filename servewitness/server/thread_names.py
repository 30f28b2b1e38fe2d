"""The verifier's threads named for the operating system, so that what each of them costs
shows where operators look: ``top -H``, ``ps -L -o tid,comm,pcpu``, ``/proc/PID/task/*/comm``
(the agents' calls, the status calls, the follower, the history keeper, the store writer's
threads). Python names its threads for itself only; every thread of a server process
otherwise shows the interpreter's name.

Before this, where a report's CPU went inside a verifier process was found with py-spy
(BENCHMARKS.md, "Status answers from what is kept"): the status calls were 7 % of a core and
the history keeper 7 %, not visible to any standard tool.

Linux only (``prctl(PR_SET_NAME)``, 15 bytes kept); elsewhere nothing is done. Process-wide,
so the command line's (``verifier serve``, each of its processes, the store writer's
included), not a test's or an embedding program's: threads started after
``name_threads_as_started`` name themselves on their first step (``threading.setprofile``: a
hook run once in each new thread, then removed).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import threading
from types import FrameType
from typing import Any

_PR_SET_NAME = 15  # linux/prctl.h
_NAME_BYTES = 15  # the kernel's TASK_COMM_LEN, less its NUL


def _prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    return getattr(libc, "prctl", None)


_PRCTL = _prctl()


def name_os_thread(name: str) -> bool:
    """Name the calling thread NAME for the operating system (its first 15 bytes, as UTF-8);
    whether it was named."""
    if _PRCTL is None:
        return False
    raw = name.encode("utf-8", "replace")[:_NAME_BYTES]
    return bool(_PRCTL(_PR_SET_NAME, ctypes.c_char_p(raw), 0, 0, 0) == 0)


def _first_step(frame: FrameType, event: str, arg: object) -> None:
    sys.setprofile(None)  # once per thread: no cost after its first step
    name_os_thread(threading.current_thread().name)


def name_threads_as_started() -> None:
    """Every thread started from now on names itself (its Python name) when it starts; this
    thread is named now."""
    name_os_thread(threading.current_thread().name)
    threading.setprofile(_first_step)
