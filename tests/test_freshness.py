"""Freshness on a clock that cannot be stepped back (issue 19, item 6's freshness half).

The verifier measures a target's evidence age on its age clock (``servewitness.server.clock``,
CLOCK_BOOTTIME), from when it received the report, and compares the report's own date (the
agent's wall clock) with its receipt: a report dated beyond ``[evidence] clock_skew_s`` ahead or
behind is ``evidence.clock_skew``, never fresh. Every test runs the real servicer over real gRPC
in this process (so that only the verifier's view of ``time`` is faked, as tests/test_faults.py
fakes the agent's) and a real probed child process (tests/test_faults.py's fake worker).
"""

from __future__ import annotations

import time
import types
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from servewitness import wire
from servewitness.agent.config import AgentConfig
from servewitness.agent.runner import Agent
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.client.api import VerifierClient
from servewitness.model import TargetReport, Verdict
from servewitness.server import service, store
from servewitness.server.app import ServeConfig, VerifierServer
from tests.helpers import agent_stub
from tests.test_faults import FakeWorker, policy, probe_report, worker  # noqa: F401 - fixture

FRESHNESS_S = 2.0
# Run "r30": the same policy with a freshness no load on a shared 2-core machine reaches
# between a report and the status asked right after it (the tests that need evidence to stay
# fresh across a step of the clock, not to go stale fast).
LENIENT_S = 30.0


def skewed(skew_s: float) -> types.SimpleNamespace:
    """A module's view of ``time``: the wall clock SKEW_S off, monotonic untouched (a clock
    stepped by NTP or an administrator moves the wall clock only: ``time`` and ``time_ns``;
    ``monotonic``, ``perf_counter`` and the rest are the real ones)."""
    real, real_ns = time.time, time.time_ns
    rest = {k: getattr(time, k) for k in dir(time) if not k.startswith("_")}  # perf_counter...
    return types.SimpleNamespace(
        **{
            **rest,
            "time": lambda: real() + skew_s,
            "time_ns": lambda: real_ns() + int(skew_s * 1e9),
        }
    )


def step_verifier_clock(monkeypatch: pytest.MonkeyPatch, skew_s: float) -> None:
    """Every view of the wall clock the verifier's servicer and store have, stepped."""
    monkeypatch.setattr(service, "time", skewed(skew_s))
    monkeypatch.setattr(store, "time", skewed(skew_s))


def start(addr: str, db: Path) -> VerifierServer:
    server = VerifierServer(ServeConfig(addr, db, report_interval_s=0.2))
    server.start()
    return server


@pytest.fixture
def verifier(tmp_path: Path) -> Iterator[str]:
    addr = f"unix:{tmp_path}/v.sock"
    server = start(addr, tmp_path / "db.sqlite3")
    try:
        with VerifierClient(addr) as client:
            client.register_run("r", policy(FRESHNESS_S), "p.toml")
            client.register_run("r30", policy(LENIENT_S), "p30.toml")
        yield addr
    finally:
        server.stop()


def agent(addr: str, pid: int, tmp: Path) -> Agent:
    return Agent(AgentConfig(addr, "t", "fresh-agent", tmp / "spool", interval_s=0.1,
                             root_pid=pid, docker_socket=None))  # fmt: skip


def target(addr: str, run: str = "r") -> tuple[Verdict, list[str]]:
    with VerifierClient(addr) as client:
        (t,) = client.status(run).targets
    return t.verdict, [f.id for f in t.findings]


def report_once(a: Agent) -> None:
    try:
        a.step()
    finally:
        a.channel.close()


