"""Admission by method class (server/admission.py): agents filling their bound are refused
RESOURCE_EXHAUSTED, counted as "busy" by method, while status reads, with a bound of their
own, are still answered; a slot is given back when its call ends.

A real verifier in this process over real gRPC (Unix socket), agents' bound 2. The agents'
slots are held deterministically: two Reports wait for the store, held here as a long
transaction would hold it. No wall-clock thresholds: deadlines only stop a hung test.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.server.admission import READ_LIMIT, ReadsFirst, grpc_limit
from tests.helpers import agent_stub, running_verifier
from tests.test_contention import HUNG_S, hello, manifest, report, wait_for, warm

BUSY = grpc.StatusCode.RESOURCE_EXHAUSTED


def code_of(call: grpc.Future[Any]) -> grpc.StatusCode:
    try:
        call.result(timeout=HUNG_S)
    except grpc.RpcError as e:
        got: grpc.StatusCode = e.code()
        return got
    return grpc.StatusCode.OK


def test_agents_at_their_bound_are_refused_busy_while_status_reads_are_answered(
    tmp_path: Path,
) -> None:
    """With both of the agents' slots held by Reports waiting for the store, a third Report
    and a Hello are refused RESOURCE_EXHAUSTED (counted: method Report and Hello, reason
    busy), while GetRunStatus and ListRuns are answered before either held Report is (with
    one gRPC limit for all, as before, they were refused too: test_backpressure's probe).
    Once the held Reports end, their slots are back: the next Report is accepted."""
    addr = f"unix:{tmp_path}/v.sock"
    with (
        running_verifier(addr, tmp_path / "db.sqlite3", workers=4, max_concurrent_rpcs=2) as server,
        grpc.insecure_channel(addr, options=list(wire.GRPC_OPTIONS)) as ch,
    ):
        refusals = server.service.metrics
        stub = agent_stub(ch)
        warm(stub)
        agents = [("a0", "t0"), ("a1", "t1"), ("a2", "t2")]
        nonces = [hello(stub, a, t) for a, t in agents]
        assert refusals.refused_calls("Report", "busy") == 0  # negative control
        agents_pool = server.admission.pools["Report"]
        with server.store._lock:  # the store is busy: reports wait for it, holding their slot
            held = [
                stub.Report.future(report(a, t, manifest(5, a), 1, n), timeout=HUNG_S)
                for (a, t), n in zip(agents[:2], nonces[:2], strict=True)
            ]
            wait_for("both agents' slots taken", lambda: agents_pool.in_flight == 2)
            third = stub.Report.future(
                report("a2", "t2", manifest(5, "a2"), 1, nonces[2]), timeout=HUNG_S
            )
            again = stub.Hello.future(pb.HelloRequest(agent_id="a2", targets=["t2"]))
            assert (code_of(third), code_of(again)) == (BUSY, BUSY)
            status = stub.GetRunStatus(pb.GetRunStatusRequest(name="r"), timeout=HUNG_S)
            runs = stub.ListRuns(pb.ListRunsRequest(), timeout=HUNG_S)
            assert (status.verdict.run, [r.name for r in runs.runs], [c.done() for c in held]) == (
                "r",
                ["r"],
                [False, False],
            )
        assert [c.result().accepted for c in held] == [True, True]
        wait_for("the slots given back", lambda: agents_pool.in_flight == 0)
        assert stub.Report(report("a2", "t2", manifest(5, "a2"), 1, nonces[2])).accepted
        busy = {
            m: refusals.refused_calls(m, "busy")
            for m in ("Report", "Hello", "GetRunStatus", "ListRuns")
        }
        assert busy == {"Report": 1, "Hello": 1, "GetRunStatus": 0, "ListRuns": 0}


def test_grpc_limit_is_above_both_bounds() -> None:
    """gRPC's own limit never decides for agents or reads: it is above both bounds together
    (and absent when there is no bound)."""
    limit = grpc_limit(64)
    assert limit is not None and limit > 64 + READ_LIMIT
    assert grpc_limit(None) is None


def test_calls_that_never_send_their_request_cannot_stall_the_refusals(tmp_path: Path) -> None:
    """Attack: with the agents' class full, a client opens calls to Hello that send headers
    and never their request (a slowloris). Refusing must not wait for a request: were the
    refusal to read it first, the first such call would hold the refusals' one thread and
    every later refusal would queue behind it, so a real agent's Hello would time out
    (DEADLINE_EXCEEDED) instead of being told RESOURCE_EXHAUSTED and backing off."""
    addr = f"unix:{tmp_path}/v.sock"
    release = threading.Event()

    def never() -> Iterator[pb.HelloRequest]:
        release.wait()
        yield from ()

    with (
        running_verifier(addr, tmp_path / "db.sqlite3", workers=4, max_concurrent_rpcs=2) as server,
        grpc.insecure_channel(addr, options=list(wire.GRPC_OPTIONS)) as ch,
    ):
        stub = agent_stub(ch)
        warm(stub)
        stalled = ch.stream_unary(
            "/verifier.api.v1.VerifierService/Hello",
            request_serializer=pb.HelloRequest.SerializeToString,
            response_deserializer=pb.HelloResponse.FromString,
        )
        try:
            held = [stalled.future(never()) for _ in range(2)]  # the class's two slots
            pool = server.admission.pools["Hello"]
            wait_for("the agents' slots held", lambda: pool.in_flight == 2)
            more = [stalled.future(never()) for _ in range(4)]  # arrive at a full class
            assert [code_of(c) for c in more] == [BUSY] * 4  # refused without a request
            real = stub.Hello.future(pb.HelloRequest(agent_id="a9", targets=["t9"]), timeout=10)
            assert code_of(real) == BUSY  # told, not left to time out
            assert [c.done() for c in held] == [False, False]  # the slots' holders still wait
        finally:
            release.set()
            for c in held:
                c.cancel()


# status reads before agents' reports (ReadsFirst) ---------------------------------------------
def _turn(rf: ReadsFirst) -> threading.Thread:
    """An agent's call, started on a thread of its own: it ends once its turn came."""
    t = threading.Thread(target=lambda: rf.turn().__enter__(), daemon=True)
    t.start()
    return t


def test_an_agents_call_waits_while_a_read_runs_and_starts_when_it_ends() -> None:
    """A status read is running: an agent's call reaching a worker waits (within the hold)
    until the read ends, then starts. Negative control: with no read running, it starts at
    once and nothing counts a wait."""
    rf = ReadsFirst(grant_s=HUNG_S)
    alone = _turn(rf)
    alone.join(HUNG_S)
    assert not alone.is_alive() and rf.waits["agents"] == 0  # no read: no wait
    with rf.reading():
        held = _turn(rf)
        wait_for("the agent's call waiting", lambda: rf.waiting["agents"] == 1)
        assert held.is_alive()
    held.join(HUNG_S)
    assert not held.is_alive() and (rf.waits["agents"], rf.holds, rf.waiting["agents"]) == (1, 1, 0)


def test_a_read_holds_agents_back_no_longer_than_its_grant() -> None:
    """A read that runs past its grant (here 0 s) holds nobody: agents' calls are delayed by
    reads, never stopped by one that does not end."""
    rf = ReadsFirst(grant_s=0.0)
    with rf.reading():
        t = _turn(rf)
        t.join(HUNG_S)
        assert not t.is_alive() and rf.waits["agents"] == 0


def test_reads_in_a_loop_hold_agents_back_only_their_share_of_the_time() -> None:
    """A client calling status in a loop: a read that begins before the last hold's cooldown
    (grant / share) is over holds nobody; one that begins after it holds again. The clock is
    the test's: no wall-clock thresholds."""
    now = [100.0]
    rf = ReadsFirst(grant_s=HUNG_S, share=HUNG_S / 10.0, clock=lambda: now[0])  # cooldown 10 s
    assert rf.cooldown_s == 10.0
    with rf.reading():
        assert rf.holds == 1
    now[0] += 9.0  # within the cooldown
    with rf.reading():
        t = _turn(rf)
        t.join(HUNG_S)
        assert not t.is_alive() and (rf.holds, rf.waits["agents"]) == (1, 0)
    now[0] += 1.0  # the cooldown is over
    with rf.reading():
        assert rf.holds == 2
        held = _turn(rf)
        wait_for("the agent's call waiting", lambda: rf.waiting["agents"] == 1)
    held.join(HUNG_S)
    assert not held.is_alive() and rf.waits["agents"] == 1


def _ingesting(server: Any, agent: str) -> bool:
    return bool(server.service.ingesting() == [agent])


def test_a_status_read_in_progress_holds_back_a_report_over_grpc(tmp_path: Path) -> None:
    """A real verifier, real gRPC: a GetRunStatus is running (held inside, at the evaluator,
    as a slow evaluation would be). A Report arriving meanwhile waits before its servicer runs
    (its agent is not being ingested) until the read ends, and is then accepted. Negative
    control: with holds off (grant 0), the next Report reaches its servicer while a read runs
    (its agent is being ingested, waiting at the held evaluator)."""
    addr = f"unix:{tmp_path}/v.sock"
    with (
        running_verifier(addr, tmp_path / "db.sqlite3", workers=4) as server,
        grpc.insecure_channel(addr, options=list(wire.GRPC_OPTIONS)) as ch,
    ):
        stub = agent_stub(ch)
        rf: ReadsFirst = server.reads_first
        rf.grant_s, rf.cooldown_s = HUNG_S, 0.0  # every read holds (the last one's no cooldown)
        warm(stub)
        nonces = {a: hello(stub, a, f"t-{a}") for a in ("a0", "a1")}
        for agent, holds in (("a0", True), ("a1", False)):
            rf.grant_s = HUNG_S if holds else 0.0
            with server.service.evaluator._lock:  # the status read stops inside, running
                status = stub.GetRunStatus.future(pb.GetRunStatusRequest(name="r"))
                wait_for("the status read running", lambda: rf.reads == 1)
                sent = report(agent, f"t-{agent}", manifest(5, agent), 1, nonces[agent])
                call = stub.Report.future(sent, timeout=HUNG_S)
                if holds:
                    wait_for("the report waiting for its turn", lambda: rf.waiting["agents"] == 1)
                    assert server.service.ingesting() == []
                else:
                    wait_for("the report ingesting", functools.partial(_ingesting, server, agent))
                    assert rf.waiting["agents"] == 0
            assert call.result(timeout=HUNG_S).accepted
            assert status.result(timeout=HUNG_S).verdict.run == "r"
        assert rf.waits["agents"] == 1


def test_the_history_keeper_and_the_follower_wait_for_a_status_read(tmp_path: Path) -> None:
    """The process's own passes over every target (the history keeper's, the follower's) take
    their turn after a status read running, as agents' calls do; once it ends they go on."""
    addr = f"unix:{tmp_path}/v.sock"
    with running_verifier(addr, tmp_path / "db.sqlite3") as server:
        rf: ReadsFirst = server.reads_first
        rf.grant_s, rf.cooldown_s = HUNG_S, 0.0
        with rf.reading():
            server.service.dirty.set()  # new evidence: the keeper's next pass is due
            wait_for("the keeper waiting", lambda: rf.waiting["history"] == 1)
            wait_for("the follower waiting", lambda: rf.waiting["follow"] == 1)
        wait_for("both gone on", lambda: rf.waiting["history"] + rf.waiting["follow"] == 0)
        assert rf.waits["history"] >= 1 and rf.waits["follow"] >= 1
