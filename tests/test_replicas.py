"""Several verifiers on one database (server/follow.py): each knows every target whichever
verifier its agent reports to, judges another's evidence no fresher than it can be, retires a
target once, and a verifier killed while agents report loses nothing it acknowledged and
leaves one chain.

The first tests run two real verifiers in this process (real gRPC on Unix sockets, one
database of either kind); the last runs two `verifier serve` processes on one real
PostgreSQL with real agents, and kills one of them mid-ingest."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import generate_latest

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.api.v1 import verifier_pb2_grpc as pb_grpc
from servewitness.ledger.keys import Ed25519PrivateKey
from servewitness.model import ProcessKey, ProcessReport, TargetReport, manifest_digest
from servewitness.server import clock, follow, report_rows, vouch
from servewitness.server.app import VerifierServer
from servewitness.server.db import open_database
from servewitness.server.evaluate import Evaluator
from servewitness.server.store import Store, StoredReport
from tests.helpers import REPO, Backend, agent_stub, running_verifier, verifier_cli
from tests.test_faults import FakeWorker, worker
from tests.test_gate_e2e import Daemon
from tests.test_instances import REPLICAS, until

__all__ = ["worker"]  # the fixture, used by name


EMPTY = manifest_digest(())  # a probed process's empty manifest


def proc(pid: int) -> ProcessReport:
    return ProcessReport(
        key=ProcessKey("boot", pid, 20), ns_pid=pid, ppid=1, start_time=1.0, role="worker",
        rank=0, container_id=None, cmdline=("python",), exe="/usr/bin/python3",
        probe_present=True, manifest_digest=EMPTY, files=(),
    )  # fmt: skip


def body(agent: str, target: str, seq: int, pid: int = 10) -> bytes:
    return wire.report_to_bytes(TargetReport(agent, target, seq, "", time.time(), (proc(pid),)))


class Agent:
    """One agent speaking the protocol to one verifier (Hello, then Reports with the nonce
    each acknowledgement returns), moving to another when told to."""

    def __init__(self, agent_id: str, target: str) -> None:
        self.agent_id, self.target = agent_id, target
        self.acked: list[int] = []
        self.nonce = ""
        self.stub: pb_grpc.VerifierServiceStub | None = None
        self.channel: grpc.Channel | None = None

    def connect(self, addr: str) -> int:
        """Say Hello to the verifier at ADDR; the last seq it says is stored."""
        if self.channel is not None:
            self.channel.close()
        self.channel = grpc.insecure_channel(addr, options=list(wire.GRPC_OPTIONS))
        self.stub = agent_stub(self.channel)
        hello = pb.HelloRequest(agent_id=self.agent_id, targets=[self.target])
        reply = self.stub.Hello(hello, timeout=10)
        self.nonce = reply.nonce
        return int(reply.last_seq)

    def report(self, seq: int, pid: int = 10) -> pb.ReportResponse:
        assert self.stub is not None
        rep = TargetReport(self.agent_id, self.target, seq, self.nonce, time.time(), (proc(pid),))
        got: pb.ReportResponse = self.stub.Report(
            pb.ReportRequest(report=wire.report_to_pb(rep)), timeout=10
        )
        if got.accepted:
            self.acked.append(seq)
            self.nonce = got.nonce
        return got

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()


def targets(addr: str) -> dict[str, pb.TargetState]:
    with grpc.insecure_channel(addr) as ch:
        got = pb_grpc.VerifierServiceStub(ch).ListTargets(pb.ListTargetsRequest(), timeout=10)
    return {t.target: t for t in got.targets}


@pytest.fixture
def pair(backend: Backend, tmp_path: Path) -> Iterator[tuple[VerifierServer, VerifierServer]]:
    """Two verifiers on one database, each on its own Unix socket."""
    with (
        running_verifier(f"unix:{tmp_path}/a.sock", backend.target) as a,
        running_verifier(f"unix:{tmp_path}/b.sock", backend.target) as b,
    ):
        yield a, b


def _both(addr: str) -> Callable[[], dict[str, pb.TargetState] | None]:
    def probe() -> dict[str, pb.TargetState] | None:
        got = targets(addr)
        return got if len(got) == 2 else None

    return probe


def addrs(tmp_path: Path) -> tuple[str, str]:
    return f"unix:{tmp_path}/a.sock", f"unix:{tmp_path}/b.sock"


def test_each_verifier_knows_every_target_whichever_one_its_agent_reports_to(
    pair: tuple[VerifierServer, VerifierServer], tmp_path: Path
) -> None:
    a_addr, b_addr = addrs(tmp_path)
    one, two = Agent("agent-1", "t-1"), Agent("agent-2", "t-2")
    try:
        one.connect(a_addr)
        two.connect(b_addr)
        assert one.report(1).accepted and two.report(1).accepted
        for addr in (a_addr, b_addr):
            seen = until("both targets on " + addr, 30, _both(addr))
            # fresh on both: the other verifier's report is judged by its receipt, within
            # the freshness of a list (10 s), and who sent it is the receiver's finding
            assert {t: s.state for t, s in seen.items()} == {"t-1": "live", "t-2": "live"}, seen
            who = {s.authenticated_as for s in seen.values()}
            assert len(who) == 1 and who.pop().startswith("unix:uid="), seen
        for server in pair:  # each took the other's one report as its own, and said so
            text = generate_latest(server.service.metrics.registry).decode()
            assert 'verifier_followed_total{kind="report"} 1.0' in text, text
            assert 'verifier_followed_total{kind="failed"} 0.0' in text
        # the agent moves to the other verifier: one Hello, which reads its last seq from
        # the database, and its reports go on where they were
        assert one.connect(b_addr) == 1
        assert one.report(2).accepted
        a = pair[0].service.evaluator
        until("A follows t-1's report stored by B", 30, lambda: _held(a, "t-1") == ("agent-1", 2))
    finally:
        one.close()
        two.close()


def _held(ev: Evaluator, target: str) -> tuple[str, int] | None:
    for t in ev.targets():
        if t.snapshot.target == target:
            return t.agent_id, t.seq
    return None


def test_a_seq_another_verifier_stored_first_is_not_taken_as_evidence(
    pair: tuple[VerifierServer, VerifierServer], tmp_path: Path, backend: Backend
) -> None:
    """An agent retrying seq 1 at A after B stored it (B died before acknowledging): A's own
    cache does not know B stored it, the database does. A must acknowledge (it is stored) but
    must not judge its own copy, which is not what is stored."""
    a_addr, b_addr = addrs(tmp_path)
    at_a, at_b = Agent("agent-x", "t-x"), Agent("agent-x", "t-x")
    try:
        assert at_a.connect(a_addr) == 0  # A caches "nothing stored yet"
        assert at_b.connect(b_addr) == 0
        assert at_b.report(1, pid=111).accepted  # B stores seq 1 (pid 111)
        assert at_a.report(1, pid=222).accepted  # the same seq, another body, at A
        a = pair[0].service.evaluator
        until("A follows B's seq 1", 30, lambda: _held(a, "t-x") == ("agent-x", 1))
        (held,) = [t for t in a.targets() if t.snapshot.target == "t-x"]
        assert [p.key.pid for p in held.snapshot.processes] == [111], held
        db = open_database(backend.target, read_only=True)
        try:
            rows = db.execute("SELECT report FROM reports WHERE agent_id = 'agent-x'").fetchall()
        finally:
            db.close()
        assert len(rows) == 1
        assert wire.report_from_bytes(bytes(rows[0][0])).processes[0].key.pid == 111
    finally:
        at_a.close()
        at_b.close()


def test_a_target_forgotten_on_one_verifier_is_forgotten_on_the_other_and_retired_once(
    backend: Backend, tmp_path: Path
) -> None:
    a_addr, b_addr = addrs(tmp_path)
    cfg: dict[str, Any] = {"target_expiry_s": 1.5}
    with (
        running_verifier(a_addr, backend.target, **cfg) as a,
        running_verifier(b_addr, backend.target, **cfg),
    ):
        gone, kept = Agent("agent-g", "t-g"), Agent("agent-k", "t-k")
        try:
            gone.connect(a_addr)
            kept.connect(b_addr)
            assert gone.report(1).accepted and kept.report(1).accepted
            until("both on A", 30, lambda: len(targets(a_addr)) == 2)
            until("both on B", 30, lambda: len(targets(b_addr)) == 2)
            with grpc.insecure_channel(b_addr) as ch:
                stub = pb_grpc.VerifierServiceStub(ch)
                stub.ForgetTarget(pb.ForgetTargetRequest(target="t-g"), timeout=10)
            until("A forgets t-g", 30, lambda: "t-g" not in targets(a_addr))
            assert _held(a.service.evaluator, "t-g") is None
            # silent past the expiry on both: each expires it, the ledger says so once
            until("t-k expired on A", 10, lambda: targets(a_addr)["t-k"].state == "expired")
            until("t-k expired on B", 10, lambda: targets(b_addr)["t-k"].state == "expired")
            assert events(backend) == [("t-g", "forgotten"), ("t-k", "expired")]
            # a report after the forget brings t-g back as new, on both
            gone.connect(b_addr)
            assert gone.report(2).accepted
            until("t-g back on A", 30, lambda: "t-g" in targets(a_addr))
        finally:
            gone.close()
            kept.close()
    assert backend.check().ok


def events(backend: Backend) -> list[tuple[str, str]]:
    db = open_database(backend.target, read_only=True)
    try:
        rows = db.execute("SELECT target, event FROM target_events ORDER BY rowid").fetchall()
    finally:
        db.close()
    return [(str(t), str(e)) for t, e in rows]


# --- ages of another verifier's reports: no fresher than they can be ------------------------


def _follow_one(
    backend: Backend,
    receipt: str | Callable[[StoredReport], str] | None,
    received_unix: float,
    key: bytes | None = None,
) -> tuple[float | None, str | None]:
    """B stores one report of t with RECEIPT (or the one it makes of the row), received at
    RECEIVED_UNIX on B's clock; A, holding the receipt KEY (None: none), follows it: (its
    evidence time on A's age clock, who A takes it to be from); (None, None) if A did not
    take it as evidence."""
    a_store, b_store = Store(backend.target), Store(backend.target)
    try:
        ev = Evaluator(a_store)
        follower = follow.Follower(a_store, ev, receipt_key=key)
        follower.poll()  # where A starts: before B's report
        rep = StoredReport("agent", 1, "t", received_unix, body("agent", "t", 1))
        made = receipt(rep) if callable(receipt) else receipt
        assert b_store.save_report(dataclasses.replace(rep, receipt=made), {})
        if follower.poll() == 0:
            assert ev.targets() == []
            return None, None
        (t,) = ev.targets()
        return t.snapshot.evidence_boot_s, t.snapshot.authenticated_as
    finally:
        a_store.close()
        b_store.close()


def test_a_report_received_now_elsewhere_is_fresh_here(backend: Backend) -> None:
    before = clock.boot_s()
    at, who = _follow_one(backend, follow.receipt_json("ops-cert", 0.0), time.time())
    assert at is not None and who == "ops-cert"
    assert before - 1.0 <= at <= clock.boot_s(), (before, at)


def test_a_report_that_waited_long_before_its_row_was_written_is_as_old_as_that(
    backend: Backend,
) -> None:
    """B received it 100 s before it wrote the row (a stalled commit queue): A must not take
    it as received when it appeared."""
    at, _ = _follow_one(backend, follow.receipt_json("ops-cert", 100.0), time.time())
    assert at is not None and clock.boot_s() - at >= 100.0, at


def test_a_report_whose_receiver_says_it_arrived_long_ago_is_as_old_as_that(
    backend: Backend,
) -> None:
    """No lag in the receipt, but the receiver's wall clock says it arrived 100 s ago (the
    commit itself stalled): the older of the two counts."""
    at, _ = _follow_one(backend, follow.receipt_json("ops-cert", 0.0), time.time() - 100.0)
    assert at is not None and clock.boot_s() - at >= 99.0, at


KEY = vouch.receipt_key(Ed25519PrivateKey.generate())
OTHER_KEY = vouch.receipt_key(Ed25519PrivateKey.generate())


def vouched_by(key: bytes | None, who: str = "ops-cert") -> Callable[[StoredReport], str]:
    """The receipt a verifier holding KEY writes for a row (``service._ingest``)."""

    def make(rep: StoredReport) -> str:
        row = vouch.row_digest(*report_rows.identity(rep))
        return follow.receipt_json(who, 0.0, key=key, row=row)

    return make


def test_a_report_a_verifier_vouched_for_is_followed_as_its_agents(backend: Backend) -> None:
    at, who = _follow_one(backend, vouched_by(KEY), time.time(), key=KEY)
    assert at is not None and who == "ops-cert", (at, who)


@pytest.mark.parametrize(
    "receipt",
    [
        # a writer of the database without the key: the receipt as a verifier writes it, bare
        pytest.param(vouched_by(None), id="not-vouched"),
        # a verifier with another --signing-key (or a writer who made up a key)
        pytest.param(vouched_by(OTHER_KEY), id="another-key"),
        # a genuine vouch, copied from another row (another seq, body and time)
        pytest.param(
            lambda rep: vouched_by(KEY)(StoredReport("agent", 7, "t", 1.0, b"another")),
            id="copied-from-another-row",
        ),
        # a genuine vouch with the sender changed after it was made
        pytest.param(
            lambda rep: vouched_by(KEY)(rep).replace("ops-cert", "agent-cert"),
            id="sender-changed",
        ),
    ],
)  # fmt: skip
def test_a_report_row_no_verifier_vouched_for_is_never_evidence(
    backend: Backend, receipt: Callable[[StoredReport], str]
) -> None:
    """Attack (a writer of the database, with the store's own code: the row, its ledger entry
    and a receipt naming an agent): the follower, holding the verifiers' receipt key, does not
    take it as anyone's evidence (``server/vouch.py``)."""
    assert _follow_one(backend, receipt, time.time(), key=KEY) == (None, None)


