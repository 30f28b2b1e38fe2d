"""One process writes every serving process's reports: ``verifier serve --processes N``'s store
writer.

Why: N serving processes that each commit their own reports take turns at the database's one
write lock. Each holds it for its statements and its commit's fsync, and its statements wait
for its interpreter lock, which the process's request threads hold most of the time: two
processes on one SQLite file held the lock ~78 % of the wall clock while using ~125 % of two
cores, so reports waited ~200 ms and agents were paced (BENCHMARKS.md, "The write lock's
work"). One writer with no request threads runs the statements at the speed of its CPU, and
one commit (one fsync) covers the reports every serving process has waiting.

How: the first process starts the writer before it serves (``processes.serve``), with one end
of a ``socketpair`` per serving process (inherited file descriptors: no address anyone else
could connect to). A serving process builds a report's rows and digests itself
(``report_rows.prepare``), sends them (``RemoteWriter.save``), and waits for the writer's
answer: the rowid once the transaction holding the report committed, None if its seq was
stored already, or why it was not stored. The writer runs each report through the store's
group commit (``server/group_commit.py``), so reports from every process that wait together
commit together, and a report the database refuses fails alone.

Durability is unchanged: a serving process acknowledges a report only after the writer said
its transaction committed. Failure: a report the writer does not answer within ``ANSWER_S``
is refused (``StoreWriterError``, an ``OSError``: not acknowledged, the agent keeps it spooled
and retries; it may be stored, and the retry is then a duplicate). A connection to the writer
that is lost (the writer died, or dropped it) fails every report waiting on it, and its
serving process stops; the first process, seeing a process of the verifier exit, stops the
verifier (exit 4): never some processes serving while they can store nothing. Every other
write (runs, seals, targets, checkpoints) stays in the process that makes it, under the
database's write lock as before.

The messages are pickles between processes of one verifier, over descriptors only they hold:
each process is undumpable (``processes.undumpable``), so another process of the same user
cannot take them, except with ``CAP_SYS_PTRACE`` or during a process's start (before the
call). Each side sends from a thread of its own (``_Sender``): a peer that stops reading
blocks that thread, never the callers, which wait for their answers with a bound.
"""

from __future__ import annotations

import collections
import os
import signal
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from servewitness.server.db import WRITE_LOCK_WAIT_S
from servewitness.server.report_rows import PreparedReport

if TYPE_CHECKING:
    from servewitness.server.store import Store

log = structlog.get_logger("verifier.writer")

FDS_ENV = "VERIFIER_STORE_WRITER_FDS"  # the writer's ends, comma-separated
FD_ENV = "VERIFIER_STORE_WRITER_FD"  # a serving process's end
# How long a serving process waits for the writer's answer: the writer's own wait for the
# database's lock is bounded by WRITE_LOCK_WAIT_S, and a batch that fails is retried one report
# at a time; beyond this the writer is stopped or stuck, and the report is not acknowledged.
ANSWER_S = 6 * WRITE_LOCK_WAIT_S


class StoreWriterError(OSError):
    """The writer did not store the report: why (the database refused it, or the writer is
    gone or not answering). Not stored, so never acknowledged."""


@dataclass(frozen=True, slots=True)
class Answer:
    """The writer's answer to request ID: the rowid (None: its seq was stored already), or
    ERROR; TIMES: the writer's store's (transactions, lock wait s, lock held s) so far."""

    id: int
    rowid: int | None
    error: str | None
    times: tuple[int, float, float]


class _Waiting:
    __slots__ = ("answer", "done")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.answer: Answer | None = None


class _Sender:
    """The one thread that sends a connection's messages, in order: a peer that stops reading
    (stopped, stuck) blocks it once the socket's buffer is full, not the threads that handed it
    messages, which wait for their answers with a bound of their own. A message whose sender no
    longer WANTS it sent (its caller gave up waiting) is dropped unsent."""

    def __init__(self, conn: Connection, name: str, failed: Callable[[BaseException], None]):
        self._conn = conn
        self._failed = failed
        self._cond = threading.Condition()
        self._queue: collections.deque[tuple[bytes, Callable[[], bool]]] = collections.deque()
        self._closed = False
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def put(self, data: bytes, wanted: Callable[[], bool]) -> None:
        """Send DATA (a pickle, whole) once the ones before it are sent, if WANTED then."""
        with self._cond:
            self._queue.append((data, wanted))
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                data, wanted = self._queue.popleft()
            if not wanted():
                continue
            try:
                self._conn.send_bytes(data)
            except (OSError, ValueError) as e:  # ValueError: closed meanwhile
                self._failed(e)
                return


