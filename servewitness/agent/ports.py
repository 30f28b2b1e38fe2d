"""Who serves the port a measured API server was started to listen on.

The attack (found by a black-box attacker, 2026-12-05): code in the measured API server
double-forks a patched twin of the server, outside the ``--pid`` tree (``setsid``, adopted by
init) and without the probe, which takes the server's port; the measured process rebinds
itself elsewhere and keeps itself busy, so its evidence is real and live. The benchmark's
requests went to the twin, and the verdict and the signed seal said PASS and held.

The agent reads, for every API server it reports, the port its command line names
(``--port``, vLLM's 8000 when none) and the TCP sockets in LISTEN state on it in the
server's network namespace (``/proc/<pid>/net/tcp``, ``tcp6``), or for ``--uds PATH`` the
listening Unix sockets bound to PATH (``/proc/<pid>/net/unix``: a second attacker renamed the
server's socket file and bound a twin to the name), and which processes hold them
(``/proc/<pid>/fd``). A port that no process of the tree listens on, or that a process
outside the tree listens on too (``SO_REUSEPORT`` shares the connections), is said: the
agent cannot see what serves the requests sent there (``evidence.unobservable``, which keeps
the gate from PASS). A port nobody listens on yet (a server starting) says nothing: no
process there answers the requests sent to it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from servewitness.evidence.process import ProcessEvidence

DEFAULT_PORT = 8000  # vLLM's OpenAI server when no --port is given
MAX_SCAN = 4096  # processes looked at to name who else listens (a container has a few)
_LISTEN = "0A"
_ACCEPTCON = 0x10000  # a Unix socket that listens (/proc/net/unix's Flags)


def served_uds(cmdline: Iterable[str]) -> str | None:
    """The Unix socket an API server's command line asks it to serve (``--uds``), if any."""
    args = list(cmdline)
    for i, a in enumerate(args):
        if a == "--uds" and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--uds="):
            return a.partition("=")[2]
    return None


def listening_unix(proc: Path, pid: int, path: str) -> set[int]:
    """The inodes of the Unix sockets listening that were bound to PATH, in PID's network
    namespace (``/proc/<pid>/net/unix`` keeps the name a socket was bound to, even after its
    file was renamed)."""
    out: set[int] = set()
    try:
        lines = (proc / str(pid) / "net" / "unix").read_text().splitlines()[1:]
    except OSError:
        return out
    want = {path, os.path.normpath(path)}
    for line in lines:
        f = line.split(maxsplit=7)
        if len(f) < 8 or f[7] not in want or not f[6].isdigit():
            continue
        try:
            accepting = int(f[3], 16) & _ACCEPTCON
        except ValueError:
            continue
        if accepting:
            out.add(int(f[6]))
    return out


def served_port(cmdline: Iterable[str]) -> int | None:
    """The port an API server's command line asks for; None: it serves a Unix socket
    (``--uds``, ``served_uds``) or names a port that is not one."""
    args = list(cmdline)
    port: str | None = None
    for i, a in enumerate(args):
        if a == "--uds" or a.startswith("--uds="):
            return None
        if a == "--port" and i + 1 < len(args):
            port = args[i + 1]
        elif a.startswith("--port="):
            port = a.partition("=")[2]
    if port is None:
        return DEFAULT_PORT
    return int(port) if port.isascii() and port.isdigit() and 0 < int(port) < 65536 else None


def listening_inodes(proc: Path, pid: int, port: int) -> set[int]:
    """The inodes of the TCP sockets in LISTEN state on PORT in PID's network namespace."""
    out: set[int] = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc / str(pid) / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == _LISTEN and f[1].rpartition(":")[2] == f"{port:04X}":
                out.add(int(f[9]) if f[9].isdigit() else -1)
    out.discard(-1)
    return out


def socket_inodes(proc: Path, pid: int) -> set[int]:
    """The inodes of the sockets PID holds (an unreadable process: none)."""
    fds = proc / str(pid) / "fd"
    out: set[int] = set()
    try:
        names = os.listdir(fds)
    except OSError:
        return out
    for fd in names:
        try:
            link = os.readlink(fds / fd)
        except OSError:
            continue
        if link.startswith("socket:[") and link.endswith("]") and link[8:-1].isdigit():
            out.add(int(link[8:-1]))
    return out


def _holders(proc: Path, inodes: set[int], skip: set[int]) -> list[int]:
    """Processes outside SKIP holding a socket of INODES (at most MAX_SCAN looked at)."""
    found: list[int] = []
    try:
        pids = sorted(int(e) for e in os.listdir(proc) if e.isascii() and e.isdigit())
    except OSError:
        return found
    for pid in pids[:MAX_SCAN]:
        if pid in skip or pid == os.getpid():
            continue
        if socket_inodes(proc, pid) & inodes:
            found.append(pid)
    return found


def _command(proc: Path, pid: int) -> str:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "?"
    text = " ".join(a.decode(errors="replace") for a in raw.split(b"\0") if a)
    return text[:120] + ("..." if len(text) > 120 else "")


def port_problems(proc: Path, found: list[ProcessEvidence], tree: set[int]) -> list[str]:
    """What the agent cannot see about who serves the port of each API server of FOUND
    (see above). TREE: the pids of the measured tree (every process under ``--pid``).

    Only the vLLM processes the agent reports (FOUND) count as serving: a helper of the tree
    that holds the port (a proxy the server started, forwarding to a twin elsewhere) is named
    as well, as a process the agent does not report."""
    reported = {p.identity.pid for p in found}
    out: list[str] = []
    for p in found:
        if p.role != "api_server":
            continue
        pid = p.identity.pid
        uds = served_uds(p.identity.cmdline)
        port = served_port(p.identity.cmdline)
        if uds is not None:
            listening, what = listening_unix(proc, pid, uds), f"socket {uds}"
        elif port is not None:
            listening, what = listening_inodes(proc, pid, port), f"port {port}"
        else:
            continue
        mine = set().union(*(socket_inodes(proc, t) for t in reported)) & listening
        others = _holders(proc, listening, reported)  # a socket shared with them counts too
        where = {o: "in the tree, not vLLM" if o in tree else "outside the tree" for o in others}
        named = ", ".join(f"pid {o} ({_command(proc, o)}; {where[o]})" for o in others)
        if not mine and others:
            out.append(
                f"the API server (pid {pid}) was started to serve {what}, but no vLLM "
                f"process the agent reports listens there; {named} does: requests sent there "
                "are served by a process the agent does not report"
            )
        elif others:
            out.append(
                f"the API server (pid {pid}) listens on {what}, and so does {named}: "
                "requests sent there may be served by a process the agent does not report"
            )
    return out
