"""Where a process's standard library is: the interpreter's, as CPython finds it, not what the
process says (``sys._stdlib_dir``, which any code in it can set)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from servewitness.evidence.distindex import norm_path
from servewitness.evidence.probe_reader import ProbeState
from servewitness.evidence.procfs import ProcFS
from servewitness.evidence.regular import read_regular

_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.|$)")


def stdlib_dirs(
    procfs: ProcFS, pid: int, probe: ProbeState, environ: Mapping[str, str]
) -> tuple[tuple[str, ...], str | None]:
    """The process's standard library directories, and why they are not simply the ones its
    probe names (None: they are; none yet before the sweeper's first pass).

    The probe records ``sys._stdlib_dir``, which any code in the process can set: a
    directory of its own named the standard library makes a module there that shadows the
    real standard library's ``stdlib``, and the shadowing is never seen. So the agent finds
    the standard library of the interpreter the kernel runs (``interpreter_stdlib``) and
    believes the probe only where the two agree; otherwise that one stands (and the
    difference is said), or, when none can be found, no directory is the standard library's
    (and that is said)."""
    claimed = probe.interp.get("stdlib")
    if not isinstance(claimed, str):
        return (), None
    version = probe.interp.get("version")
    version = version if isinstance(version, str) else ""
    home = environ.get("PYTHONHOME")
    found = interpreter_stdlib(procfs, pid, version, home)
    if home and found is None:
        own = interpreter_stdlib(procfs, pid, version)
        why = (
            f"PYTHONHOME names {home.split(':')[0]!r}, which is not the installation of the "
            "interpreter the kernel runs (/proc/<pid>/exe, its pyvenv.cfg): a prefix anyone "
            "could fill is not taken for the standard library"
            + (f"; {own} stands" if own else "; none is")
        )
        return ((own, f"{own}/lib-dynload") if own else ()), why
    if found is not None and norm_path(claimed) == found:
        return (found, f"{found}/lib-dynload"), None
    if found is not None:
        why = (
            f"the probe names {claimed!r} (sys._stdlib_dir, the process's to set), but the "
            f"interpreter it runs has its standard library in {found}: {found} stands"
        )
        return (found, f"{found}/lib-dynload"), why
    why = (
        f"the probe names {claimed!r} (sys._stdlib_dir, the process's to set), and no standard "
        "library of the interpreter it runs (/proc/<pid>/exe, PYTHONHOME, pyvenv.cfg) was "
        "found to confirm it: no directory is taken for the standard library"
    )
    return (), why


def interpreter_stdlib(
    procfs: ProcFS, pid: int, version: str, home: str | None = None
) -> str | None:
    """The standard library directory of the interpreter PID runs, as CPython finds it on
    POSIX: ``<prefix>/lib/python<X.Y>``, the prefix being the ``home`` of a ``pyvenv.cfg``
    beside the executable's directory (a virtualenv made with copies), else the executable's
    directory's parent; with HOME (``PYTHONHOME`` as the process was started:
    ``judge.started_environment``), only the one of those it names (a PYTHONHOME elsewhere, a
    directory anyone could fill with the standard library's files and one of their own, finds
    none); the one whose
    ``os.py`` exists (CPython's landmark). X.Y: the probe's version (digits only, so a forged
    one can only pick a directory that does not exist, or another real interpreter's)."""
    m = _VERSION.match(version)
    if m is None:
        return None
    try:
        exe = os.readlink(procfs.root / str(pid) / "exe").removesuffix(" (deleted)")
    except OSError:
        return None
    bindir = os.path.dirname(exe)
    cfg = _pyvenv_home(procfs.in_root(pid, f"{os.path.dirname(bindir)}/pyvenv.cfg"))
    prefixes = [os.path.dirname(cfg)] if cfg else []
    prefixes.append(os.path.dirname(bindir))
    if home:  # only where it names the interpreter's own installation
        wanted = norm_path(home.split(":")[0])
        prefixes = [p for p in prefixes if norm_path(p) == wanted]
    for prefix in prefixes:
        found = norm_path(f"{prefix}/lib/python{m.group(1)}.{m.group(2)}")
        if found.startswith("/") and procfs.in_root(pid, f"{found}/os.py").is_file():
            return found
    return None


def _pyvenv_home(cfg: Path) -> str | None:
    """The ``home`` key of a pyvenv.cfg (the base interpreter's directory), if any."""
    try:
        text = read_regular(cfg, 1 << 20).decode(errors="replace")[:65536]
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "home" and value.strip():
            return value.strip()
    return None