def test_verifier_clock_stepped_back_an_hour_with_the_agent_dead_goes_stale(
    worker: FakeWorker,  # noqa: F811
    verifier: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The attack of the issue: the agent reports once and dies, and the verifier's wall clock
    is stepped back an hour. On wall-clock differences the evidence's age is then negative
    for an hour (PASS); on the age clock it is STALE after freshness_s, as if nothing moved.
    The controls (PASS before and right after the step) ask run r30: they need the evidence
    fresh, not fast (a loaded machine can take longer than freshness_s to answer them)."""
    report_once(agent(verifier, worker.pid, tmp_path))
    assert target(verifier, "r30")[0] == Verdict.PASS
    step_verifier_clock(monkeypatch, -3600.0)
    assert target(verifier, "r30")[0] == Verdict.PASS  # nothing aged: not stale at once
    time.sleep(FRESHNESS_S + 0.5)
    verdict, ids = target(verifier)
    assert verdict == Verdict.STALE, ids
    assert "evidence.stale" in ids


def test_verifier_clock_stepped_forward_does_not_age_live_evidence(
    worker: FakeWorker,  # noqa: F811
    verifier: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The other way: a wall clock stepped an hour forward right after an honest report does
    not make that report an hour old (on wall-clock differences it would be STALE at once);
    the clock disagreement is named on the next report instead."""
    a = agent(verifier, worker.pid, tmp_path)
    try:
        a.step()
        step_verifier_clock(monkeypatch, 3600.0)
        verdict, ids = target(verifier, "r30")
        assert verdict == Verdict.PASS, ids
        a.step()  # the agent's clock is now an hour behind the verifier's
    finally:
        a.channel.close()
    verdict, ids = target(verifier, "r30")
    assert verdict == Verdict.PENDING and "evidence.clock_skew" in ids, ids


def crafted(addr: str, worker_pid: int, tmp: Path, dates: list[float]) -> list[list[str]]:
    """Reports with the real worker's evidence, sent at each of DATES (the sender's clock,
    relative to now), one after another; each one's target findings after it was stored."""
    out = []
    base = probe_report(worker_pid, tmp)
    with grpc.insecure_channel(addr) as ch:
        stub = agent_stub(ch)
        nonce = stub.Hello(pb.HelloRequest(agent_id="crafted", targets=["t"])).nonce
        for seq, offset in enumerate(dates, start=1):
            sent = time.time() + offset
            rep = TargetReport("crafted", "t", seq, nonce, sent, base.processes,
                               collected_unix=sent - 0.1)  # fmt: skip
            resp = stub.Report(pb.ReportRequest(report=wire.report_to_pb(rep)))
            assert resp.accepted
            nonce = resp.nonce
            verdict, ids = target(addr, "r30")  # about dates, not freshness: see LENIENT_S
            out.append([verdict.value, *ids])
    return out


@pytest.mark.parametrize("offset_s", [3600.0, -3600.0, 45.0, -45.0])
def test_report_dated_beyond_the_tolerance_is_clock_skew_never_fresh(
    offset_s: float,
    worker: FakeWorker,  # noqa: F811
    verifier: str,
    tmp_path: Path,
) -> None:
    """A report dated an hour (or 45 s: beyond the default 30 s) ahead of or behind the
    verifier's receipt is evidence.clock_skew, PENDING; the same evidence dated honestly
    before and after it PASSes (negative control), so the finding is the date's alone."""
    honest, skewed_, honest_again = crafted(verifier, worker.pid, tmp_path, [0.0, offset_s, 0.0])
    assert honest[0] == Verdict.PASS.value and "evidence.clock_skew" not in honest, honest
    assert skewed_[0] == Verdict.PENDING.value and "evidence.clock_skew" in skewed_, skewed_
    assert honest_again[0] == Verdict.PASS.value, honest_again


def test_skew_within_the_tolerance_stays_fresh(
    worker: FakeWorker,  # noqa: F811
    verifier: str,
    tmp_path: Path,
) -> None:
    """Negative control: clocks 20 s apart (within the default 30 s) are not a finding."""
    got = crafted(verifier, worker.pid, tmp_path, [20.0, -20.0])
    assert [g[0] for g in got] == [Verdict.PASS.value] * 2, got
    assert not any("evidence.clock_skew" in g for g in got), got


def test_evidence_stored_before_a_restart_is_not_fresh_until_its_target_reports_again(
    worker: FakeWorker,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A restarted verifier lost its age clock's origin (and who sent the evidence): a report
    stored a moment before the restart is STALE, not fresh by its wall-clock date, until its
    target reports again; then it PASSes."""
    addr, db = f"unix:{tmp_path}/v.sock", tmp_path / "db.sqlite3"
    server = start(addr, db)
    try:
        with VerifierClient(addr) as client:
            client.register_run("r", policy(30.0), "p.toml")
        report_once(agent(addr, worker.pid, tmp_path))
        assert target(addr)[0] == Verdict.PASS
    finally:
        server.stop()
    server = start(addr, db)
    try:
        verdict, ids = target(addr)
        assert verdict == Verdict.STALE and "evidence.stale" in ids, ids
        report_once(agent(addr, worker.pid, tmp_path))
        verdict, ids = target(addr)
        assert verdict == Verdict.PASS, ids
    finally:
        server.stop()
