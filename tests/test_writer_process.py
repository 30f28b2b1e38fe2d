"""The store's writer process (servewitness/server/writer_process.py): serving processes send
their reports' rows to one writer, which commits what every one of them has waiting in one
transaction, and a report is acknowledged only once the writer said it committed.

Real stores (SQLite and PostgreSQL), real socket pairs between a serving side and the writer
(in one process here: the same code as across processes, a pickle over a socket), real
faults: the database refusing one report mid-batch (a trigger), a writer that goes away with a
report in flight, one that never answers, one sent a message that is not a report; and real
`verifier serve --processes 2` processes with the writer SIGKILLed while agents report.
Batches are made deterministic by holding the writer's store (as a transaction in progress
does); no wall-clock thresholds: the tests assert counts and what is stored.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from servewitness.server import follow, report_rows, writer_process
from servewitness.server.store import Store, StoredReport
from servewitness.server.writer_process import RemoteWriter, StoreWriterError
from tests.helpers import Backend
from tests.test_group_commit import HUNG_S, REFUSE, agent_loop, stored, wait_for
from tests.test_listen_exclusive import free_port, serving
from tests.test_processes import (
    DEADLINE_S,
    alive,
    children,
    is_writer,
    verifier,
    wait_until,
)


def prepared(agent: str, seq: int = 1) -> report_rows.PreparedReport:
    rep = StoredReport(agent, seq, "t-" + agent, 100.0, b"report of " + agent.encode())
    return report_rows.prepare(rep, [], [])


@contextlib.contextmanager
def writer(store: Store, fronts: int) -> Iterator[list[RemoteWriter]]:
    """The writer's side serving STORE in a thread, and FRONTS serving sides connected to it."""
    ends = writer_process.pairs(fronts)
    conns = [writer_process.connection(a.detach()) for a, _ in ends]
    remotes = [RemoteWriter(writer_process.connection(b.detach())) for _, b in ends]
    stop = threading.Event()
    t = threading.Thread(target=writer_process.serve, args=(store, conns, stop), daemon=True)
    t.start()
    try:
        yield remotes
    finally:
        stop.set()
        t.join(HUNG_S)
        for r in remotes:
            r.close()
    assert not t.is_alive(), "the writer did not stop"


def save_from_fronts(
    store: Store, remotes: list[RemoteWriter], agents: list[str]
) -> dict[str, int | BaseException | None]:
    """Every agent's report sent by a serving side of its own (round robin over REMOTES) while
    the writer's store is held, so that all of them are queued before its transaction has the
    lock; each one's answer (rowid, or what was raised)."""
    out: dict[str, int | BaseException | None] = {}

    def save(i: int, agent: str) -> None:
        try:
            receipt = follow.ReceiptAt("agent:" + agent, 0.0)
            out[agent] = remotes[i % len(remotes)].save(prepared(agent), receipt)
        except BaseException as e:  # noqa: BLE001 - asserted by the test
            out[agent] = e

    threads = [threading.Thread(target=save, args=(i, a)) for i, a in enumerate(agents)]
    with store._lock:  # a transaction in progress: every report arrives and waits
        for t in threads:
            t.start()
        wait_for("every report queued", lambda: len(store.reports._pending) == len(agents))
        wait_for("a leader", lambda: store.reports._leading)
    for t in threads:
        t.join(HUNG_S)
    return out


def test_reports_of_several_serving_processes_commit_in_one_transaction(backend: Backend) -> None:
    """Six reports sent by three serving sides while the writer's store is busy take ONE
    transaction: the writer's thread takes its batch once it holds the lock, whichever
    connection each came by. Each sender gets its own rowid (distinct), every report is stored
    with the receipt its sender made, and the ledger verifies. The serving sides learn the
    writer's transaction count (what process 0's metrics add to its own)."""
    agents = [f"a{i}" for i in range(6)]
    s = Store(backend.target)
    try:
        with writer(s, 3) as remotes:
            before = s.transactions
            out = save_from_fronts(s, remotes, agents)
            assert s.transactions - before == 1
            assert s.reports.batches[-1:] == [6]
            rowids = [out[a] for a in agents]
            assert all(isinstance(r, int) for r in rowids), out
            assert len(set(rowids)) == 6
            assert max(r.times[0] for r in remotes) == s.transactions
    finally:
        s.close()
    assert stored(backend.target) == {(a, 1) for a in agents}
    assert backend.check().ok
    check = Store(backend.target)
    try:
        receipts = {r.agent_id: follow.parse_receipt(r.receipt) for r in check.latest_reports()}
    finally:
        check.close()
    assert {a: r.authenticated_as for a, r in receipts.items() if r is not None} == {
        a: "agent:" + a for a in agents
    }


