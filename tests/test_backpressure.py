"""Back-pressure: a verifier with more work than it takes answers RESOURCE_EXHAUSTED rather
than queueing without bound, stays healthy, and loses nothing it acknowledged; an agent told
so backs off with its reports spooled and delivers them once the load is gone.

Real processes over real gRPC: ``verifier serve --max-concurrent-rpcs 2`` and ``verifier
agent``. The verifier's two slots are held deterministically by stalled calls: a client that
opens a unary call and never sends its request message (a slow client), which gRPC counts as
in progress until it is cancelled. No wall-clock thresholds: deadlines only stop a hung test.
"""

from __future__ import annotations

import collections
import json
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.api.v1 import verifier_pb2_grpc as pb_grpc
from servewitness.model import ProcessKey, RequestId, RequestSpan, TargetReport
from tests.helpers import VENV_BIN, agent_stub, not_vllm_policy, verifier_cli

CLI = [str(VENV_BIN / "verifier")] if (VENV_BIN / "verifier").exists() else [
    sys.executable, "-m", "servewitness"]  # fmt: skip
POLICY = not_vllm_policy('version = 1\n[[hooks]]\nname = "h"\nrole = "worker"\n')
BUSY = grpc.StatusCode.RESOURCE_EXHAUSTED


def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as f:
        return subprocess.Popen([*CLI, *args], stdout=f, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=30)


def wait_until(what: str, pred: Callable[[], bool], *logs: Path, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s  # only so that a hung test fails
    while not pred():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p}\n{p.read_text()[-3000:]}" for p in logs if p.exists())
            pytest.fail(f"timed out waiting for {what}\n{tails}")
        time.sleep(0.05)


def health(addr: str) -> int:
    with grpc.insecure_channel(addr) as ch:
        check = health_pb2_grpc.HealthStub(ch).Check  # type: ignore[attr-defined]
        status: int = check(health_pb2.HealthCheckRequest(service=""), timeout=5).status
        return status


@pytest.fixture
def verifier(tmp_path: Path) -> Iterator[tuple[str, str, subprocess.Popen[bytes]]]:
    """A real verifier with room for two RPCs in progress: (address, database, process)."""
    addr, db, log = f"unix:{tmp_path}/v.sock", str(tmp_path / "v.sqlite3"), tmp_path / "serve.log"
    proc = start(["-v", "serve", "--listen", addr, "--db", db, "--report-interval", "0.1",
                  "--max-concurrent-rpcs", "2"], log)  # fmt: skip

    def up() -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            return health(addr) == health_pb2.HealthCheckResponse.SERVING
        except grpc.RpcError:
            return False

    wait_until("the verifier serving", up, log)
    try:
        yield addr, db, proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


@contextmanager
def stalled(addr: str, n: int) -> Iterator[None]:
    """N (of the verifier's 2) RPC slots held by calls the verifier has accepted and waits on:
    each sends its headers and never its request message. Both slots are taken first (seen
    taken when a real call is refused), then 2 - N are let go."""
    release = threading.Event()

    def never() -> Iterator[pb.HelloRequest]:
        release.wait()
        yield from ()

    with grpc.insecure_channel(addr) as ch:
        call = ch.stream_unary(
            "/verifier.api.v1.VerifierService/Hello",
            request_serializer=pb.HelloRequest.SerializeToString,
            response_deserializer=pb.HelloResponse.FromString,
        )
        probe = pb_grpc.VerifierServiceStub(ch)

        def full() -> bool:  # the slots are taken once a real agent's call is refused
            try:
                probe.Hello(pb.HelloRequest(), timeout=5)
            except grpc.RpcError as e:
                return bool(e.code() == BUSY)
            return False

        # A stalled call can end before its time (seen in CI on a loaded machine): a keeper
        # replaces any that ended, so the slots stay held for as long as the block runs.
        lock, stop = threading.Lock(), threading.Event()
        held: list[Any] = [call.future(never()) for _ in range(2)]

        def keeper() -> None:
            while not stop.is_set():
                with lock:
                    for i, f in enumerate(held):
                        if f.done():
                            held[i] = call.future(never())
                stop.wait(0.05)

        thread = threading.Thread(target=keeper, daemon=True)
        thread.start()
        try:
            wait_until("two stalled calls holding the verifier's slots", full, timeout_s=60)
            with lock:
                for f in held[n:]:
                    f.cancel()
                del held[n:]
            yield
        finally:
            stop.set()
            thread.join(timeout=10)
            with lock:
                for f in held:
                    f.cancel()
            release.set()


