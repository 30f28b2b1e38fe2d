"""Agents paced by a busy verifier instead of refused and retrying (servewitness/server/pacing.py).

The pace's arithmetic on a clock the test steps (up by 15 % a second in which more than 5 % of
agents' calls were refused, down by 5 % in any other, off below the report interval, never
beyond half the smallest freshness of the registered runs); then the real thing: a real
verifier (``--max-concurrent-rpcs 2``, one slot held by a stalled call) hammered by agents
reporting as fast as they can, whose acknowledgements come to carry a growing pace, and a real
``verifier agent`` that is told it and says it waits as asked. No wall-clock thresholds:
deadlines only stop a hung test.
"""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import grpc
import pytest

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.policy import policy_digest
from servewitness.server.evaluate import Evaluator
from servewitness.server.pacing import PACE_MAX_S, TICK_S, Pacer, freshness_limit_s
from servewitness.server.store import Store
from tests.helpers import agent_stub, as_weak_as_needed
from tests.test_backpressure import (
    BUSY,
    agent_events,
    agent_running,
    binding_report,
    stalled,
    stop,
    verifier,  # noqa: F401 - fixture
    wait_until,
)


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_pace_rises_with_refusals_falls_without_and_stays_within_its_limit() -> None:
    clock, limit = Clock(), [0.8]
    p = Pacer(0.5, lambda: limit[0], clock=clock)
    assert p.pace_s() == 0.0  # idle: no pace
    p.refused()
    assert p.pace_s() == 0.0  # within the second: not decided yet
    paces = []
    for _ in range(6):  # a second in which half the agents' calls were refused, each time
        p.refused()
        clock.now += TICK_S
        paces.append(round(p.pace_s(), 4))
    assert paces == [0.575, 0.6612, 0.7604, 0.8, 0.8, 0.8]  # x1.15 from the interval, capped
    for _ in range(98):  # a second of acknowledgements with 2 % of the calls refused
        p.pace_s()
    p.refused()
    p.refused()
    clock.now += TICK_S
    assert p.pace_s() == 0.76  # what a verifier at its capacity gives: lowered, not raised
    falling = []
    for _ in range(3):  # seconds without refusals
        clock.now += TICK_S
        falling.append(round(p.pace_s(), 4))
    assert falling == [0.722, 0.6859, 0.6516]
    limit[0] = 0.6  # a run with freshness 1.2 s registered: the cap follows at once
    clock.now += TICK_S
    assert p.pace_s() == 0.6
    while p.pace_s() > 0:
        clock.now += TICK_S
    assert p.current_s() == 0.0  # below the interval: off, not a pace shorter than it
    clock.now += TICK_S
    assert p.pace_s() == 0.0  # and stays off while nothing is refused


def test_the_limit_is_half_the_smallest_freshness_of_the_registered_runs(tmp_path: Path) -> None:
    store = Store(tmp_path / "v.sqlite3")
    try:
        ev = Evaluator(store)
        assert freshness_limit_s(store, ev) == PACE_MAX_S  # no run: the ceiling
        for name, fresh in (("slow", 60.0), ("quick", 4.0)):
            rules = '[[hooks]]\nname = "h"\nrole = "worker"\n'
            text = as_weak_as_needed(f"version = 1\n{rules}[evidence]\nfreshness_s = {fresh}\n")
            store.register_run(name, text, policy_digest(text), "test")
        assert freshness_limit_s(store, ev) == 2.0  # quick's targets must stay fresh
    finally:
        store.close()


def test_a_busy_verifier_paces_its_agents_and_a_real_agent_waits_as_asked(
    verifier: tuple[str, str, subprocess.Popen[bytes]],  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    """One of the verifier's two slots held, 8 threads report as fast as they can: calls are
    refused, and the acknowledgements that come back carry a pace that grows second after
    second (from the verifier's 0.1 s report interval, by 15 %). A real agent that reports
    every 0.1 s, started as the load ends (while hammered, it loses the race for the free
    slot and backs off), is told the pace and says it waits that long (within the 10 % it
    spreads it by), not its own interval."""
    addr, _, _ = verifier
    spool, log = tmp_path / "spool", tmp_path / "agent.log"
    paces: list[float] = []
    refused = [0]
    done = threading.Event()

    def hammer(i: int) -> None:
        agent, nonce, seq = f"h{i}", "", 1
        with grpc.insecure_channel(addr) as ch:
            stub = agent_stub(ch)
            while not done.is_set():
                try:
                    if not nonce:
                        hello = pb.HelloRequest(agent_id=agent, targets=["t-" + agent])
                        nonce = stub.Hello(hello, timeout=30).nonce
                    rep = wire.report_to_pb(binding_report(agent, seq, nonce, n=2))
                    ack = stub.Report(pb.ReportRequest(report=rep), timeout=30)
                except grpc.RpcError as e:
                    if e.code() != BUSY:  # busy: the nonce holds (as the agent keeps it)
                        nonce = ""
                    refused[0] += e.code() == BUSY
                    continue
                nonce, seq = ack.nonce, seq + 1
                paces.append(ack.next_report_in_s)

    with stalled(addr, 1):
        threads = [threading.Thread(target=hammer, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        try:
            wait_until("a pace of three steps (0.115, 0.1322, 0.1521 s)",
                       lambda: max(paces, default=0.0) >= 0.15, timeout_s=60)  # fmt: skip
        finally:
            done.set()
            for t in threads:
                t.join(timeout=60)
    assert refused[0] > 0
    steps = sorted({round(p, 4) for p in paces if p > 0})
    assert steps[:3] == [0.115, 0.1322, 0.1521], steps  # x1.15 a second, from the interval
    with agent_running(addr, "paced", spool, log) as agent:
        wait_until("the agent told the pace", lambda: "verifier_pace" in agent_events(log), log)
        assert stop(agent) == 0
    told = _pace_lines(log)
    assert told[0]["asked_s"] > 0.1, told  # the pace as it has fallen since the load ended
    for e in told:  # the pace spread by 10 % (agents told at once come back apart)
        assert max(0.1, 0.9 * e["asked_s"]) <= e["wait_s"] <= max(0.1, 1.1 * e["asked_s"]), e


def _pace_lines(log: Path) -> list[dict[str, float]]:
    """The agent's verifier_pace events: what it was asked, what it waits."""
    out = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            if event.get("event") == "verifier_pace":
                out.append({"asked_s": event["asked_s"], "wait_s": event["wait_s"]})
    return out


def test_a_pace_that_is_not_a_duration_is_a_malformed_reply() -> None:
    """An agent takes a pace only as a finite duration of 0 or more (what it then waits is
    also bounded by its longest backoff): anything else is a malformed reply, retried like
    an outage with the report kept."""
    ok = pb.ReportResponse(accepted=True, seq=1, nonce="n", next_report_in_s=2.5)
    assert wire.report_response_from_pb(ok).next_report_in_s == 2.5
    for bad in (-1.0, float("nan"), float("inf")):
        msg = pb.ReportResponse(accepted=True, seq=1, nonce="n", next_report_in_s=bad)
        with pytest.raises(wire.WireError, match="next_report_in_s"):
            wire.report_response_from_pb(msg)