def test_a_report_the_database_refuses_fails_alone_through_the_writer(backend: Backend) -> None:
    """The database refuses one report of a batch the writer took from several serving sides:
    each is tried alone, only the refused one fails, and its sender gets a StoreWriterError
    (an OSError: the servicer refuses the report, never acknowledges it) carrying the
    database's reason. Negative control: the refused report is not stored."""
    s = Store(backend.target)
    backend.sql(*REFUSE["postgresql" if backend.target.startswith("postgres") else "sqlite"])
    agents = ["a0", "a1", "refused", "a3", "a4", "a5"]
    try:
        with writer(s, 2) as remotes:
            out = save_from_fronts(s, remotes, agents)
            refused = out.pop("refused")
            assert isinstance(refused, StoreWriterError), refused
            assert isinstance(refused, OSError) and "refused by the test" in str(refused)
            assert all(isinstance(r, int) for r in out.values()), out
            assert s.reports.batches[-7:] == [6, 1, 1, 1, 1, 1, 1]
    finally:
        s.close()
    assert stored(backend.target) == {(a, 1) for a in agents if a != "refused"}
    assert backend.check().ok


def _front() -> tuple[Connection, RemoteWriter]:
    """A serving side, and the writer's end of its connection (played by the test)."""
    ((a, b),) = writer_process.pairs(1)
    return writer_process.connection(a.detach()), RemoteWriter(
        writer_process.connection(b.detach()), answer_s=HUNG_S
    )


def test_a_writer_gone_mid_report_fails_it_and_every_report_after() -> None:
    """The writer's end closes after it received a report and before it answered (the writer
    process died): the sender gets StoreWriterError, not a rowid, and so does every later
    report, at once (no wait: the writer is known gone)."""
    theirs, front = _front()
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(_outcome(front, "a0")))
    t.start()
    _, rep, receipt = theirs.recv()  # the writer received it ...
    assert (rep.rep.agent_id, receipt) == ("a0", follow.ReceiptAt(None, 0.0))
    theirs.close()  # ... and died before answering
    t.join(HUNG_S)
    (outcome,) = got
    assert isinstance(outcome, StoreWriterError) and "gone" in str(outcome), outcome
    later = _outcome(front, "a1")
    assert isinstance(later, StoreWriterError) and "gone" in str(later), later
    front.close()


def test_a_writer_that_never_answers_is_waited_for_a_bounded_time() -> None:
    """The writer took the report and never answers (stopped, stuck): the sender is told so
    after the bound (StoreWriterError saying the report may be stored: an agent's retry is then
    a duplicate, acknowledged once it is stored), not left waiting for ever."""
    ((a, b),) = writer_process.pairs(1)
    theirs = writer_process.connection(a.detach())
    front = RemoteWriter(writer_process.connection(b.detach()), answer_s=0.2)
    outcome = _outcome(front, "a0")
    assert isinstance(outcome, StoreWriterError), outcome
    assert "did not answer in 0.2 s" in str(outcome)
    assert theirs.recv()[1].rep.agent_id == "a0"  # it was sent
    theirs.close()
    front.close()


def test_a_message_that_is_not_a_report_closes_only_its_connection(backend: Backend) -> None:
    """A serving side sends the writer something that is not (id, prepared report, receipt):
    the writer drops that connection (its sender's reports fail: StoreWriterError) and goes
    on serving the others, whose reports are stored. Negative control: nothing of the bad
    message is stored."""
    s = Store(backend.target)
    try:
        with writer(s, 2) as (bad, good):
            bad._conn.send((1, {"rep": "not a report"}, "not callable"))
            wait_for("the bad connection dropped", lambda: bad._gone is not None)
            outcome = _outcome(bad, "a0")
            assert isinstance(outcome, StoreWriterError), outcome
            assert isinstance(_outcome(good, "a1"), int)
    finally:
        s.close()
    assert stored(backend.target) == {("a1", 1)}
    assert backend.check().ok


def _outcome(front: RemoteWriter, agent: str) -> object:
    try:
        return front.save(prepared(agent), follow.ReceiptAt(None, 0.0))
    except StoreWriterError as e:
        return e


# the writer process of a real `verifier serve --processes 2` ---------------------------------
def test_writer_sigkilled_mid_ingest_loses_nothing_acknowledged(
    tmp_path: Path, backend: Backend
) -> None:
    """`verifier serve --processes 2` runs three processes: two serving, one writing. With
    agents reporting concurrently, the writer is SIGKILLed: the verifier stops (exit 4, naming
    the writer), no process outlives it, every report an agent was told was stored is stored,
    and the ledger is one chain that verifies. Negative control: reports were acknowledged
    before the kill (the check is not vacuous)."""
    db, log = backend.target, tmp_path / "serve.log"
    addr = f"127.0.0.1:{free_port()}"
    acked: dict[str, int] = {}
    errors: list[str] = []
    stop = threading.Event()
    with verifier(["--processes", "2", "--listen", addr, "--db", db], log) as proc:
        serving(addr, proc, log)
        wait_until("two more processes", lambda: len(children(proc.pid)) == 2, log)
        (w,) = [c for c in children(proc.pid) if is_writer(c)]
        agents = [
            threading.Thread(target=agent_loop, args=(addr, f"a{i}", stop, acked, errors))
            for i in range(8)
        ]
        for t in agents:
            t.start()
        wait_until("reports acknowledged", lambda: sum(acked.values()) >= 40, log)
        others = children(proc.pid)
        os.kill(w, signal.SIGKILL)
        assert proc.wait(timeout=DEADLINE_S) == 4
        stop.set()
        for t in agents:
            t.join(HUNG_S)
        wait_until("every process gone", lambda: not any(map(alive, others)), log)
    said = rf"the store's writer process \(pid {w}\) exited with code -9; the other processes"
    assert re.search(said, log.read_text()), log.read_text()[-3000:]
    assert sum(acked.values()) >= 40
    have = stored(db)
    assert {(a, s) for a, last in acked.items() for s in range(1, last + 1)} <= have
    assert backend.check().ok


