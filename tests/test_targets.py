"""Targets expire and can be retired (issue 19, item 5).

The issue's failure: a target whose server crashed went STALE and then blocked every later run
for good, with no way to retire it. A target silent past ``--target-expiry`` now leaves every
run's verdict (recorded in the ledger as ``target`` ``expired``), and ``verifier target forget``
retires one at once (ledgered, operator role); both come back as new if they report again.
Every test runs the real servicer over real gRPC with reports of a real probed process.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.client.api import VerifierClient
from servewitness.errors import ConfigError, UsageError
from servewitness.model import Finding, TargetReport, Verdict
from servewitness.policy import TargetSnapshot, load_policy
from servewitness.policy.engine import evaluate_run
from servewitness.server.app import ServeConfig, VerifierServer
from servewitness.server.store import Store
from tests.helpers import agent_stub, verifier_cli
from tests.test_faults import FakeWorker, policy, probe_report, worker  # noqa: F401 - fixture
from tests.test_security import client, tls_verifier  # noqa: F401 - fixture

EXPIRY_S = 3.0
FRESHNESS_S = 1.5


def start(tmp: Path, expiry_s: float = EXPIRY_S) -> tuple[VerifierServer, str]:
    addr = f"unix:{tmp}/v.sock"
    config = ServeConfig(addr, tmp / "db.sqlite3", report_interval_s=0.2, target_expiry_s=expiry_s)
    server = VerifierServer(config)
    server.start()
    return server, addr


@pytest.fixture
def verifier(tmp_path: Path) -> Iterator[str]:
    server, addr = start(tmp_path)
    try:
        with VerifierClient(addr) as client:
            client.register_run("r", policy(FRESHNESS_S), "p.toml")
        yield addr
    finally:
        server.stop()


def send(addr: str, target: str, base: TargetReport) -> None:
    """One honest report of BASE's processes for TARGET, from agent TARGET-agent."""
    agent = f"{target}-agent"
    with grpc.insecure_channel(addr) as ch:
        stub = agent_stub(ch)
        hello = stub.Hello(pb.HelloRequest(agent_id=agent, targets=[target]))
        now = time.time()
        rep = TargetReport(agent, target, hello.last_seq + 1, hello.nonce, now, base.processes,
                           collected_unix=now - 0.05)  # fmt: skip
        assert stub.Report(pb.ReportRequest(report=wire.report_to_pb(rep))).accepted


def run_verdict(addr: str) -> tuple[Verdict, dict[str, Verdict]]:
    with VerifierClient(addr) as client:
        v = client.status("r")
    return v.verdict, {t.target: t.verdict for t in v.targets}


def states(addr: str) -> dict[str, str]:
    with VerifierClient(addr) as client:
        return {t.target: t.state for t in client.list_targets()}


def target_events(db: Path) -> list[tuple[str, str, str]]:
    store = Store(db)
    try:
        rows = store._query("SELECT target, event, by_whom FROM target_events ORDER BY rowid")
        assert store.verify_ledger().ok, store.verify_ledger().problem
        kinds = store._query("SELECT ref FROM ledger WHERE kind = 'target' ORDER BY seq")
        assert len(kinds) == len(rows)
        return [(str(t), str(e), str(b)) for t, e, b in rows]
    finally:
        store.close()


