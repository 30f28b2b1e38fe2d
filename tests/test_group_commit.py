"""Group commit (servewitness/server/group_commit.py): reports that wait while a transaction holds
the store are committed together, and an acknowledged report is still a stored one.

Real stores (SQLite and PostgreSQL), real faults: a trigger in the database that refuses one
agent's report (the database itself says no, in the middle of a batch), and a verifier process
SIGKILLed while many agents report concurrently. Batches are made deterministic by holding
the store's lock (as a transaction in progress does) while the writers arrive; no wall-clock
thresholds: the tests assert counts (transactions, batch sizes) and what is stored.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path

import grpc
import pytest

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.model import ProcessKey, ProcessReport, TargetReport
from servewitness.server.db import open_database
from servewitness.server.store import Store, StoredReport
from tests.helpers import Backend, agent_stub
from tests.test_faults import wait_serving

N = 6
HUNG_S = 60.0  # only so that a hung test fails


def wait_for(what: str, pred: Callable[[], bool]) -> None:
    deadline = time.monotonic() + HUNG_S
    while not pred():
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.002)


def stored(target: str) -> set[tuple[str, int]]:
    db = open_database(target, read_only=True)
    try:
        return {(str(a), int(s)) for a, s in db.execute("SELECT agent_id, seq FROM reports")}
    finally:
        db.close()


def save_concurrently(
    s: Store, agents: list[str], held_by: AbstractContextManager[object] | None = None
) -> tuple[dict[str, bool | BaseException], int]:
    """Every agent's report 1 saved from its own thread while the store is held (by a
    transaction of its own in progress, or HELD_BY: another writer's on the same database),
    so that all of them wait for one commit; (each call's result or exception, transactions
    begun)."""
    out: dict[str, bool | BaseException] = {}

    def save(agent: str) -> None:
        try:
            rep = StoredReport(agent, 1, "t-" + agent, 100.0, b"r")
            out[agent] = s.save_report(rep, {}) is not None
        except BaseException as e:  # noqa: BLE001 - asserted by the test
            out[agent] = e

    threads = [threading.Thread(target=save, args=(a,)) for a in agents]
    before = s.transactions
    with s._lock if held_by is None else held_by:  # every writer arrives and waits
        for t in threads:
            t.start()
        # the first became the leader, waiting for the store before it takes its batch; the
        # rest wait for it, every write pending
        wait_for("every writer waiting", lambda: len(s.reports._pending) == len(agents))
        wait_for("a leader", lambda: s.reports._leading)
        if held_by is not None:  # its transaction begun, blocked on the other's lock
            wait_for("the leader's transaction", lambda: s.transactions == before + 1)
    for t in threads:
        t.join(HUNG_S)
    return out, s.transactions - before


@contextlib.contextmanager
def another_writer(target: str) -> Iterator[None]:
    """Another verifier's transaction on TARGET (a second connection): it holds the
    database's write lock, writes a row of its own and commits when the block ends."""
    other = open_database(target)
    try:
        other.begin()
        other.execute(
            "INSERT INTO runs (name, policy_toml, policy_digest, source, created_unix) "
            "VALUES ('other', '', 'd', 'test', 1.0)"
        )
        yield
        other.commit()
    finally:
        if other.in_transaction:
            other.rollback()
        other.close()