def test_a_report_long_on_the_way_to_its_receiver_is_as_old_as_that(backend: Backend) -> None:
    """B received it just now, but its receipt says it can have been 100 s on the way from
    its agent (``server/nonces.py``: a delay added to the agent's traffic): A dates its
    evidence before that, as B does, never by the receipt alone."""
    at, _ = _follow_one(backend, follow.receipt_json("ops-cert", 0.0, 100.0), time.time())
    assert at is not None and clock.boot_s() - at >= 100.0, at


def test_a_receipt_older_than_transits_is_dated_by_its_receipt(backend: Backend) -> None:
    """A receipt a verifier older than transit bounds wrote: dated as that one dated it."""
    old = json.dumps({"authenticated_as": "ops-cert", "lag_s": 0.0})
    at, who = _follow_one(backend, old, time.time())
    assert at is not None and clock.boot_s() - at < 50.0 and who == "ops-cert", at


@pytest.mark.parametrize(
    "receipt",
    [None, "", "{", '{"authenticated_as": "x"}', '{"authenticated_as": 1, "lag_s": 0}',
     '{"authenticated_as": "x", "lag_s": -5}', '{"authenticated_as": "x", "lag_s": true}',
     '{"authenticated_as": "x", "lag_s": NaN}', '[1, 2]', '"text"',
     '{"authenticated_as": "x", "lag_s": 0, "transit_s": -1}',
     '{"authenticated_as": "x", "lag_s": 0, "transit_s": "5"}',
     '{"authenticated_as": "x", "lag_s": 0, "transit_s": false}',
     '{"authenticated_as": "x", "lag_s": 0, "transit_s": Infinity}'],
)  # fmt: skip
def test_a_report_without_a_readable_receipt_is_of_unknown_age_and_sender(
    backend: Backend, receipt: str | None
) -> None:
    at, who = _follow_one(backend, receipt, time.time())
    assert at is None and who is None, (at, who)