def _always() -> bool:
    return True


def pairs(n: int) -> list[tuple[socket.socket, socket.socket]]:
    """N socket pairs: (the writer's end, a serving process's end) each, inheritable."""
    out = []
    for _ in range(n):
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        a.set_inheritable(True)
        b.set_inheritable(True)
        out.append((a, b))
    return out


def connection(fd: int) -> Connection:
    """A ``Connection`` over the inherited socket FD (its framing and pickles)."""
    os.set_inheritable(fd, False)
    return Connection(fd)


class RemoteWriter:
    """A serving process's side: reports sent to the writer over CONN, each caller waiting for
    its own answer (any number of threads at once)."""

    def __init__(
        self,
        conn: Connection,
        answer_s: float = ANSWER_S,
        lost: Callable[[str], None] | None = None,
    ) -> None:
        self._conn = conn
        self._answer_s = answer_s
        self._on_lost = lost  # told once, why, when the connection is lost (the process stops)
        self._lock = threading.Lock()
        self._waiting: dict[int, _Waiting] = {}
        self._next = 0
        self._gone: str | None = None
        self.times = (0, 0.0, 0.0)  # the writer's store's write_times, as last answered
        self._sender = _Sender(conn, "store-writer-send", self._send_failed)
        self._reader = threading.Thread(target=self._read, name="store-writer", daemon=True)
        self._reader.start()

    def save(self, prepared: PreparedReport, receipt: object) -> int | None:
        """PREPARED stored by the writer (RECEIPT, a picklable callable, makes its receipt as
        its row is written): its rowid once committed, None if its seq was stored already.
        Raises StoreWriterError when it was not stored."""
        waiting = _Waiting()
        with self._lock:
            if self._gone is not None:
                raise StoreWriterError(self._gone)
            self._next += 1
            rid = self._next
            self._waiting[rid] = waiting
        try:
            data = bytes(ForkingPickler.dumps((rid, prepared, receipt)))
        except Exception as e:  # not sent (a receipt that does not pickle): refused alone
            with self._lock:
                self._waiting.pop(rid, None)
            raise StoreWriterError(f"the report could not be sent to the writer: {e}") from e
        # sent by the sender thread: a writer that stops reading blocks it, not this caller
        self._sender.put(data, lambda: rid in self._waiting)
        if not waiting.done.wait(self._answer_s):
            with self._lock:
                self._waiting.pop(rid, None)
            raise StoreWriterError(
                f"the store's writer process did not answer in {self._answer_s:g} s "
                "(stopped or stuck?); the report may be stored and is not acknowledged"
            )
        answer = waiting.answer
        if answer is None:
            raise StoreWriterError(self._gone or "the store's writer process is gone")
        if answer.error is not None:
            raise StoreWriterError(answer.error)
        return answer.rowid

    def _read(self) -> None:
        while True:
            try:
                answer = self._conn.recv()
            except (EOFError, OSError) as e:
                self._lost(f"the store's writer process is gone ({type(e).__name__})")
                return
            if not isinstance(answer, Answer):
                self._lost(f"the store's writer process sent {type(answer).__name__}")
                return
            self.times = answer.times
            with self._lock:
                waiting = self._waiting.pop(answer.id, None)
            if waiting is not None:  # None: its caller stopped waiting
                waiting.answer = answer
                waiting.done.set()

    def _lost(self, why: str) -> None:
        """Fail every report waiting, and every one after: the writer is gone."""
        with self._lock:
            first = self._gone is None
            if first:
                self._gone = why
                log.error("store_writer_lost", error=why)
            waiting, self._waiting = list(self._waiting.values()), {}
        for w in waiting:
            w.done.set()
        if first and self._on_lost is not None:
            self._on_lost(why)

    def _send_failed(self, e: BaseException) -> None:
        self._lost(f"the store's writer process is gone: {e}")

    def close(self) -> None:
        self._sender.close()
        self._conn.close()


