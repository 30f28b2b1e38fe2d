"""A report's age measured on the agent's boot clock, not on its wall clock.

The agent is honest; only its host's wall clock moves. A report spooled while the verifier is
away, then delivered, is as old as it waited, whatever the wall clock did meanwhile (stepped
back after the collect, or ahead while the report waited and set right before the send): the
agent measures that wait on ``CLOCK_BOOTTIME`` (``servewitness/ageclock.py``), across its own
restarts (the reading is kept beside the report in the spool), and a report read before its
host rebooted has no age at all. The agent that spools runs in a process of its own, so the
one that delivers is a restarted agent reading the spool's files. The verifier is the real
servicer over real gRPC in this process (``tests/test_freshness.py``'s, runs r with
freshness 2 s and r30 with 30 s); the window attack itself is
``tests/test_gate_time_attacks.py::test_reports_collected_before_the_window_never_open_or_seal_it``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from servewitness import wire
from servewitness.ageclock import BootInstant
from servewitness.agent import runner
from servewitness.agent.spool import Spool
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.client.api import VerifierClient
from servewitness.model import TargetReport, Verdict
from servewitness.policy.interface import TargetSnapshot
from tests.helpers import REPO, agent_stub
from tests.test_faults import FakeWorker, probe_report, worker  # noqa: F401 - fixture
from tests.test_freshness import FRESHNESS_S, agent, skewed, verifier  # noqa: F401 - fixture

WAIT_S = 3.0  # how long a spooled report waits before it is delivered (> FRESHNESS_S)

# One life of the agent, in a process of its own: it collects once with its wall clock
# SKEW seconds off while no verifier listens, spools the report and exits.
SPOOLING_AGENT = """
import sys, time, types
from pathlib import Path
import grpc
from servewitness.agent import runner
from servewitness.agent.config import AgentConfig

spool, pid, skew = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
real, real_ns = time.time, time.time_ns
rest = {k: getattr(time, k) for k in dir(time) if not k.startswith("_")}
runner.time = types.SimpleNamespace(**{**rest, "time": lambda: real() + skew,
                                       "time_ns": lambda: real_ns() + int(skew * 1e9)})
a = runner.Agent(AgentConfig("unix:" + str(spool.parent / "nobody.sock"), "t", "fresh-agent",
                             spool, root_pid=pid, docker_socket=None))
try:
    a.step()
except grpc.RpcError:
    pass
a.channel.close()
print(len(a.spool))
"""


def spool_in_another_life(tmp: Path, pid: int, skew_s: float, wrap: tuple[str, ...] = ()) -> Path:
    """The spool directory (``tmp/spool``, the one ``agent()`` uses) after an agent whose wall
    clock was SKEW_S off spooled one report of PID in it and exited (run under WRAP)."""
    out = subprocess.run(
        [*wrap, sys.executable, "-c", SPOOLING_AGENT, str(tmp / "spool"), str(pid), str(skew_s)],
        check=False, capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert out.returncode == 0 and out.stdout.split()[-1:] == ["1"], out.stderr[-3000:]
    return tmp / "spool"


def status(addr: str, run: str) -> tuple[Verdict, float, list[str], list[str]]:
    """Target t's verdict in RUN: the verdict, when its evidence was read (verifier clock),
    its finding ids and their messages."""
    with VerifierClient(addr) as client:
        (t,) = client.status(run).targets
    assert t.report_unix is not None
    return t.verdict, t.report_unix, [f.id for f in t.findings], [f.message for f in t.findings]


def deliver_spool(a: runner.Agent) -> None:
    """A's spool drained to its verifier (only what was spooled: nothing newer is read)."""
    deadline = time.monotonic() + 30
    while len(a.spool):
        assert time.monotonic() < deadline
        try:
            a.drain()
        except grpc.RpcError:
            time.sleep(0.2)