def test_an_edited_receipt_is_caught_by_the_ledger(backend: Backend) -> None:
    """The receipt is covered by the report's ledger entry: making another verifier's
    report look authenticated (or younger) by editing its row breaks the chain's check."""
    s = Store(backend.target)
    try:
        rep = StoredReport("a", 1, "t", time.time(), b"r", follow.receipt_json(None, 9.0))
        assert s.save_report(rep, {})
    finally:
        s.close()
    assert backend.check().ok
    edited = follow.receipt_json("operator-cert", 0.0)
    backend.sql(("UPDATE reports SET receipt_json = ? WHERE agent_id = 'a'", (edited,)))
    assert not backend.check().ok
    backend.sql("UPDATE reports SET receipt_json = NULL WHERE agent_id = 'a'")
    assert not backend.check().ok


def test_a_follower_far_behind_catches_up_in_bounded_reads_to_the_newest_report(
    backend: Backend,
) -> None:
    a_store, b_store = Store(backend.target), Store(backend.target)
    try:
        ev = Evaluator(a_store)
        follower = follow.Follower(a_store, ev, batch_rows=3)
        follower.poll()
        for seq in range(1, 11):
            t = f"t{seq % 2}"
            rep = StoredReport("agent", seq, t, time.time(), body("agent", t, seq),
                               follow.receipt_json(None, 0.0))  # fmt: skip
            assert b_store.save_report(rep, {})
        polls = 0
        while follower.poll():
            polls += 1
        assert polls == 4, polls  # 10 rows, 3 a poll
        assert {t.snapshot.target: t.seq for t in ev.targets()} == {"t0": 10, "t1": 9}
        # what A stored itself and noted is not replaced by an older row of B's
        ev.note(TargetReport("own", "t1", 1, "", time.time(), ()), time.time(), rowid=10**9)
        rep = StoredReport("agent", 11, "t1", time.time(), body("agent", "t1", 11),
                           follow.receipt_json(None, 0.0))  # fmt: skip
        assert b_store.save_report(rep, {})
        assert follower.poll() == 0
        assert {t.snapshot.target: t.agent_id for t in ev.targets()}["t1"] == "own"
    finally:
        a_store.close()
        b_store.close()


