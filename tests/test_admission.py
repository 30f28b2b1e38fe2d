"""Admission by method class (server/admission.py): agents filling their bound are refused
RESOURCE_EXHAUSTED, counted as "busy" by method, while status reads, with a bound of their
own, are still answered; a slot is given back when its call ends.

A real verifier in this process over real gRPC (Unix socket), agents' bound 2. The agents'
slots are held deterministically: two Reports wait for the store, held here as a long
transaction would hold it. No wall-clock thresholds: deadlines only stop a hung test.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.server.admission import READ_LIMIT, grpc_limit
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