@pytest.mark.parametrize(
    "skews",  # the agent's wall clock when it spools, when it sends
    [(8.0, 0.0), (0.0, -8.0)],
    ids=["ahead-while-it-waited-then-set-right", "stepped-back-after-the-collect"],
)
def test_a_report_that_waited_in_the_spool_is_as_old_as_it_waited_whatever_the_wall_clock_did(
    skews: tuple[float, float],
    worker: FakeWorker,  # noqa: F811
    verifier: str,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An agent collects once and spools the report (no verifier), and exits; WAIT_S later a
    restarted agent delivers it, its host's wall clock having moved 8 s back between the two
    (ahead while the report waited and set right; or right, then stepped back). Its
    ``sent_unix - collected_unix`` is 0 (``send`` never dates a report before it was built),
    so on wall-clock readings the report is fresh: it PASSed under freshness 2 s. On the boot
    clock it is WAIT_S old: STALE, dated WAIT_S before its delivery. The agent's next report,
    under the same clock, PASSes (control: the clock alone is no finding)."""
    spooling_skew_s, sending_skew_s = skews
    spool = spool_in_another_life(tmp_path, worker.pid, spooling_skew_s)
    assert [p.name for p in sorted(spool.glob("1.*"))] == ["1.collected", "1.pb"]
    time.sleep(WAIT_S)
    monkeypatch.setattr(runner, "time", skewed(sending_skew_s))
    a = agent(verifier, worker.pid, tmp_path)
    try:
        delivered = time.time()
        deliver_spool(a)
        verdict, read_unix, ids, _ = status(verifier, "r")
        assert (verdict, delivered - read_unix >= WAIT_S) == (Verdict.STALE, True), (
            ids, delivered - read_unix,
        )  # fmt: skip
        a.step()
    finally:
        a.channel.close()
    verdict, _, ids, _ = status(verifier, "r30")
    assert verdict == Verdict.PASS, ids


def time_namespace(boottime_s: int) -> tuple[str, ...]:
    """A command prefix that runs its command in a new time namespace whose CLOCK_BOOTTIME
    reads BOOTTIME_S more than the host's (what CRIU gives a restored container, so that its
    clocks go on from the checkpoint); the test is skipped, saying why, where none can be made."""
    wrap = ("unshare", "--time", f"--boottime={boottime_s}")
    try:
        ok = subprocess.run([*wrap, "true"], check=False, capture_output=True, timeout=30)
    except FileNotFoundError:
        pytest.skip("no unshare(1) to make a time namespace with")
    if ok.returncode != 0:
        pytest.skip(f"cannot make a time namespace here (CAP_SYS_ADMIN): {ok.stderr!r}")
    return wrap


def test_an_agent_in_another_time_namespace_ages_its_spool_on_the_hosts_boot_clock(
    worker: FakeWorker,  # noqa: F811
    verifier: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The agent that spooled ran in a time namespace whose boot clock reads 2 s ahead of the
    host's (a container restored by CRIU), its wall clock 8 s ahead; the one that delivers,
    WAIT_S later, in the host's, its wall clock right: the wall-clock span is 0, so the boot
    clock alone says how long the report waited. Taken as they read, its two readings put the
    report 1 s old; on the host's boot clock (each reading less its namespace's offset,
    ``/proc/self/timens_offsets``) it is WAIT_S old, as it waited: STALE under freshness 2 s,
    dated WAIT_S before its delivery."""
    wrap = time_namespace(2)
    spool_in_another_life(tmp_path, worker.pid, 8.0, wrap)
    time.sleep(WAIT_S)
    a = agent(verifier, worker.pid, tmp_path)
    try:
        delivered = time.time()
        deliver_spool(a)
    finally:
        a.channel.close()
    verdict, read_unix, ids, _ = status(verifier, "r")
    assert (verdict, delivered - read_unix >= WAIT_S) == (Verdict.STALE, True), (
        ids, delivered - read_unix,
    )  # fmt: skip


