"""A writer that never finishes does not stop the verifier with it.

The attack (or the accident): a process holds the verifier database's writers' lock and stops
in the middle of its transaction (SIGSTOP, a debugger, a frozen container). Every other writer
on the database waited for it without a bound: reports hung until their agents' deadlines,
status calls piled up behind them, and nothing said why. Now a writer gives up after
``Database.lock_wait_s`` with a store error naming the cause: the report is refused
(UNAVAILABLE, not acknowledged, so the agent keeps it), a forget is refused and leaves the target
as it was, an expiry waits for the next try; on PostgreSQL the stopped session is ended by the
server after ``IDLE_IN_TRANSACTION_S`` and writing resumes by itself.

Real components: the holder is another process holding the real lock (an ``flock`` on the
SQLite file, PostgreSQL's advisory lock), stopped with SIGSTOP; verifiers are real processes
or real servers over gRPC. No wall-clock thresholds: deadlines only stop a hung test.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import functools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.server import db as dbmodule
from servewitness.server.db import open_database
from servewitness.server.store import Store
from servewitness.server.writer_queue import WriterLockTimeout, WriterQueue
from tests.helpers import agent_stub, running_verifier, threads_started
from tests.test_backpressure import audit_ok
from tests.test_contention import manifest, report
from tests.test_group_commit import save_concurrently
from tests.test_listen_exclusive import free_port, serving
from tests.test_processes import verifier

DEADLINE_S = 60.0
HELD = "held the verifier database for more than"

# Another writer: begins a write transaction on the database in argv[1] (its session ends
# by PostgreSQL after argv[2] s idle in it), says so, and stops itself holding the lock.
HOLDER = """
import os, signal, sys
from servewitness.server import db
db.IDLE_IN_TRANSACTION_S = int(sys.argv[2])
d = db.open_database(sys.argv[1])
d.begin()
print("held", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
d.rollback()
"""


def wait_for(what: str, pred: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not pred():
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.05)


def stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


@contextlib.contextmanager
def stopped_writer(target: str, idle_s: int = 60) -> Iterator[subprocess.Popen[bytes]]:
    """A process holding TARGET's writers' lock, stopped mid-transaction; killed after."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, target, str(idle_s)], stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"held\n"
        wait_for("the holder stopped", lambda: stopped(proc.pid))
        yield proc
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def hello(stub: object, agent: str, target: str) -> str:
    return str(stub.Hello(pb.HelloRequest(agent_id=agent, targets=[target])).nonce)  # type: ignore[attr-defined]


def refused(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value


def test_a_stopped_writer_gets_reports_refused_not_hung_and_nothing_lost(tmp_path: Path) -> None:
    """With another process stopped while holding the SQLite file's writers' lock, reports
    from several agents at once are each refused (UNAVAILABLE, naming the cause) instead of
    waiting for ever; so is a forget, and the target stays listed. Once the holder is gone the
    same reports (same seq, same nonce: a refusal leaves both) are acknowledged and stored,
    the forget goes through, and the ledger verifies."""
    addr, db, log = f"127.0.0.1:{free_port()}", str(tmp_path / "v.sqlite3"), tmp_path / "v.log"
    agents = [f"agent-{i}" for i in range(4)]
    with verifier(["--listen", addr, "--db", db], log) as proc:
        serving(addr, proc, log)
        with grpc.insecure_channel(addr) as ch:
            stub = agent_stub(ch)
            nonces = {a: hello(stub, a, f"t-{a}") for a in agents}
            first = stub.Report(
                report(agents[0], "t-agent-0", manifest(2, "x"), 1, nonces["agent-0"])
            )
            assert first.accepted
            nonces["agent-0"] = first.nonce
            seqs = {a: 2 if a == "agent-0" else 1 for a in agents}

            def send(a: str) -> pb.ReportResponse:
                files = manifest(2, f"{a}-{seqs[a]}")
                req = report(a, f"t-{a}", files, seqs[a], nonces[a])
                return stub.Report(req, timeout=DEADLINE_S)  # type: ignore[no-any-return]

            with stopped_writer(db), concurrent.futures.ThreadPoolExecutor(len(agents)) as pool:
                outcomes = [pool.submit(refused, functools.partial(send, a)) for a in agents]
                for f in outcomes:
                    e = f.result()
                    assert e.code() == grpc.StatusCode.UNAVAILABLE, e
                    assert "not stored" in str(e.details()) and HELD in str(e.details())
                forget = pb.ForgetTargetRequest(target="t-agent-0")
                e = refused(lambda: stub.ForgetTarget(forget, timeout=DEADLINE_S))
                assert e.code() == grpc.StatusCode.UNAVAILABLE and HELD in str(e.details())
                listed = stub.ListTargets(pb.ListTargetsRequest(), timeout=DEADLINE_S)
                assert "t-agent-0" in {t.target for t in listed.targets}  # not forgotten
            for a in agents:  # the holder is gone, and its lock with it
                assert send(a).accepted
            stub.ForgetTarget(forget, timeout=DEADLINE_S)
            listed = stub.ListTargets(pb.ListTargetsRequest(), timeout=DEADLINE_S)
            assert "t-agent-0" not in {t.target for t in listed.targets}
    store = open_database(db, read_only=True)
    try:
        rows = {(a, int(s)) for a, s in store.execute("SELECT agent_id, seq FROM reports")}
    finally:
        store.close()
    assert rows == {("agent-0", 1), ("agent-0", 2)} | {(a, 1) for a in agents[1:]}
    audit_ok(db)


def test_a_batch_the_lock_refused_is_not_retried_write_by_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group commit retries a failed batch's writes one by one (so only the write the
    database refuses fails); a lock that was never had says nothing about the writes, and
    retried alone each would wait as long again (N writes, N bounds). The batch fails at once:
    one transaction tried for six writes (its leader takes the batch only once it holds the
    lock; never had, every write pending then fails with it)."""
    monkeypatch.setattr(dbmodule.Database, "lock_wait_s", 0.3)
    path = str(tmp_path / "v.sqlite3")
    s = Store(path)
    try:
        with stopped_writer(path):
            out, tried = save_concurrently(s, [f"a{i}" for i in range(6)])
        assert all(isinstance(r, WriterLockTimeout) for r in out.values()), out
        assert tried == 1 and s.reports.batches[-1:] == [6]
        out, tried = save_concurrently(s, ["b0", "b1"])  # the holder gone: written
        assert out == {"b0": True, "b1": True}
    finally:
        s.close()


def test_a_writer_that_gave_up_leaves_no_lock_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer that gave up leaves a thread waiting in the kernel for the lock. The next
    writer takes that wait over (one thread, not one per try: two waits on one open file
    would each believe they hold its one lock); and when the lock comes with no writer
    wanting it, it is let go at once, so another process gets it."""
    path = str(tmp_path / "v.sqlite3")
    open_database(path).close()
    q = WriterQueue(path)
    try:
        with stopped_writer(path):
            started = threads_started(monkeypatch)
            for _ in range(3):
                with pytest.raises(WriterLockTimeout, match=HELD):
                    q.acquire(0.1)
            assert q.waits == 3 and len(started) == 1
        other = os.open(path, os.O_RDONLY)  # another process's open file, as far as flock knows

        def other_gets_it() -> bool:
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                return False

        wait_for("the lock let go", other_gets_it)
        with pytest.raises(WriterLockTimeout):
            q.acquire(0.1)  # held by the other now
        threading.Timer(0.2, fcntl.flock, (other, fcntl.LOCK_UN)).start()
        q.acquire(DEADLINE_S)  # waits in the kernel, woken when the other lets go
        assert not other_gets_it()
        q.release()
        assert other_gets_it()
        os.close(other)
    finally:
        q.close()


def test_postgresql_ends_a_stopped_writers_session_and_writing_resumes(
    tmp_path: Path, pg_database: str
) -> None:
    """On PostgreSQL the stopped writer holds the verifiers' advisory lock: a report is
    refused after the lock wait (5 s), and PostgreSQL ends the stopped session once it has
    been idle in its transaction past the limit the verifier's connections set (8 s here), so
    the same report is acknowledged while the holder is STILL stopped: no operator needed."""
    addr, log = f"127.0.0.1:{free_port()}", tmp_path / "v.log"
    with verifier(["--listen", addr, "--db", pg_database], log) as proc:
        serving(addr, proc, log)
        with grpc.insecure_channel(addr) as ch:
            stub = agent_stub(ch)
            nonce = hello(stub, "agent", "t")
            req = report("agent", "t", manifest(2, "pg"), 1, nonce)
            with stopped_writer(pg_database, idle_s=8) as holder:
                e = refused(lambda: stub.Report(req, timeout=DEADLINE_S))
                assert e.code() == grpc.StatusCode.UNAVAILABLE and HELD in str(e.details())
                acked = None
                deadline = time.monotonic() + DEADLINE_S
                while acked is None:
                    assert time.monotonic() < deadline, "the stopped session never ended"
                    with contextlib.suppress(grpc.RpcError):
                        acked = stub.Report(req, timeout=DEADLINE_S)
                assert acked.accepted and stopped(holder.pid)
    audit_ok(pg_database)


def test_an_expiry_the_store_refused_is_not_applied_and_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A target silent past --target-expiry leaves the runs' verdicts only once its expiry
    is in the ledger: with the store's writers' lock held by a stopped process, the keeper's
    attempts fail and the target stays as it was (it used to be marked expired in memory
    first, an expiry no auditor can see); once the holder is gone it is expired and recorded."""
    monkeypatch.setattr(dbmodule.Database, "lock_wait_s", 0.3)
    db = str(tmp_path / "v.sqlite3")
    addr = f"unix:{tmp_path}/v.sock"
    with running_verifier(addr, db, target_expiry_s=3.0) as server:
        with grpc.insecure_channel(addr) as ch:
            stub = agent_stub(ch)
            nonce = hello(stub, "agent", "t")
            assert stub.Report(report("agent", "t", manifest(2, "e"), 1, nonce)).accepted
        ev, store = server.service.evaluator, server.store
        retire, failed = store.retire_target, []

        def watched(*args: Any, **kwargs: Any) -> Any:  # the real one, its failures counted
            try:
                return retire(*args, **kwargs)
            except WriterLockTimeout:
                failed.append(args)
                raise

        monkeypatch.setattr(store, "retire_target", watched)
        with stopped_writer(db):
            wait_for("a try to expire it", lambda: len(failed) >= 1)
            t = ev.get("t")
            assert t is not None and not t.expired  # not expired: the ledger does not say so
            wait_for("another try", lambda: len(failed) >= 2)  # the keeper tries again
        wait_for("the expiry applied", lambda: (t := ev.get("t")) is not None and t.expired)
    events = open_database(db, read_only=True)
    try:
        rows = events.execute("SELECT target, event FROM target_events").fetchall()
    finally:
        events.close()
    assert [tuple(r) for r in rows] == [("t", "expired")]