@pytest.mark.parametrize("holder", ["its own transaction", "another writer"])
def test_reports_waiting_for_the_lock_are_committed_together(backend: Backend, holder: str) -> None:
    """N reports arrive while the store is busy (its own transaction in progress, or another
    writer's on the same database: a second verifier process, here a second connection).
    They take ONE transaction, not N: the leader takes its batch only once it holds the lock,
    so the writes that arrived while it waited are in it (before 2026-12-06 it took its batch
    first: two transactions, [1, N - 1], one commit and fsync under the lock more per wait).
    Each call returns True with its report stored; the ledger still verifies. Negative
    control: the other writer's own row is stored too."""
    agents = [f"a{i}" for i in range(N)]
    s = Store(backend.target)
    held = another_writer(backend.target) if holder == "another writer" else None
    try:
        out, transactions = save_concurrently(s, agents, held)
        assert (out, transactions, s.reports.batches[-1:]) == (
            dict.fromkeys(agents, True),
            1,
            [N],
        )
    finally:
        s.close()
    assert stored(backend.target) == {(a, 1) for a in agents}
    assert backend.check().ok == (held is None)  # the other's row has no ledger entry
    db = open_database(backend.target, read_only=True)
    try:
        others = db.execute("SELECT COUNT(*) FROM runs WHERE name = 'other'").fetchone()[0]
    finally:
        db.close()
    assert others == (0 if held is None else 1)


REFUSE = {
    "sqlite": [
        "CREATE TRIGGER refuse BEFORE INSERT ON reports WHEN NEW.agent_id = 'refused' "
        "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
    ],
    "postgresql": [
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.agent_id = 'refused' THEN RAISE EXCEPTION 'refused by the test'; END IF; "
        "RETURN NEW; END $$",
        "CREATE TRIGGER refuse BEFORE INSERT ON reports FOR EACH ROW EXECUTE FUNCTION refuse()",
    ],
}


def test_a_report_the_database_refuses_fails_alone_not_its_batch(backend: Backend) -> None:
    """The database refuses one agent's report (a trigger): the batch it was in fails as a
    whole, nothing of it committed, and each of its reports is tried alone. Only the refused
    one fails (its caller gets the database's error: never acknowledged); every other is
    stored and its call returns True. Negative control: the refused report is not stored."""
    s = Store(backend.target)
    backend.sql(*REFUSE["postgresql" if backend.target.startswith("postgres") else "sqlite"])
    agents = ["a0", "a1", "refused", "a3", "a4", "a5"]
    try:
        out, transactions = save_concurrently(s, agents)
        refused = out.pop("refused")
        assert isinstance(refused, s.errors) and "refused by the test" in str(refused)
        assert out == {a: True for a in agents if a != "refused"}
        # the batch of 6 that failed; its 6 reports alone
        assert (s.reports.batches[-7:], transactions) == ([6, 1, 1, 1, 1, 1, 1], 7)
    finally:
        s.close()
    assert stored(backend.target) == {(a, 1) for a in agents if a != "refused"}
    assert backend.check().ok


# a verifier killed while many agents report -------------------------------------------------
AGENTS = 12


def agent_loop(
    addr: str, name: str, stop: threading.Event, acked: dict[str, int], errors: list[str]
) -> None:
    """Report after report, each only once the last was acknowledged (as `verifier agent`);
    ACKED[name]: the last seq acknowledged."""
    proc = ProcessReport(
        key=ProcessKey("boot", 10, 20), ns_pid=10, ppid=1, start_time=1.0, role="worker",
        rank=0, container_id=None, cmdline=("python",), exe="/usr/bin/python3",
        probe_present=True,
    )  # fmt: skip
    with grpc.insecure_channel(addr, options=list(wire.GRPC_OPTIONS)) as ch:
        stub = agent_stub(ch)
        try:
            nonce = stub.Hello(pb.HelloRequest(agent_id=name, targets=["t-" + name])).nonce
            seq = 1
            while not stop.is_set():
                rep = TargetReport(name, "t-" + name, seq, nonce, time.time(), (proc,))
                resp = stub.Report(pb.ReportRequest(report=wire.report_to_pb(rep)), timeout=30)
                assert resp.accepted
                acked[name], nonce, seq = seq, resp.nonce, seq + 1
        except grpc.RpcError as e:  # the verifier was killed: expected, once stopped
            if not stop.is_set():
                errors.append(f"{name}: {e.code()}")