# --- two `verifier serve` processes on one PostgreSQL, one killed mid-ingest -----------------


def serve(d: Path, name: str, db: str, policy: Path) -> tuple[Daemon, str]:
    addr = f"unix:{d}/{name}.sock"
    daemon = Daemon(
        ["serve", "--listen", addr, "--db", db, "--report-interval", "0.2",
         "--run", f"r={policy}", "--signing-key", str(d / "ledger.key")],
        d / f"serve-{name}.log",
    ).start()  # fmt: skip
    until(f"verifier {name}", 60, (d / f"{name}.sock").exists)
    return daemon, addr


def status(addr: str) -> dict[str, Any]:
    out = verifier_cli("status", "r", "--json", "--verifier", addr)
    assert out.returncode in (0, 1), out.stdout + out.stderr
    run: dict[str, Any] = json.loads(out.stdout)["runs"][0]
    return run


def _passing(addr: str) -> Callable[[], dict[str, Any] | None]:
    def probe() -> dict[str, Any] | None:
        got = status(addr)
        return got if got["verdict"] == "PASS" else None

    return probe


def test_two_verifier_processes_share_every_target_and_a_killed_one_loses_nothing(
    worker: FakeWorker, tmp_path: Path, pg_database: str
) -> None:
    pol = tmp_path / "p.toml"
    pol.write_text(REPLICAS.replace("freshness_s = 30.0", "freshness_s = 4.0"))
    assert "freshness_s = 4.0" in pol.read_text()
    key = verifier_cli("keygen", "--out", str(tmp_path / "ledger.key"))
    assert key.returncode == 0, key.stderr
    daemons: list[Daemon] = []
    try:
        a, a_addr = serve(tmp_path, "a", pg_database, pol)
        b, b_addr = serve(tmp_path, "b", pg_database, pol)
        daemons += [a, b]
        for addr, instance in ((a_addr, "pod-a"), (b_addr, "pod-b")):
            daemons.append(Daemon(
                ["agent", "--verifier", addr, "--target", "vllm", "--instance", instance,
                 "--pid", str(worker.pid), "--interval", "0.2", "--no-docker",
                 "--spool", str(tmp_path / f"spool-{instance}")],
                tmp_path / f"agent-{instance}.log",
            ).start())  # fmt: skip
        # each verifier PASSes the run on both pods, one reported to it and one to the other
        for addr in (a_addr, b_addr):
            st = until("PASS on " + addr, 90, _passing(addr))
            assert sorted(t["target"] for t in st["targets"]) == ["vllm/pod-a", "vllm/pod-b"]

        # 12 agents report to B as fast as it acknowledges; B is killed while they do
        load = [Agent(f"load-{i}", f"load-{i}") for i in range(12)]
        failed_at_b: list[str] = []
        stop = threading.Event()

        def hammer(ag: Agent) -> None:
            seq = ag.connect(b_addr) + 1
            addr = b_addr
            while not stop.is_set():
                try:
                    if ag.report(seq).accepted:
                        seq += 1
                except grpc.RpcError as e:
                    if addr == b_addr:
                        failed_at_b.append(f"{ag.agent_id}: {e.code()}")
                    addr = a_addr  # as an agent behind a Service: the other replica
                    try:
                        seq = ag.connect(addr) + 1  # its last stored seq, from the database
                    except grpc.RpcError:
                        time.sleep(0.1)

        threads = [threading.Thread(target=hammer, args=(ag,)) for ag in load]
        for t in threads:
            t.start()
        until("load acknowledged", 60, lambda: sum(len(ag.acked) for ag in load) >= 200)
        b.stop(signal.SIGKILL)
        daemons.remove(b)
        acked_at_kill = sum(len(ag.acked) for ag in load)
        until(
            "load going on at A",
            60,
            lambda: sum(len(ag.acked) for ag in load) > acked_at_kill + 100,
        )
        stop.set()
        for t in threads:
            t.join(timeout=30)
        assert failed_at_b, "the kill interrupted no call: it did not happen mid-ingest"

        # pod-b's agent reports to the dead verifier only: A must not keep its last
        # evidence fresh; the run leaves PASS within its freshness (4 s) and a poll
        st = until("pod-b stale on A", 30, lambda: (s := status(a_addr))["verdict"] != "PASS" and s)
        stale = {t["target"]: t["verdict"] for t in st["targets"]}
        assert stale["vllm/pod-a"] == "PASS" and stale["vllm/pod-b"] != "PASS", st
        # B comes back on the same address: pod-b's agent, never restarted, reports again
        (tmp_path / "b.sock").unlink(missing_ok=True)
        b, _ = serve(tmp_path, "b", pg_database, pol)
        daemons.append(b)
        for addr in (a_addr, b_addr):
            until("PASS again on " + addr, 60, _passing(addr))
    finally:
        for d in reversed(daemons):
            if d.proc is not None:
                d.stop()
        for ag in locals().get("load", []):
            ag.close()

    # nothing an agent was told was stored is lost
    db = open_database(pg_database, read_only=True)
    try:
        stored = {(str(r[0]), int(r[1])) for r in db.execute("SELECT agent_id, seq FROM reports")}
        seqs = [int(r[0]) for r in db.execute("SELECT seq FROM ledger ORDER BY seq")]
        kinds = {str(r[0]) for r in db.execute("SELECT DISTINCT kind FROM ledger")}
    finally:
        db.close()
    acked = {(ag.agent_id, s) for ag in load for s in ag.acked}
    assert acked and not acked - stored, sorted(acked - stored)[:10]
    # ... and the ledger is one chain, every row in it, the checkpoints of both consistent
    assert seqs == list(range(1, len(seqs) + 1))
    assert {"report", "run", "verdict"} <= kinds
    out = verifier_cli("audit", "verify", "--db", pg_database, "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)["ok"]


def test_a_retirement_or_verdict_two_verifiers_record_at_once_is_recorded_once(
    backend: Backend,
) -> None:
    """Both verifiers expire a silent target, and both see the same verdict change, before
    either follows the other: the check is made in the transaction that writes, so the
    ledger says each once."""
    a, b = Store(backend.target), Store(backend.target)
    try:
        first = a.retire_target("t", "expired", "verifier", ("agent", 7))
        assert b.retire_target("t", "expired", "verifier", ("agent", 7)) == first
        # another report retired, or another event: recorded
        b.retire_target("t", "expired", "verifier", ("agent", 8))
        a.retire_target("t", "forgotten", "ops", ("agent", 8))
        detail = {"targets": {"t": ["PASS", []]}}
        assert a.last_verdict("r") is None
        assert a.record_verdict("r", "PASS", detail)
        assert not b.record_verdict("r", "PASS", detail)
        assert b.record_verdict("r", "FAIL", detail)
    finally:
        a.close()
        b.close()
    db = open_database(backend.target, read_only=True)
    try:
        events = [tuple(r) for r in db.execute(
            "SELECT event, last_seq FROM target_events ORDER BY rowid")]  # fmt: skip
        verdicts = [r[0] for r in db.execute("SELECT verdict FROM verdicts ORDER BY rowid")]
    finally:
        db.close()
    assert events == [("expired", 7), ("expired", 8), ("forgotten", 8)], events
    assert verdicts == ["PASS", "FAIL"]
    assert backend.check().ok


# --- attacks found by an outside tester (session 12), each built for real ---------------------


def test_a_report_that_looks_old_here_is_stale_but_its_target_does_not_expire(
    backend: Backend,
) -> None:
    """A follower whose wall clock runs ahead of the receiver's sees the receiver's reports
    as received long ago: STALE is the safe error for freshness, but expiry (which drops a
    target from every run's verdict: a run of a PENDING target and a PASSing one PASSed)
    must count silence from the latest the report can have arrived, which is now."""
    a_store, b_store = Store(backend.target), Store(backend.target)
    try:
        ev = Evaluator(a_store)
        follower = follow.Follower(a_store, ev)
        follower.poll()
        old = time.time() - 100.0  # as the receiver's clock says, 100 s before ours
        rep = StoredReport(
            "agent", 1, "t", old, body("agent", "t", 1), follow.receipt_json(None, 0)
        )
        assert b_store.save_report(rep, {})
        assert follower.poll() == 1
        (t,) = ev.targets()
        at = t.snapshot.evidence_boot_s
        assert at is not None and clock.boot_s() - at >= 99.0  # old: STALE
        assert ev.due_to_expire(5.0) == []  # ... but heard just now: not expired
    finally:
        a_store.close()
        b_store.close()


def test_another_verifiers_expiry_of_a_target_this_one_hears_is_not_applied(
    backend: Backend,
) -> None:
    """An expiry event only says that one verifier heard nothing for its --target-expiry;
    a verifier that heard the same report within its own applies it only if it agrees."""
    a_store, b_store = Store(backend.target), Store(backend.target)
    try:
        ev = Evaluator(a_store)
        follower = follow.Follower(a_store, ev, expiry_s=5.0)
        follower.poll()
        rep = StoredReport("agent", 1, "t", time.time(), body("agent", "t", 1),
                           follow.receipt_json(None, 0))  # fmt: skip
        assert b_store.save_report(rep, {})
        assert follower.poll() == 1
        b_store.retire_target("t", "expired", "verifier", ("agent", 1))
        assert follower.poll() == 0
        assert [t.expired for t in ev.targets()] == [False]
        # negative control: one that agrees (its expiry passed too) applies it
        follower.expiry_s = 0.0
        b_store.retire_target("t", "forgotten", "ops", ("agent", 1))
        b_store.retire_target("t", "expired", "verifier", ("agent", 1))
        assert follower.poll() == 1 and ev.targets() == []
    finally:
        a_store.close()
        b_store.close()


@pytest.mark.parametrize("event", ["forgotten", "expired"])
def test_a_retired_target_stays_retired_after_a_restart_whatever_the_receivers_clocks(
    backend: Backend, event: str
) -> None:
    """The target's latest report is the last stored, not the one with the latest wall-clock
    receipt: seq 1 received by a verifier whose clock ran a minute ahead, seq 2 after it.
    Retired with seq 2, it must not come back (as seq 1) when a verifier starts."""
    s = Store(backend.target)
    try:
        now = time.time()
        for seq, at in ((1, now + 60.0), (2, now)):
            assert s.save_report(StoredReport("ag", seq, "t", at, body("ag", "t", seq)), {})
        s.retire_target("t", event, "ops", ("ag", 2))
        loaded = Evaluator(s).targets()
        assert [(t.seq, t.expired) for t in loaded] == ([] if event == "forgotten" else [(2, True)])
    finally:
        s.close()


@pytest.fixture
def slow_follow(monkeypatch: pytest.MonkeyPatch) -> None:
    """Verifiers whose followers poll only when a test says (server.follower.poll())."""
    monkeypatch.setattr(follow, "FOLLOW_S", 3600.0)


def test_a_forget_retires_what_another_verifier_stored_before_it(
    slow_follow: None, backend: Backend, tmp_path: Path
) -> None:
    """The operator forgets t on A after B stored t's seq 2, before A followed it: the forget
    retires seq 2 (the last stored), so following it does not bring t back on A, and B,
    which holds seq 2, forgets t too."""
    a_addr, b_addr = addrs(tmp_path)
    with (
        running_verifier(a_addr, backend.target) as a,
        running_verifier(b_addr, backend.target) as b,
    ):
        ag = Agent("ag", "t")
        try:
            ag.connect(a_addr)
            assert ag.report(1).accepted  # A holds seq 1
            ag.connect(b_addr)
            assert ag.report(2).accepted  # B holds seq 2; A has not followed it
            with grpc.insecure_channel(a_addr) as ch:
                pb_grpc.VerifierServiceStub(ch).ForgetTarget(
                    pb.ForgetTargetRequest(target="t"), timeout=10
                )
            a.follower.poll()
            b.follower.poll()
            assert "t" not in targets(a_addr) and "t" not in targets(b_addr)
            assert events(backend) == [("t", "forgotten")]
            db = open_database(backend.target, read_only=True)
            try:
                (last,) = db.execute("SELECT last_seq FROM target_events").fetchone()
            finally:
                db.close()
            assert int(last) == 2
            # a report after the forget brings it back, as ever
            assert ag.report(3).accepted
            a.follower.poll()
            assert "t" in targets(a_addr) and "t" in targets(b_addr)
        finally:
            ag.close()


def test_a_seq_below_one_another_verifier_stored_is_never_stored(
    pair: tuple[VerifierServer, VerifierServer], tmp_path: Path, backend: Backend
) -> None:
    """B stored seqs 1, 2 and 5; A, whose cache still says nothing is stored, gets seq 3:
    acknowledged (the agent's seqs only grow: it is behind), never stored, never judged."""
    a_addr, b_addr = addrs(tmp_path)
    at_a, at_b = Agent("ag", "t"), Agent("ag", "t")
    try:
        assert at_a.connect(a_addr) == 0
        at_b.connect(b_addr)
        for seq in (1, 2, 5):
            assert at_b.report(seq, pid=100 + seq).accepted
        assert at_a.report(3, pid=103).accepted
        db = open_database(backend.target, read_only=True)
        try:
            seqs = [int(r[0]) for r in db.execute("SELECT seq FROM reports ORDER BY rowid")]
        finally:
            db.close()
        assert seqs == [1, 2, 5]
        ev = pair[0].service.evaluator
        until("A follows seq 5", 30, lambda: _held(ev, "t") == ("ag", 5))
    finally:
        at_a.close()
        at_b.close()


def test_a_replica_whose_clock_runs_ahead_never_expires_a_target_another_hears(
    tmp_path: Path, pg_database: str
) -> None:
    """B's host clock is a minute ahead, more than the --target-expiry of both (5 s here; an
    hour's jump against the default hour). t's agent reports to A every 0.25 s. Before the
    fix B expired t on every report it followed, ledgered it, and A applied it: t dropped out
    of every run's verdict while it reported. Now t stays live on A and nothing expires."""
    expiry = ("--target-expiry", "5")
    a = Daemon(["serve", "--listen", f"unix:{tmp_path}/a.sock", "--db", pg_database, *expiry],
               tmp_path / "a.log").start()  # fmt: skip
    b_log = (tmp_path / "b.log").open("wb")
    b = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "skewed_clock.py"), "serve", "--listen",
         f"unix:{tmp_path}/b.sock", "--db", pg_database, *expiry],
        stdout=b_log, stderr=subprocess.STDOUT, env={**os.environ, "SKEW": "60"},
    )  # fmt: skip
    ag = Agent("ag", "t")
    try:
        for name in ("a", "b"):
            until(f"verifier {name}", 180, (tmp_path / f"{name}.sock").exists)  # loaded CI
        ag.connect(f"unix:{tmp_path}/a.sock")
        seen: list[str] = []
        for seq in range(1, 33):  # 8 s
            assert ag.report(seq).accepted
            state = targets(f"unix:{tmp_path}/a.sock").get("t")
            seen.append(state.state if state else "absent")
            time.sleep(0.25)
        assert set(seen) == {"live"}, seen
        # B saw the reports, a minute old by its clock: STALE there, not expired
        assert targets(f"unix:{tmp_path}/b.sock")["t"].state == "stale"
        assert events(Backend(pg_database)) == []
    finally:
        ag.close()
        a.stop()
        b.terminate()
        b.wait(timeout=30)
        b_log.close()