def serve(store: Store, conns: Sequence[Connection], stop: threading.Event) -> None:
    """The writer's side: store every report CONNS send, answering each on its connection,
    until STOP or until every connection closed (its serving processes gone). A reader thread
    per connection queues the requests in the store's group commit; this thread leads its
    batches (``GroupCommit.lead_pending``: everything queued when a transaction gets the
    database's write lock goes into it), and each report is answered once it committed."""
    left = [len(conns)]
    lock = threading.Lock()  # LEFT, and each connection's close (here or by its reader)

    def gone(conn: Connection) -> None:
        with lock:
            conn.close()
            left[0] -= 1
            if left[0] == 0:
                stop.set()

    for i, c in enumerate(conns):
        t = threading.Thread(target=_requests, args=(store, c, i, gone), name=f"writer-conn-{i}")
        t.daemon = True
        t.start()

    def close_on_stop() -> None:
        stop.wait()
        store.reports.close()

    threading.Thread(target=close_on_stop, name="writer-stop", daemon=True).start()
    store.reports.lead_pending()
    with lock:  # wake the readers (a close would not): each closes its own connection
        for c in conns:
            if not c.closed:
                with socket.socket(fileno=os.dup(c.fileno())) as s:
                    s.shutdown(socket.SHUT_RDWR)
    log.info("store_writer_stopped")


def _requests(
    store: Store, conn: Connection, index: int, gone: Callable[[Connection], None]
) -> None:
    """Queue CONN's requests until it closes; each answered on CONN once done."""
    sender = _Sender(conn, f"writer-send-{index}", lambda e: None)  # gone: its reader sees it
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                return
            if not (
                isinstance(message, tuple)
                and len(message) == 3
                and isinstance(message[0], int)
                and isinstance(message[1], PreparedReport)
                and (message[2] is None or callable(message[2]))  # None: the report's own
            ):
                log.error("store_writer_bad_request", process=index, got=type(message).__name__)
                return  # a serving process's bug: its connection closes, its reports fail
            rid, prepared, receipt = message
            try:
                store.enqueue_prepared(prepared, receipt, _answer(store, sender, rid, prepared))
            except RuntimeError:  # closed: stopping
                return
    finally:
        sender.close()
        gone(conn)


def _answer(
    store: Store, sender: _Sender, rid: int, prepared: PreparedReport
) -> Callable[[int | None, BaseException | None], None]:
    def done(rowid: int | None, error: BaseException | None) -> None:
        if error is None:
            answer = Answer(rid, rowid, None, store.write_times())
        else:
            rep = prepared.rep
            log.error("report_not_stored", agent=rep.agent_id, seq=rep.seq, error=str(error))
            answer = Answer(rid, None, f"{type(error).__name__}: {error}", store.write_times())
        # by the connection's sender: a serving process that stops reading blocks only it
        sender.put(bytes(ForkingPickler.dumps(answer)), _always)

    return done


def run_writer(db: str | Path) -> None:
    """The writer process's main: its store on DB, its connections from ``FDS_ENV``; until
    SIGTERM/SIGINT or its serving processes are gone."""
    from servewitness._stop_signals import stop_on_signals
    from servewitness.errors import UsageError
    from servewitness.server.store import Store

    text = os.environ.get(FDS_ENV, "")
    try:
        fds = [int(f) for f in text.split(",")]
    except ValueError:
        raise UsageError(
            "--as-store-writer is given to the writer process --processes starts"
        ) from None
    from servewitness.server.memory import tune_gc

    conns = [connection(fd) for fd in fds]
    store = Store(db)
    tune_gc()
    stop = threading.Event()
    log.info("store_writer_started", connections=len(conns))
    try:
        with stop_on_signals(stop):
            serve(store, conns, stop)
    finally:
        store.close()


def use_from_env(store: Store) -> None:
    """In a serving process --processes started: have the writer process store its reports,
    when the first process gave it a connection to one (``FD_ENV``)."""
    fd = os.environ.pop(FD_ENV, None)
    if fd is not None:
        store.use_writer(RemoteWriter(connection(int(fd)), lost=_stop_this_process), False)


def _stop_this_process(why: str) -> None:
    """A serving process that lost its writer can store nothing: it stops (SIGTERM to itself,
    the graceful way), and the first process, seeing it exit, stops the verifier (exit 4),
    rather than leave it serving with reports refused for ever."""
    log.error("serving_process_stops", reason=why)
    os.kill(os.getpid(), signal.SIGTERM)