@pytest.mark.parametrize("reading", ["of-another-boot", "missing"])
def test_a_report_spooled_before_a_reboot_has_no_age_and_is_never_fresh(
    reading: str,
    worker: FakeWorker,  # noqa: F811
    verifier: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A spooled report whose boot-clock reading is of another boot (its host rebooted since:
    the clock restarted from zero) or missing (spooled by an agent older than the reading):
    its age is unknown, and it is delivered as such, a moment after it was read and with the
    wall clock right. STALE even under freshness 30 s, saying why; on wall-clock readings it
    PASSed. The next report PASSes."""
    spool = spool_in_another_life(tmp_path, worker.pid, 0.0)
    at = spool / "1.collected"
    if reading == "missing":
        at.unlink()
    else:
        doc = json.loads(at.read_text())
        at.write_text(json.dumps({**doc, "boot": "a-boot-before-this-one"}))
    a = agent(verifier, worker.pid, tmp_path)
    try:
        deliver_spool(a)
        verdict, _, ids, messages = status(verifier, "r30")
        assert verdict == Verdict.STALE, ids
        assert any("before its agent's host last rebooted" in m for m in messages), messages
        a.step()
    finally:
        a.channel.close()
    verdict, _, ids, _ = status(verifier, "r30")
    assert verdict == Verdict.PASS, ids


def test_the_verifier_takes_the_larger_of_the_boot_clock_age_and_the_wall_clock_span(
    worker: FakeWorker,  # noqa: F811
    verifier: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Reports over real gRPC, each read 0.1 s or 60 s before it was sent by one clock and the
    other (freshness 30 s): fresh only when both say so. 60 s on the boot clock with a
    wall-clock span of 0 is the honest agent whose clock was stepped; 60 s on the wall clock
    with a boot-clock age of 0.1 s is a machine its hypervisor paused (its boot clock stood
    still, its wall clock was set right since). No age at all, an agent older than the field,
    is judged on the wall clock as before. An age older than the epoch (1e10 s) is STALE, and
    dated no earlier than the epoch: a status answer a client can read (it refused the
    negative date, and the run's whole answer with it). A report that says both an age and
    that it has none is refused."""
    base = probe_report(worker.pid, tmp_path)
    got = []
    with grpc.insecure_channel(verifier) as ch:
        stub = agent_stub(ch)
        nonce = stub.Hello(pb.HelloRequest(agent_id="crafted", targets=["t"])).nonce
        cases = [(0.1, 0.1), (60.0, 0.0), (0.1, 60.0), (None, 0.1), (None, 60.0), (1e10, 0.0)]
        for seq, (age_s, wall_s) in enumerate(cases, start=1):
            sent = time.time()
            rep = TargetReport("crafted", "t", seq, nonce, sent, base.processes,
                               collected_unix=sent - wall_s, evidence_age_s=age_s)  # fmt: skip
            resp = stub.Report(pb.ReportRequest(report=wire.report_to_pb(rep)))
            assert resp.accepted
            nonce = resp.nonce
            got.append(status(verifier, "r30")[0])
        both = pb.ReportRequest(report=wire.report_to_pb(rep))
        both.report.seq, both.report.nonce = len(cases) + 1, nonce
        both.report.evidence_age_s, both.report.evidence_age_unknown = 0.1, True
        with pytest.raises(grpc.RpcError) as e:
            stub.Report(both)
    want = [Verdict.PASS, Verdict.STALE, Verdict.STALE, Verdict.PASS, Verdict.STALE, Verdict.STALE]
    assert got == want
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "evidence_age_unknown" in (e.value.details() or "")


def test_the_age_goes_on_the_wire_and_the_clock_reading_stays_in_the_spool(
    tmp_path: Path,
) -> None:
    """``evidence_age_s`` and ``evidence_age_unknown`` round-trip; the agent's own reading
    (``collected_at``) is never sent: a decoded report has none. The spool keeps it beside
    the report, and forgets it with the report, acknowledged or dropped for space."""
    rep = TargetReport("a", "t", 1, "", 10.0, (), collected_unix=9.0, evidence_age_s=4.5)
    back = wire.report_from_bytes(wire.report_to_bytes(rep))
    assert (back.evidence_age_s, back.evidence_age_unknown, back.collected_at) == (4.5, False, None)
    assert back.collect_s == 4.5  # the larger: 4.5 s on the boot clock, 1 s on the wall clock
    lost = TargetReport("a", "t", 1, "", 10.0, (), collected_unix=9.0, evidence_age_unknown=True)
    assert wire.report_from_bytes(wire.report_to_bytes(lost)).evidence_age_unknown

    spool = Spool(tmp_path, max_bytes=1000)
    at = BootInstant("boot-x", 12.5)
    spool.put(1, b"x" * 600, at)
    assert spool.collected_at(1) == at
    spool.put(2, b"y" * 600, BootInstant("boot-x", 13.0))  # over the budget: 1 is dropped
    assert (spool.dropped, spool.collected_at(1)) == (1, None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["2.collected", "2.pb"]
    spool.ack(2)
    assert list(tmp_path.iterdir()) == []


def test_an_age_is_measured_within_one_boot_only() -> None:
    """A reading of another boot, or one ahead of now (another clock), gives no age; evidence
    of no known age has no time on the verifier's clock, so it is never fresh and never
    after a window's open."""
    now = BootInstant("boot-b", 100.0)
    ages = [BootInstant(b, s).age_s(now) for b, s in (("boot-b", 40.0), ("boot-a", 40.0),
                                                      ("boot-b", 140.0))]  # fmt: skip
    assert ages == [60.0, None, None]
    snap = TargetSnapshot("t", (), 1000.0, received_boot_s=500.0, age_known=False)
    assert snap.evidence_boot_s is None
