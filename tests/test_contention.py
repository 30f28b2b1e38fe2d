"""One agent's large report does not hold up everyone else: status calls are answered while it
is in its transaction, and another agent's report is stored while it is being checked.

A real verifier over real gRPC (a Unix socket in tmp_path); the large report is a real
100,000-file manifest (half the most one manifest may list), whose ingest is slow enough to
watch: on two cores about 0.8 s checking and preparing it, then about 2 s in its transaction
on SQLite (200,000 files: docs/operations.md). No wall-clock thresholds: each test asserts
ORDER, watching the phase the large ingest is in (``VerifierService.ingesting``; and
``Store.writing``, what the transaction in progress stores, with ``Store.transactions``);
deadlines only stop a hung test. The status test fails when a status call reads its run from
the database, the other with one lock across every agent's ingest (both tried).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.api.v1 import verifier_pb2_grpc as pb_grpc
from servewitness.model import (
    FileEntry,
    ProcessKey,
    ProcessReport,
    TargetReport,
    manifest_digest,
)
from servewitness.server.app import VerifierServer
from tests.helpers import Backend, agent_stub, not_vllm_policy, running_verifier

POLICY = not_vllm_policy('version = 1\n[[hooks]]\nname = "h"\nrole = "worker"\n')
BIG_FILES = 100_000  # half the most one manifest may list: the same phases, half the time
HUNG_S = 120.0  # only so that a hung test fails


def manifest(n: int, tag: str) -> tuple[FileEntry, ...]:
    """N files, their hashes fresh for TAG (so each manifest has a digest never seen)."""
    return tuple(
        FileEntry(
            f"/site-packages/pkg{i // 100}/mod{i}.py",
            hashlib.sha256(f"{tag}/{i}".encode()).hexdigest(),
            1000 + i,
            "source",
            f"pkg{i // 100}.mod{i}",
            "load",
        )
        for i in range(n)
    )


def report(
    agent: str, target: str, files: tuple[FileEntry, ...], seq: int = 1, nonce: str = ""
) -> pb.ReportRequest:
    digest = manifest_digest(files)
    proc = ProcessReport(
        key=ProcessKey("boot", 10, 20), ns_pid=10, ppid=1, start_time=1.0, role="worker",
        rank=0, container_id=None, cmdline=("python",), exe="/usr/bin/python3",
        probe_present=True, manifest_digest=digest, files=files,
    )  # fmt: skip
    rep = TargetReport(agent, target, seq, nonce or "0" * 32, time.time(), (proc,))
    return pb.ReportRequest(report=wire.report_to_pb(rep))


@pytest.fixture(scope="module")
def big() -> pb.ReportRequest:
    """The large report (built once: about 2 s); each test sets its nonce."""
    return report("big", "big-target", manifest(BIG_FILES, "big"))


@pytest.fixture
def served(backend: Backend, tmp_path: Path) -> Iterator[tuple[VerifierServer, str]]:
    with running_verifier(f"unix:{tmp_path}/v.sock", backend.target) as server:
        yield server, f"unix:{tmp_path}/v.sock"


@pytest.fixture
def stub(served: tuple[VerifierServer, str]) -> Iterator[pb_grpc.VerifierServiceStub]:
    with grpc.insecure_channel(served[1], options=list(wire.GRPC_OPTIONS)) as ch:
        yield agent_stub(ch)


def hello(stub: pb_grpc.VerifierServiceStub, agent: str, target: str) -> str:
    return str(stub.Hello(pb.HelloRequest(agent_id=agent, targets=[target])).nonce)


def wait_for(what: str, pred: Callable[[], bool]) -> None:
    deadline = time.monotonic() + HUNG_S
    while not pred():
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.002)


def warm(stub: pb_grpc.VerifierServiceStub) -> None:
    """A run registered and a small target reported: every status call has work to do."""
    stub.RegisterRun(pb.RegisterRunRequest(name="r", policy_toml=POLICY))
    nonce = hello(stub, "small", "small-target")
    assert stub.Report(report("small", "small-target", manifest(10, "warm"), 1, nonce)).accepted
    stub.GetRunStatus(pb.GetRunStatusRequest(name="r"))


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"], indirect=True)
def test_status_calls_are_answered_while_a_large_report_is_in_its_transaction(
    served: tuple[VerifierServer, str], stub: pb_grpc.VerifierServiceStub, big: pb.ReportRequest
) -> None:
    server = served[0]
    warm(stub)
    big.report.nonce = hello(stub, "big", "big-target")
    call = stub.Report.future(big, timeout=HUNG_S)
    wait_for("the large report in its transaction", lambda: server.store.writing == "report big/1")
    during = server.store.transactions
    status = stub.GetRunStatus(pb.GetRunStatusRequest(name="r"), timeout=HUNG_S)
    runs = stub.ListRuns(pb.ListRunsRequest(), timeout=HUNG_S)
    targets = stub.ListTargets(pb.ListTargetsRequest(), timeout=HUNG_S)
    # Answered inside that one transaction: still writing, no other transaction begun since,
    # and the large report not acknowledged yet.
    assert (server.store.writing, server.store.transactions, call.done()) == (
        "report big/1",
        during,
        False,
    )
    assert (status.verdict.run, [r.name for r in runs.runs]) == ("r", ["r"])
    assert [t.target for t in targets.targets] == ["small-target"]
    assert call.result().accepted
    assert status.verdict.verdict != pb.VERDICT_PASS  # nothing here fires the policy's hook


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_another_agents_report_is_stored_while_a_large_report_is_being_checked(
    served: tuple[VerifierServer, str], stub: pb_grpc.VerifierServiceStub, big: pb.ReportRequest
) -> None:
    server = served[0]
    warm(stub)
    nonce = hello(stub, "small", "small-target")
    small = report("small", "small-target", manifest(10, "second"), 2, nonce)
    big.report.nonce = hello(stub, "big", "big-target")
    call = stub.Report.future(big, timeout=HUNG_S)
    wait_for("the large report being checked", lambda: "big" in server.service.ingesting())
    assert stub.Report(small, timeout=HUNG_S).accepted
    done_then = call.done()
    assert call.result().accepted
    # Acknowledged while the large report was still in flight, and stored (its ledger entry)
    # before the large report's manifest: it did not wait for that agent's ingest at all.
    assert done_then is False
    entries = ledger_seqs(server)
    assert entries["small", 2] < entries["big", 1]


def ledger_seqs(server: VerifierServer) -> dict[tuple[str, int], int]:
    """Each report's first ledger entry: its manifest's, else its own."""
    rows = server.store.read(
        lambda db: db.execute(
            "SELECT l.seq, l.kind, l.ref FROM ledger l WHERE l.kind IN ('report', 'manifest') "
            "ORDER BY l.seq"
        ).fetchall()
    )
    reports = server.store.read(
        lambda db: db.execute("SELECT agent_id, seq, report FROM reports").fetchall()
    )
    digest_of: dict[str | None, tuple[str, int]] = {}
    for agent, seq, body in reports:
        rep = wire.report_from_bytes(bytes(body))
        for p in rep.processes:
            digest_of.setdefault(p.manifest_digest, (str(agent), int(seq)))
    out: dict[tuple[str, int], int] = {}
    for seq, kind, ref in rows:
        key = digest_of.get(ref) if kind == "manifest" else tuple(json.loads(ref))
        if key is not None:
            out.setdefault((str(key[0]), int(key[1])), int(seq))
    return out


def test_status_calls_are_answered_while_reports_hold_every_worker(tmp_path: Path) -> None:
    """Status reads have threads of their own (server/app.py READ_METHODS): with every one of
    the verifier's workers inside an agent's Report (both waiting for the store, held here as
    a long transaction would hold it), a GetRunStatus is still answered, before either report
    is. With one pool for all (as before), the status call queued behind the reports until
    the store was free (tried: this test then fails at its deadline)."""
    addr = f"unix:{tmp_path}/v.sock"
    with (
        running_verifier(addr, tmp_path / "db.sqlite3", workers=2) as server,
        grpc.insecure_channel(addr, options=list(wire.GRPC_OPTIONS)) as ch,
    ):
        stub = agent_stub(ch)
        warm(stub)
        agents = [("w0", "wt0"), ("w1", "wt1")]
        nonces = [hello(stub, a, t) for a, t in agents]
        with server.store._lock:  # the store is busy: reports wait for it, holding a worker
            calls = [
                stub.Report.future(report(a, t, manifest(10, a), 1, n), timeout=HUNG_S)
                for (a, t), n in zip(agents, nonces, strict=True)
            ]
            wait_for("every worker in a Report", lambda: server.service.ingesting() == ["w0", "w1"])
            status = stub.GetRunStatus(pb.GetRunStatusRequest(name="r"), timeout=HUNG_S)
            assert (status.verdict.run, [c.done() for c in calls]) == ("r", [False, False])
        assert [c.result().accepted for c in calls] == [True, True]