def binding_report(agent: str, seq: int, nonce: str, n: int = 20) -> TargetReport:
    now = time.time()
    key, api = ProcessKey("boot", 7, 70), ProcessKey("boot", 6, 60)
    spans = tuple(
        RequestSpan(key, f"{agent}-{seq}-{j}", seq, seq + 1, 1, 4, now, now, "", "", "R")
        for j in range(n)
    )
    ids = tuple(RequestId(api, f"{agent}-{seq}-{j}", f"x-{agent}-{seq}-{j}", now) for j in range(n))
    return TargetReport(agent, "t-" + agent, seq, nonce, now, (), spans=spans, request_ids=ids)


def rows(db: str, sql: str) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        return [tuple(r) for r in conn.execute(sql).fetchall()]


def audit_ok(db: str) -> None:
    out = verifier_cli("audit", "verify", "--db", db, "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)["ok"]


def test_hammered_verifier_refuses_stays_healthy_and_keeps_what_it_acknowledged(
    verifier: tuple[str, str, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """16 threads report as fast as they can (each its own agent id, retrying a refused seq
    after a new Hello, as the agent does) while one slow client holds one of the two slots:
    some calls are refused with RESOURCE_EXHAUSTED, the verifier keeps serving, and every
    report it acknowledged is stored exactly once, with its bindings."""
    addr, db, proc = verifier
    with grpc.insecure_channel(addr) as ch:
        pb_grpc.VerifierServiceStub(ch).RegisterRun(
            pb.RegisterRunRequest(name="bp", policy_toml=POLICY, source="test"), timeout=30
        )
    acked: dict[str, list[int]] = {}
    codes: collections.Counter[str] = collections.Counter()
    lock, enough = threading.Lock(), threading.Event()

    def hammer(n: int) -> None:
        agent, seq, nonce, mine = f"h{n}", 1, None, []
        with grpc.insecure_channel(addr, options=list(wire.GRPC_OPTIONS)) as ch:
            stub = agent_stub(ch)
            for _ in range(2000):  # bounded: the loop ends on `enough` long before
                if enough.is_set():
                    break
                try:
                    if nonce is None:
                        nonce = stub.Hello(
                            pb.HelloRequest(agent_id=agent, targets=["t-" + agent]), timeout=30
                        ).nonce
                    rep = wire.report_to_pb(binding_report(agent, seq, nonce))
                    resp = stub.Report(pb.ReportRequest(report=rep), timeout=30)
                except grpc.RpcError as e:
                    with lock:
                        codes[e.code().name] += 1
                    nonce = None
                    continue
                assert resp.accepted
                nonce = resp.nonce
                mine.append(seq)
                seq += 1
                with lock:
                    codes["OK"] += 1
                    if codes[BUSY.name] >= 20 and codes["OK"] >= 40:
                        enough.set()
        with lock:
            acked[agent] = mine

    with stalled(addr, 1):
        threads = [threading.Thread(target=hammer, args=(n,)) for n in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert codes[BUSY.name] > 0, codes
    assert set(codes) <= {"OK", BUSY.name}, f"only refusals, no other failure: {codes}"

    # healthy afterwards: the health service says SERVING and a status call is answered
    assert health(addr) == health_pb2.HealthCheckResponse.SERVING
    with grpc.insecure_channel(addr) as ch:
        stub = pb_grpc.VerifierServiceStub(ch)
        assert stub.GetRunStatus(pb.GetRunStatusRequest(name="bp"), timeout=30).verdict.run == "bp"
    assert proc.poll() is None
    assert stop(proc) == 0

    stored = collections.Counter(
        (str(a), int(s)) for a, s in rows(db, "SELECT agent_id, seq FROM reports")
    )
    want = {(a, s) for a, seqs in acked.items() for s in seqs}
    assert sum(len(v) for v in acked.values()) == codes["OK"]
    assert set(stored) == want, "stored = acknowledged (a refused call stores nothing)"
    assert all(c == 1 for c in stored.values())
    ids = collections.Counter(str(r[0]) for r in rows(db, "SELECT internal_id FROM bindings"))
    assert set(ids) == {f"{a}-{s}-{j}" for a, s in want for j in range(20)}
    assert all(c == 1 for c in ids.values()), "each binding exactly once"
    audit_ok(db)


@contextmanager
def agent_running(addr: str, agent_id: str, spool: Path, log: Path) -> Iterator[Any]:
    """A real `verifier agent` (every 0.1 s, target "t") on a process with nothing vLLM-like in
    it (its reports say unobservable); killed, with that process, however the block ends."""
    target = subprocess.Popen(["sleep", "600"])
    agent = start(["-v", "agent", "--verifier", addr, "--target", "t", "--agent-id", agent_id,
                   "--pid", str(target.pid), "--interval", "0.1", "--spool", str(spool),
                   "--no-docker"], log)  # fmt: skip
    try:
        yield agent
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        target.kill()
        target.wait()


def agent_events(log: Path) -> list[str]:
    out = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            out.append(str(json.loads(line).get("event")))
    return out


def test_agent_facing_a_busy_verifier_keeps_reports_spooled_and_delivers_each_once(
    verifier: tuple[str, str, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """Both slots held: the real agent is refused (RESOURCE_EXHAUSTED), logs verifier_busy
    (not verifier_unreachable), keeps numbering reports into its spool and acknowledges none
    of them; once the slots are free it delivers them, each sequence number exactly once, with
    the nonce it had (no Hello again)."""
    addr, db, proc = verifier
    spool, log = tmp_path / "spool", tmp_path / "agent.log"

    def stored() -> list[int]:
        return [int(r[0]) for r in rows(db, "SELECT seq FROM reports ORDER BY seq")]

    def spooled() -> list[int]:
        return sorted(int(p.stem) for p in spool.glob("*.pb") if p.stem.isdigit())

    with agent_running(addr, "bp-agent", spool, log) as agent:
        wait_until("3 reports stored", lambda: len(stored()) >= 3, log)
        with stalled(addr, 2):
            busy_from = len(stored())
            wait_until("the agent told twice that the verifier is busy",
                       lambda: agent_events(log).count("verifier_busy") >= 2, log)  # fmt: skip
            wait_until("reports spooled", lambda: len(spooled()) >= 2, log)
            held = spooled()
            # refused, so not acknowledged: still in the spool, and none of them stored
            assert len(stored()) <= busy_from + 1  # at most the one in flight when it began
            assert not set(held) & set(stored())
        wait_until("the spooled reports delivered",
                   lambda: set(held) <= set(stored()) and not set(held) & set(spooled()),
                   log, timeout_s=60)  # fmt: skip
        assert health(addr) == health_pb2.HealthCheckResponse.SERVING
        assert stop(agent) == 0
    assert stop(proc) == 0
    last = int((spool / "seq").read_text())
    seqs = [int(r[0]) for r in rows(db, "SELECT seq FROM reports WHERE agent_id = 'bp-agent'")]
    left = spooled()
    assert sorted(seqs) == sorted(set(range(1, last + 1)) - set(left)), "no gap, no duplicate"
    assert len(seqs) == len(set(seqs))
    events = agent_events(log)
    assert "verifier_busy" in events and "verifier_unreachable" not in events
    # One Hello for the whole run: a busy refusal came before the verifier read the call, so
    # the agent kept its nonce and its next report was accepted with it (a Hello after each
    # refusal was one more call per refusal to a verifier that is over capacity).
    assert events.count("connected") == 1, events
    audit_ok(db)