def test_sigkilled_verifier_loses_no_report_it_acknowledged_under_group_commit(
    backend: Backend, tmp_path: Path
) -> None:
    """AGENTS agents report as fast as they are acknowledged (so reports share commits) to a
    `verifier serve` process, which is SIGKILLed mid-stream: every report any agent saw
    acknowledged is in the database (1..last acknowledged seq of each), and the ledger
    verifies. Negative control: reports were in flight, so the kill did interrupt work."""
    addr, log = f"unix:{tmp_path}/v.sock", tmp_path / "serve.log"
    with log.open("wb") as f:
        server = subprocess.Popen(
            [sys.executable, "-m", "servewitness", "serve", "--listen", addr,
             "--db", backend.target],
            stdout=f, stderr=subprocess.STDOUT,
        )  # fmt: skip
    acked: dict[str, int] = {}
    errors: list[str] = []
    stop = threading.Event()
    threads = [
        threading.Thread(target=agent_loop, args=(addr, f"g{i}", stop, acked, errors))
        for i in range(AGENTS)
    ]
    try:
        wait_serving(addr, log)
        for t in threads:
            t.start()
        wait_for("every agent acknowledged 5 times", lambda: sum(acked.values()) >= 5 * AGENTS)
        assert not errors, errors
        server.send_signal(signal.SIGKILL)
        assert server.wait(HUNG_S) == -signal.SIGKILL
        at_kill = dict(acked)
    finally:
        stop.set()
        if server.poll() is None:
            server.kill()
            server.wait()
        for t in threads:
            t.join(HUNG_S)
    want = {(a, s) for a, last in at_kill.items() for s in range(1, last + 1)}
    have = stored(backend.target)
    assert want <= have, f"acknowledged but not stored: {sorted(want - have)[:10]}"
    assert len(have - want) <= AGENTS  # at most each agent's one report in flight
    assert backend.check().ok


def _rounds_of_more_writes_than_a_batch() -> None:
    """One round: a transaction held while 6 more writes queue behind it, batches of 2."""
    from servewitness.server.group_commit import GroupCommit

    ran: list[int] = []
    gate, first = threading.Event(), threading.Event()

    def run_batch(take: Callable[[], tuple[Sequence[Callable[[object], int]], str]]) -> list[int]:
        if not first.is_set():  # the first transaction holds until the others queue up
            first.set()
            assert gate.wait(10)
        writes, _ = take()
        out = [w(None) for w in writes]
        ran.extend(out)
        return out

    gc: GroupCommit[int] = GroupCommit(run_batch, max_batch=2)
    got: dict[int, int] = {}

    def submit(n: int) -> None:
        got[n] = gc.submit(lambda _conn: n, f"w{n}")

    threads = [threading.Thread(target=submit, args=(0,))]
    threads[0].start()
    assert first.wait(10)
    threads += [threading.Thread(target=submit, args=(n,)) for n in range(1, 7)]
    for t in threads[1:]:
        t.start()
    deadline = time.monotonic() + 10
    while len(gc._pending) < 7 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert len(gc._pending) == 7  # the leader's own too: it takes once it holds the store
    gate.set()
    for t in threads:
        t.join(10)
    assert got == {n: n for n in range(7)}  # each its own result, none unwritten
    assert sorted(ran) == list(range(7))  # each write ran exactly once
    assert max(gc.batches) <= 2


def test_a_leader_whose_write_is_not_in_its_batch_leads_again_until_it_is() -> None:
    """More writes waiting than one transaction takes (MAX_BATCH): whichever waiter leads next
    takes the OLDEST pending writes, which need not include its own. It must not return as if
    its write were committed: every submit returns its own write's result, and every write
    ran exactly once. (The transaction here is a list append: this is the batching logic on
    its own; the store's batches are the tests above.) Repeated: which waiter leads is up to
    the scheduler, and before the fix a late one returned unwritten in most rounds."""
    for _ in range(20):
        _rounds_of_more_writes_than_a_batch()