def wait_for(what: str, pred: object, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_crashed_servers_target_expires_and_stops_blocking_later_runs(
    worker: FakeWorker,  # noqa: F811
    verifier: str,
    tmp_path: Path,
) -> None:
    """The attack of the issue, reversed: target `old` reported once and its server crashed.
    Without expiry it is STALE for ever and every later run on this verifier is STALE with
    it. Silent past --target-expiry, it leaves the verdicts (ledgered); `new` then PASSes."""
    base = probe_report(worker.pid, tmp_path)
    send(verifier, "old", base)
    wait_for("old goes stale", lambda: run_verdict(verifier)[0] == Verdict.STALE)
    send(verifier, "new", base)
    assert run_verdict(verifier) == (Verdict.STALE, {"new": Verdict.PASS, "old": Verdict.STALE})

    def old_expired() -> bool:
        send(verifier, "new", base)  # `new` keeps reporting, as a live server's agent does
        return states(verifier).get("old") == "expired"

    wait_for("old expires", old_expired)
    assert run_verdict(verifier) == (Verdict.PASS, {"new": Verdict.PASS})
    assert target_events(tmp_path / "db.sqlite3") == [("old", "expired", "verifier")]
    # It left the selection with a finding, not in silence (issue 23, item 2): the run says
    # which selected target is gone from its verdict, as a WARNING (a PASS stays a PASS).
    (gone,) = expired_findings(verifier)
    assert (gone.severity.value, gone.context["target"]) == ("warning", "old"), gone
    assert "silent past the verifier's --target-expiry" in gone.message
    # It comes back, as new, when it reports again (and is judged again).
    send(verifier, "old", base)
    assert states(verifier) == {"new": "live", "old": "live"}
    assert run_verdict(verifier)[1] == {"new": Verdict.PASS, "old": Verdict.PASS}
    assert expired_findings(verifier) == []


def expired_findings(addr: str) -> list[Finding]:
    with VerifierClient(addr) as client:
        v = client.status("r")
    return [f for f in v.findings if f.id == "evidence.target_expired"]


def test_an_expired_target_the_run_does_not_select_is_not_named() -> None:
    """Negative control: a target outside the policy's selection expires without a word, and
    one that reported again since is not named either."""
    pol = load_policy(policy(30.0).replace("[evidence]", '[targets]\nnames = ["a"]\n[evidence]'))
    snap = TargetSnapshot("a", (), time.time())
    other = TargetSnapshot("b", (), time.time())
    v = evaluate_run("r", pol, "d", [snap], time.time(), expired=[other, snap])
    assert [f.id for f in v.findings if f.id == "evidence.target_expired"] == []
    v = evaluate_run("r", pol, "d", [], time.time(), expired=[snap])
    assert [f.context["target"] for f in v.findings if f.id == "evidence.target_expired"] == ["a"]


@pytest.fixture
def patient(tmp_path: Path) -> Iterator[str]:
    """A verifier whose targets expire only after a minute (the CLI takes seconds here)."""
    server, addr = start(tmp_path, expiry_s=60.0)
    try:
        with VerifierClient(addr) as client:
            client.register_run("r", policy(30.0), "p.toml")
        yield addr
    finally:
        server.stop()


def test_forget_retires_a_target_at_once_ledgered_and_it_can_come_back(
    worker: FakeWorker,  # noqa: F811
    patient: str,
    tmp_path: Path,
) -> None:
    """`verifier target forget` (the real CLI): the target leaves the verdicts and the list
    at once, the ledger says who retired it, an unknown name exits 2 (usage), and the target
    comes back as new when it reports again."""
    verifier = patient
    base = probe_report(worker.pid, tmp_path)
    send(verifier, "old", base)
    send(verifier, "new", base)
    gone = verifier_cli("target", "forget", "old", "--verifier", verifier, "--json")
    assert gone.returncode == 0, gone.stderr
    assert {k: v for k, v in json.loads(gone.stdout).items() if k != "last_report_unix"} == {
        "target": "old", "state": "live"
    }  # fmt: skip
    assert run_verdict(verifier)[1] == {"new": Verdict.PASS}
    assert set(states(verifier)) == {"new"}
    unknown = verifier_cli("target", "forget", "old", "--verifier", verifier)
    assert unknown.returncode == 2 and "no target named 'old'" in unknown.stderr, unknown.stderr
    listed = verifier_cli("target", "list", "--verifier", verifier)
    assert listed.returncode == 0 and listed.stdout.startswith("new  live"), listed.stdout
    # who forgot it: the CLI's kernel credentials on the verifier's Unix socket
    [(name, event, by)] = target_events(tmp_path / "db.sqlite3")
    assert (name, event) == ("old", "forgotten") and by.startswith(f"unix:uid={os.getuid()},pid=")
    send(verifier, "old", base)
    assert set(states(verifier)) == {"new", "old"}


def test_retired_targets_stay_retired_across_a_restart(
    worker: FakeWorker,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The database keeps what was retired: a restarted verifier does not load a forgotten
    target back, and an expired one stays expired (listed, in no verdict)."""
    base = probe_report(worker.pid, tmp_path)
    server, addr = start(tmp_path)
    try:
        with VerifierClient(addr) as client:
            client.register_run("r", policy(FRESHNESS_S), "p.toml")
        for name in ("gone", "quiet", "kept"):
            send(addr, name, base)
        with VerifierClient(addr) as client:
            client.forget_target("gone")
        wait_for("quiet and kept expire", lambda: set(states(addr).values()) == {"expired"})
        send(addr, "kept", base)
    finally:
        server.stop()
    server, addr = start(tmp_path)
    try:
        got = states(addr)
        assert got == {"quiet": "expired", "kept": "stale"}, got  # stale: age unknown
        assert set(run_verdict(addr)[1]) == {"kept"}
    finally:
        server.stop()


def test_an_expiry_not_above_a_runs_freshness_is_refused(tmp_path: Path) -> None:
    """A target must go stale before it expires, or a run would drop a silent target while
    its evidence still counted as fresh: refused at registration and at start."""
    server, addr = start(tmp_path, expiry_s=EXPIRY_S)
    try:
        with VerifierClient(addr) as client, pytest.raises(ConfigError, match="target-expiry"):
            client.register_run("slow", policy(EXPIRY_S), "p.toml")
        with VerifierClient(addr) as client:
            client.register_run("r", policy(FRESHNESS_S), "p.toml")
    finally:
        server.stop()
    with pytest.raises(ConfigError, match="target-expiry"):
        start(tmp_path, expiry_s=1.0)


def test_forget_needs_a_name(verifier: str) -> None:
    with VerifierClient(verifier) as client, pytest.raises(UsageError, match="target"):
        client.forget_target("")


def test_forget_needs_the_operator_role_and_list_a_reader_over_mutual_tls(
    tls_verifier: tuple[Path, str, Path],  # noqa: F811
) -> None:
    """Over mTLS: an auditor may list targets but not retire one (exit 10); an operator may
    (an unknown name is then exit 2, not a refusal)."""
    d, addr, _ = tls_verifier
    out = verifier_cli(*client(d, "audit", "target", "list", addr=addr))
    assert out.returncode == 0, out.stderr
    out = verifier_cli(*client(d, "audit", "target", "forget", "a", addr=addr))
    assert out.returncode == 10 and "needs the role operator" in out.stderr, out.stderr
    out = verifier_cli(*client(d, "ops", "target", "forget", "a", addr=addr))
    assert out.returncode == 2 and "no target named 'a'" in out.stderr, out.stderr
