"""Attacks on a report's time on the way: a real verifier over mTLS, the real agent's ``send``,
its traffic through a proxy that delays it (``tests/delaying_proxy.py``: what ``tc netem`` in
the serving pod's network namespace does, which the agent shares there).

The verifier dates evidence by the report's receipt less the age the agent measured. A report
held on the way arrives late and looked as if read late: evidence read before a window call,
delayed past it, opened the window (and sealed it). The nonce the report carries bounds its
time on the way (``server/nonces.py``); these attacks check that bound, and that an honest
agent behind a slow link still gets its windows, later."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.model import TargetReport
from servewitness.server.nonces import Issued
from tests.delaying_proxy import DelayingProxy, delaying
from tests.test_gate_time_attacks import Lab, content_of, deliver, procs, spooled, started_lab

DELAY_S = 1.5  # what the proxy holds the agent's bytes for: far above the lab's round trip


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """One verifier; each test on a target and run of its own."""
    with started_lab(tmp_path_factory.mktemp("transit")) as L:
        yield L


def agent_behind(L: Lab, target: str, proxy: DelayingProxy, spool: Path) -> Any:
    """The real agent with TARGET's credential, connected through PROXY (said Hello before
    the proxy is told to delay: the TLS handshake's round trips would outlast Hello's
    deadline)."""
    from servewitness.agent.config import AgentConfig
    from servewitness.agent.runner import Agent

    cfg = AgentConfig(proxy.addr, target, f"agent-{target}", spool, docker_socket=None,
                      tls=L.tls(f"agent-{target}"))  # fmt: skip
    agent = Agent(cfg)
    agent.hello()
    return agent


def fresh(agent: Any, n: int) -> None:
    """The agent reads its target now (procs(n=N)) and sends it straight away."""
    deliver(agent, spooled(agent, procs(n=n), time.time()))


def test_evidence_delayed_past_the_open_call_never_opens_the_window(
    lab: Lab, tmp_path: Path
) -> None:
    """Attack (time on the way): someone in the serving pod (its network namespace is the
    agent's) delays the agent's outgoing traffic by DELAY_S. Every report arrives that late;
    the one arriving just after a window call was read just before it. Here: evidence read,
    then the open call, then that evidence sent (with its true age), arriving DELAY_S later.

    Got, before the nonce bound: the window opened (evidence dated by receipt less age, i.e.
    DELAY_S after it was read: after the call). Sound: dated no later than it was read, so
    the open times out (``verifier exec`` exit 5)."""
    with delaying(lab.addr) as proxy:
        agent = agent_behind(lab, "spool", proxy, tmp_path / "spool")
        proxy.out_s = DELAY_S
        old = spooled(agent, procs(n=0), time.time())  # read now: before the call
        opened = lab.open("spool", lambda: deliver(agent, old), timeout_s=4.0)
    assert isinstance(opened, grpc.RpcError), f"opened on evidence read before the call: {opened}"
    assert opened.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "timed out" in (opened.details() or "")


def test_delaying_the_replies_too_never_makes_old_evidence_look_new(
    lab: Lab, tmp_path: Path
) -> None:
    """Variation: the replies delayed as well as the reports (the agent learns each nonce
    late, so it says it held it for less time than it existed). The bound counts that as time
    on the way too: evidence read before the call still never opens the window."""
    with delaying(lab.addr) as proxy:
        agent = agent_behind(lab, "late", proxy, tmp_path / "spool")
        proxy.out_s = proxy.back_s = DELAY_S / 2
        old = spooled(agent, procs(n=0), time.time())
        opened = lab.open("late", lambda: deliver(agent, old), timeout_s=4.0)
    assert isinstance(opened, grpc.RpcError), f"opened on evidence read before the call: {opened}"
    assert "timed out" in (opened.details() or "")


def test_evidence_delayed_past_the_seal_call_never_seals_the_window(
    lab: Lab, tmp_path: Path
) -> None:
    """Attack, at the other end: the window opened honestly; then the delay starts, and the
    evidence that reaches the seal was read before the seal call (the server may have changed
    in between, and the seal would not show it). Sound: the seal does not take it as the
    window's end (``window.no_fresh_evidence``), so it is not held."""
    with delaying(lab.addr) as proxy:
        agent = agent_behind(lab, "api", proxy, tmp_path / "spool")
        opened = lab.open("api", lambda: fresh(agent, 0))
        assert isinstance(opened, pb.OpenWindowResponse), opened
        proxy.out_s = DELAY_S
        old = spooled(agent, procs(n=40), time.time())  # read now: before the seal call
        req = pb.SealWindowRequest(
            window_id=opened.window_id, run="r-api", results_sha256=hashlib.sha256(b"").hexdigest(),
            results_size=0, results_name="-", timeout_s=4.0,
        )  # fmt: skip
        sealed = lab.while_waiting("SealWindow", req, lambda: deliver(agent, old), 4.0)
    assert isinstance(sealed, pb.SealWindowResponse), sealed
    codes = [f["id"] for f in content_of(sealed.seal_json)["seal"]["findings"]]
    assert not sealed.held and "window.no_fresh_evidence" in codes, codes


def test_an_honest_agent_behind_a_slow_link_still_gets_its_window(lab: Lab, tmp_path: Path) -> None:
    """Control: the same delays both ways, the agent reading its target afresh for each
    report. Its evidence is dated by the bound (up to a round trip older than it is), so the
    window opens and seals later than on a fast link, and the seal holds and verifies; the
    ages it records are at least the time the reports spent on the way."""
    with delaying(lab.addr) as proxy:
        agent = agent_behind(lab, "gen", proxy, tmp_path / "spool")
        proxy.out_s = proxy.back_s = DELAY_S / 2
        opened = lab.open("gen", lambda: fresh(agent, 0))
        assert isinstance(opened, pb.OpenWindowResponse), opened
        sealed = lab.seal("gen", opened.window_id, lambda: fresh(agent, 40))
    assert isinstance(sealed, pb.SealWindowResponse), sealed
    out = lab.verify_seal(sealed.seal_json, "slow-link")
    assert sealed.held and out.returncode == 0, out.stdout + out.stderr
    ages = [e["evidence_age_s"] for e in content_of(sealed.seal_json)["seal"]["evidence"]]
    assert ages and min(ages) >= DELAY_S / 2, ages


# ------------------------------------------------------------------ the bound, alone


def test_the_bound_is_the_time_since_issue_less_the_hold_and_never_below_zero() -> None:
    issued = Issued("n", at_boot_s=100.0)
    assert issued.transit_s(103.0, 2.5) == pytest.approx(0.5)  # the report's way and the reply's
    assert issued.transit_s(103.0, None) == pytest.approx(3.0)  # an older agent: since issue
    # a hold longer than the nonce has existed (a lie, or clocks apart): dated by receipt
    assert issued.transit_s(103.0, 60.0) == 0.0


@pytest.mark.parametrize("held", [-1.0, float("nan"), float("inf")])
def test_a_malformed_hold_is_refused_at_the_edge(held: float) -> None:
    msg = wire.report_to_pb(TargetReport("a", "t", 1, "n", time.time(), procs()))
    msg.nonce_held_s = held
    with pytest.raises(wire.WireError, match="nonce_held_s"):
        wire.report_from_pb(msg)


def test_the_hold_crosses_the_wire() -> None:
    rep = TargetReport("a", "t", 1, "n", time.time(), procs(), nonce_held_s=0.25)
    assert wire.report_from_pb(wire.report_to_pb(rep)).nonce_held_s == 0.25
    older = TargetReport("a", "t", 1, "n", time.time(), procs())  # an agent older than it
    assert wire.report_from_pb(wire.report_to_pb(older)).nonce_held_s is None


def test_the_agent_says_how_long_it_held_the_nonce(lab: Lab, tmp_path: Path) -> None:
    """The real agent's ``send`` puts its hold on the wire: at least the time since the reply
    that gave it the nonce (here a Hello, then HOLD_S of sleep), measured on its age clock."""
    hold_s = 1.0
    with delaying(lab.addr) as proxy:
        agent = agent_behind(lab, "reboot", proxy, tmp_path / "spool")
        sent: list[Any] = []
        report = agent.stub.Report

        def capture(req: Any, **kw: Any) -> Any:
            sent.append(req)
            return report(req, **kw)

        agent.stub.Report = capture
        time.sleep(hold_s)
        fresh(agent, 0)
        fresh(agent, 0)  # the next one holds the acknowledgement's nonce, a moment
    first, second = (r.report for r in sent)
    assert first.HasField("nonce_held_s") and first.nonce_held_s >= hold_s, first.nonce_held_s
    # held from the acknowledgement that gave it, not from the first nonce
    assert second.HasField("nonce_held_s") and second.nonce_held_s < first.nonce_held_s
