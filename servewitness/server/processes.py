"""``verifier serve --processes N``: one verifier served by N processes on one TCP port.

Why: a ``verifier serve`` is one Python process, and everything it does per report holds the
interpreter's lock: it uses one core however many the host gives it (BENCHMARKS.md, "Verifier
throughput"). N processes use N.

How: each process is a full verifier, a replica of the others on the one database (they
follow each other's reports and target events: ``server/follow.py``; the ledger stays one
chain, every write holding the database's write lock). They listen on the same port with
``SO_REUSEPORT``, so the kernel spreads new connections over them; an agent's connection stays
with one process (a reconnect may land on another, whose nonce it does not hold: it is told
"nonce mismatch" and says Hello again). Status reads answer from any process, each seeing what
the others stored within ``follow.FOLLOW_S``.

Their reports are stored by one more process, the store's writer (``server/writer_process.py``;
``--no-writer-process``: each serving process commits its own), so that the reports every
serving process has waiting commit together and the database's write lock is held by a process
with no request threads.

The first process (this one) starts serving before the others start, so the database's tables,
the default signing key and the ``--run`` registrations exist once; then it starts the others
as ``verifier serve`` with the same arguments and ``--process-index I`` (metrics on the
``--metrics-listen`` port plus I), and the writer before them. It supervises them all:
SIGTERM/SIGINT stops every process (the writer last); a process, the writer too, that exits on
its own stops the others and this one exits 4, so that whatever restarts the verifier restarts
all of it (never some processes serving while another is gone). The others are told to stop if
this one dies (``PR_SET_PDEATHSIG``, set by each as it starts), so none outlives it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

import structlog

from servewitness._stop_signals import stop_on_signals
from servewitness.errors import UnavailableError, UsageError
from servewitness.server import writer_process

if TYPE_CHECKING:
    from servewitness.server.app import VerifierServer

log = structlog.get_logger("verifier.serve")

MAX_PROCESSES = 64
WATCH_S = 0.2  # how often the processes are looked at
STOP_S = 30.0  # how long a process is given to stop before it is killed
LOST_S = 2.0  # how long a lost connection to the writer waits to be explained by an exit


def check_listen(listen: str, processes: int) -> None:
    """LISTEN can be shared by PROCESSES processes: TCP with a fixed port (a Unix socket has
    one relay and one owner; port 0 would give each process a port of its own)."""
    if not 1 <= processes <= MAX_PROCESSES:
        raise UsageError(f"--processes must be 1 to {MAX_PROCESSES}, got {processes}")
    if processes == 1:
        return
    if listen.startswith("unix:"):
        raise UsageError(
            f"--processes {processes} needs a TCP --listen HOST:PORT (processes share a port; "
            f"a Unix socket, {listen}, has one owner)"
        )
    _, _, port = listen.rpartition(":")
    if not (port.isascii() and port.isdigit()) or int(port) == 0:
        raise UsageError(f"--processes {processes} needs a fixed port in --listen, got {listen}")


def metrics_address(listen: str | None, index: int) -> str | None:
    """Process INDEX's metrics address: LISTEN's port plus INDEX (each process its own)."""
    if listen is None or index == 0:
        return listen
    from servewitness.metrics.http import parse_listen

    host, port = parse_listen(listen)
    if port == 0:
        return listen
    if port + index > 65535:
        raise UsageError(f"--metrics-listen {listen}: no port {port + index} for process {index}")
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{port + index}"


def child_argv(argv: Sequence[str], index: int) -> list[str]:
    """The command line of process INDEX: ARGV (this one's, after the program) without
    ``--processes`` and with ``--process-index INDEX``."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--processes":
            skip = True
            continue
        if arg.startswith("--processes="):
            continue
        out.append(arg)
    return [sys.executable, "-m", "servewitness", *out, "--process-index", str(index)]


PARENT_ENV = "VERIFIER_SERVE_PARENT"


def undumpable() -> None:
    """Make this process not dumpable (``PR_SET_DUMPABLE`` 0): another process of the same
    user can then neither ptrace it nor take its file descriptors (``pidfd_getfd``), such as
    its end of a socket pair to the store's writer (only a process with ``CAP_SYS_PTRACE``,
    root's, still can). No core dumps either: a verifier's memory holds its signing key."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE
        raise UnavailableError(
            f"cannot make the verifier's process undumpable: {os.strerror(ctypes.get_errno())}"
        )


def die_with_parent() -> None:
    """In a process --processes started: be sent SIGTERM when the first process dies
    (``PR_SET_PDEATHSIG``), and stop now if it is gone already (it died before this ran);
    undumpable, as the first process is."""
    parent = os.environ.get(PARENT_ENV)
    if parent is None:
        raise UsageError("--process-index is given to the processes --processes starts")
    undumpable()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != int(parent):
        raise UnavailableError("the verifier's first process is gone: not serving without it")


def serve(server: VerifierServer, processes: int, argv: Sequence[str], writer: bool = True) -> None:
    """Serve from SERVER (this process, index 0) and PROCESSES - 1 more, started from ARGV,
    their reports stored by one writer process (``server/writer_process.py``) when WRITER;
    block until SIGTERM/SIGINT or until a process exits on its own (UnavailableError)."""
    undumpable()  # and each process it starts: their socket pairs are theirs alone
    stop = threading.Event()
    others: list[tuple[str, subprocess.Popen[bytes]]] = []
    writers: list[tuple[str, subprocess.Popen[bytes]]] = []
    gone: str | None = None
    with stop_on_signals(stop):
        try:
            # Started before this one serves (no gRPC threads to fork beside), after it made the
            # tables, the default key and the --run registrations (VerifierServer's constructor).
            env = {**os.environ, PARENT_ENV: str(os.getpid())}
            ends = writer_process.pairs(processes) if writer else []
            if writer:
                fds = [a.fileno() for a, _ in ends]
                w = subprocess.Popen(
                    [*child_argv(argv, processes), "--as-store-writer"],
                    env={**env, writer_process.FDS_ENV: ",".join(map(str, fds))},
                    pass_fds=fds,
                )
                writers.append(("the store's writer process", w))
                log.info("process_started", index="writer", pid=w.pid)
            for i in range(1, processes):
                extra = {writer_process.FD_ENV: str(ends[i][1].fileno())} if writer else {}
                p = subprocess.Popen(
                    child_argv(argv, i),
                    env={**env, **extra},
                    pass_fds=[ends[i][1].fileno()] if writer else (),
                )
                others.append((f"serving process {i}", p))
                log.info("process_started", index=i, pid=p.pid)
            lost: list[str] = []

            def writer_lost(why: str) -> None:  # this process's connection: stop them all
                lost.append(why)
                stop.set()

            if writer:
                remote = writer_process.RemoteWriter(_own(ends), lost=writer_lost)
                server.store.use_writer(remote, True)
            for a, b in ends[1:]:  # the children hold them now
                a.close()
                b.close()
            server.start()
            print(f"verifier listening on {server.config.listen} (port {server.port}), "
                  f"{processes} processes" + (", one store writer" if writer else ""),
                  flush=True)  # fmt: skip
            print(server.key_line(), flush=True)
            while not stop.wait(WATCH_S):
                gone = _exited([*writers, *others])
                if gone is not None:
                    stop.set()
            if lost and gone is None:  # the writer's exit closed it, most likely: name that
                deadline = time.monotonic() + LOST_S
                while gone is None and time.monotonic() < deadline:
                    gone = _exited([*writers, *others])
                    time.sleep(0.02)
                gone = (
                    gone
                    or f"the first process lost its connection to the store's writer ({lost[0]})"
                )
        finally:
            _stop_all(server, others, writers)
    if gone is not None:
        raise UnavailableError(f"{gone}; the other processes were stopped")


def _exited(procs: list[tuple[str, subprocess.Popen[bytes]]]) -> str | None:
    """The first of PROCS that exited, said as the verifier's error (and logged); None: none."""
    for what, p in procs:
        code = p.poll()
        if code is not None:
            log.error("process_exited", process=what, pid=p.pid, code=code)
            return f"{what} (pid {p.pid}) exited with code {code}"
    return None


def _own(ends: list[tuple[socket.socket, socket.socket]]) -> Connection:
    """Process 0's connection to the writer (its end of the first pair; the writer's end of
    it is closed here, the writer holds it)."""
    mine, theirs = ends[0][1], ends[0][0]
    theirs.close()
    return writer_process.connection(mine.detach())


def _stop_all(
    server: VerifierServer,
    others: list[tuple[str, subprocess.Popen[bytes]]],
    writers: list[tuple[str, subprocess.Popen[bytes]]],
) -> None:
    """Stop the other serving processes (SIGTERM, then SIGKILL after STOP_S), then this one,
    then the writer (last: the serving processes' last reports still go to it)."""
    _stop(others)
    server.stop()
    _stop(writers)


def _stop(procs: list[tuple[str, subprocess.Popen[bytes]]]) -> None:
    for _, p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + STOP_S
    for _, p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