@pytest.mark.parametrize("flag", ["--writer-process", "--no-writer-process"])
def test_the_writer_process_is_on_by_default_and_can_be_turned_off(
    tmp_path: Path, flag: str
) -> None:
    """--processes 2 starts a writer process unless --no-writer-process says not to: the
    process count says which ran (the other tests run both ways)."""
    db, log = tmp_path / "v.sqlite3", tmp_path / "serve.log"
    addr = f"127.0.0.1:{free_port()}"
    args = ["--processes", "2", "--listen", addr, "--db", str(db)]
    with verifier([*args, *([flag] if flag != "--writer-process" else [])], log) as proc:
        serving(addr, proc, log)
        want = 2 if flag == "--writer-process" else 1
        wait_until(f"{want} more processes", lambda: len(children(proc.pid)) == want, log)
        writers = [c for c in children(proc.pid) if is_writer(c)]
        assert len(writers) == want - 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=DEADLINE_S) == 0, log.read_text()[-3000:]
    said = "one store writer" in log.read_text()
    assert said == (flag == "--writer-process")


@pytest.mark.parametrize("counts", [True, False])
def test_a_store_that_uses_the_writer_counts_its_transactions_once(
    backend: Backend, counts: bool
) -> None:
    """A serving process's store hands its reports to the writer (``use_writer``): the report
    is stored by the writer's transaction, none of its own, and ``write_times`` (what the
    ``verifier_store_*`` metrics read) adds the writer's transactions only in the one process
    told to count them (the first), so that summed over the processes each counts once."""
    s = Store(backend.target)
    front = Store(backend.target)
    try:
        with writer(s, 1) as (remote,):
            front.use_writer(remote, counts)
            own = front.transactions
            rep = StoredReport("a0", 1, "t-a0", 100.0, b"r")
            rowid = front.save_report(rep, {}, receipt=follow.ReceiptAt(None, 0.0))
            assert isinstance(rowid, int)
            assert front.stored_here(rowid)  # following will not read it back
            assert front.transactions == own  # no transaction of its own
            writer_tx = s.write_times()[0]
            assert writer_tx >= 1
            assert front.write_times()[0] == own + (writer_tx if counts else 0)
    finally:
        front.close()
        s.close()
    assert stored(backend.target) == {("a0", 1)}
    assert backend.check().ok


def test_a_report_that_cannot_be_sent_fails_alone_and_leaves_nothing_waiting() -> None:
    """A report whose receipt cannot be pickled (a closure: a caller's bug) is refused with
    StoreWriterError (not acknowledged), nothing is left waiting for an answer that will never
    come, and the connection still carries the next report."""
    theirs, front = _front()
    outcome: object
    try:
        front.save(prepared("a0"), lambda: "not picklable")
    except StoreWriterError as e:
        outcome = e
    else:
        outcome = None
    assert isinstance(outcome, StoreWriterError) and "could not be sent" in str(outcome)
    assert front._waiting == {}
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(_outcome(front, "a1")))
    t.start()
    rid, rep, _ = theirs.recv()
    assert rep.rep.agent_id == "a1"
    theirs.send(writer_process.Answer(rid, 7, None, (1, 0.0, 0.0)))
    t.join(HUNG_S)
    assert got == [7]
    theirs.close()
    front.close()


def test_a_lost_connection_is_told_once_to_whoever_stops_the_process() -> None:
    """The writer's end closes (it died, or dropped this connection): the serving side is
    told once, with why (a serving process then stops, and the verifier with it), and every
    report after fails at once."""
    theirs, front = _front()
    told: list[str] = []
    front._on_lost = told.append
    theirs.close()
    wait_for("the loss told", lambda: len(told) == 1)
    assert "gone" in told[0]
    later = _outcome(front, "a1")
    assert isinstance(later, StoreWriterError)
    assert len(told) == 1
    front.close()


def test_a_report_sent_without_a_receipt_is_stored_with_its_own(backend: Backend) -> None:
    """``save_report`` allows no receipt (the report's own is stored): through the writer too,
    not taken for a malformed message (which would drop the connection and stop the process)."""
    s = Store(backend.target)
    try:
        with writer(s, 1) as (remote,):
            assert isinstance(remote.save(prepared("a0"), None), int)
            assert remote._gone is None
    finally:
        s.close()
    assert stored(backend.target) == {("a0", 1)}