def test_a_stored_report_that_does_not_decode_is_skipped_at_start_not_fatal(
    backend: Backend, tmp_path: Path
) -> None:
    """A row whose body is not a report (edited, or stored by something that is not an agent)
    is never evidence, when loaded at start as when followed: the verifier starts (before the
    fix, every restart failed with exit 2, "invalid report", the whole fleet's gate down over
    one row), serves the other targets, and that target has no evidence here. The edit itself
    is the ledger's to catch (`audit verify`). Negative control: the other target, stored the
    same way, is loaded."""
    s = Store(backend.target)
    try:
        for agent, target in (("a", "t-edited"), ("b", "t-fine")):
            rep = StoredReport(agent, 1, target, time.time(), body(agent, target, 1))
            assert s.save_report(rep, {})
    finally:
        s.close()
    backend.sql(("UPDATE reports SET report = ? WHERE target = 't-edited'", (b"not a report",)))
    assert not backend.check().ok
    with running_verifier(f"unix:{tmp_path}/v.sock", backend.target) as server:
        assert [t.snapshot.target for t in server.service.evaluator.targets()] == ["t-fine"]
        with grpc.insecure_channel(f"unix:{tmp_path}/v.sock") as ch:
            got = pb_grpc.VerifierServiceStub(ch).ListTargets(pb.ListTargetsRequest())
        assert [t.target for t in got.targets] == ["t-fine"]
