"""Faults injected into real processes: a verifier or an agent killed with SIGKILL, a verifier
that cannot be reached, a verifier whose disk is full, a served process that crashes, an agent
whose clock is an hour off. Every test runs `verifier serve` and `verifier agent` as real
subprocesses (or the real servicer over real gRPC) and kills with real signals; no mocks.

The target is a small Python process with the real probe (``fake worker``): it declares a hook,
runs five engine "steps" through the probe's own worker wrapping and then waits, so a policy
PASSes on it without vLLM. Request bindings are appended to its probe's ``bindings.jsonl``
(the format in ``probe/servewitness_probe/layout.py``) while the agent reads it.

What each test shows, and what was lost: docs/faults.md.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from servewitness import wire
from servewitness.agent import runner
from servewitness.agent.config import AgentConfig
from servewitness.agent.runner import Agent
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.client.api import VerifierClient
from servewitness.model import TargetReport, Verdict
from servewitness.server.app import ServeConfig, VerifierServer
from servewitness.server.db import open_database
from servewitness.server.store import Store, StoredReport
from servewitness.testing.postgres import PostgresServer
from tests.helpers import Backend, agent_stub, not_vllm_policy, probe_env, state_dir, verifier_cli
from tests.test_gate_e2e import Daemon

AGENT_ID = "fault-agent"
RUNNER = """\
class Runner:
    def execute_model(self, so):
        return None


class Worker:
    rank = 0
    local_rank = 0

    def __init__(self):
        self.model_runner = Runner()

    def execute_model(self, so):
        return self.model_runner.execute_model(so)
"""
CHILD = """\
import os, sys, servewitness_probe as p
p.start()
from servewitness_probe import _core, _vllm
# Its bindings.jsonl is held open here, as the probe's writer holds it (a reader takes only a
# file the process holds for its own); the test appends the records (FakeWorker).
bindings = os.open(os.path.join(_core.STATE.dir, "bindings.jsonl"), os.O_WRONLY | os.O_CREAT)
import fakerunner

class SchedulerOutput:
    total_num_scheduled_tokens = 1
    num_scheduled_tokens = {"r": 1}

# The worker is defined in a file, as vLLM's is: code from no file is provenance.code.patched.
w = fakerunner.Worker()
_vllm._worker_initialised(w)  # what vLLM's WorkerBase.__init__ triggers: role, step counting
for _ in range(5):
    w.execute_model(SchedulerOutput())
print("up", flush=True)
sys.stdin.read()
"""


def policy(freshness_s: float = 30.0) -> str:
    return not_vllm_policy(
        f"version = 1\n[evidence]\nfreshness_s = {freshness_s}\n"
        '[runner]\nexpect_class = "fakerunner.Runner"\n'
        '[[hooks]]\nname = "h"\nrole = "worker"\nmin_fires_per_productive_step = 1.0\n'
    )


@dataclass
class FakeWorker:
    proc: subprocess.Popen[str]
    probe: Path  # this process's probe directory
    written: list[str] = field(default_factory=list)  # binding ids appended so far
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def append_bindings(self, n: int) -> None:
        """N finished-request records, appended in one write (as the probe's writer does)."""
        lines = []
        for _ in range(n):
            rid = f"req-{len(self.written)}"
            self.written.append(rid)
            t = time.time_ns()
            lines.append(json.dumps({"k": "req", "id": rid, "s0": 1, "s1": 5, "n": 5, "tok": 5,
                                     "t0": t, "t1": t, "f0": 1, "f1": 1, "hooks": {"h": 5},
                                     "end": "finished"}))  # fmt: skip
        with (self.probe / "bindings.jsonl").open("a") as f:
            f.write("\n".join(lines) + "\n")

    def stream_bindings(self, per_batch: int = 20, every_s: float = 0.05) -> None:
        def loop() -> None:
            while not self._stop.wait(every_s):
                self.append_bindings(per_batch)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def stop_bindings(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[FakeWorker]:
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "fakerunner.py").write_text(RUNNER)
    env = probe_env(tmp_path / "probe", PYTHONPATH=str(mods), VERIFIER_PROBE_BINDINGS="0",
                    VERIFIER_HOOKS="h=fakerunner:Runner.execute_model")  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
        probe = state_dir(tmp_path / "probe", proc.pid)
        assert probe.is_dir(), probe
        fw = FakeWorker(proc, probe)
        yield fw
        fw.stop_bindings()
    finally:
        proc.communicate(timeout=10)  # closes its pipes, killed or not


# the daemons -------------------------------------------------------------------------------
def serve(tmp: Path, db: str, addr: str, log: str = "serve.log", *extra: str) -> Daemon:
    args = ["-v", "serve", "--listen", addr, "--db", db, "--report-interval", "0.1", *extra]
    d = Daemon(args, tmp / log).start()
    wait_serving(addr, tmp / log)
    return d


def wait_serving(addr: str, log: Path, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with grpc.insecure_channel(addr) as ch:
                check = health_pb2_grpc.HealthStub(ch).Check  # type: ignore[attr-defined]
                check(health_pb2.HealthCheckRequest(service=""), timeout=1)
            return
        except grpc.RpcError:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)


def agent(tmp: Path, addr: str, pid: int, log: str = "agent.log", *extra: str) -> Daemon:
    return Daemon(["-v", "agent", "--verifier", addr, "--target", "t", "--agent-id", AGENT_ID,
                   "--pid", str(pid), "--interval", "0.1", "--spool", str(tmp / "spool"),
                   "--no-docker", *extra], tmp / log).start()  # fmt: skip


def wait_until(what: str, pred: Callable[[], bool], timeout_s: float = 30, *logs: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p}\n{p.read_text()[-3000:]}" for p in logs if p.exists())
            pytest.fail(f"timed out waiting for {what}\n{tails}")
        time.sleep(0.1)


# what is where -----------------------------------------------------------------------------
def query(db: str, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    conn = open_database(db, read_only=True)
    try:
        return [tuple(r) for r in conn.execute(sql, args).fetchall()]
    finally:
        conn.close()


def stored_seqs(db: str) -> list[int]:
    rows = query(db, "SELECT seq FROM reports WHERE agent_id = ? ORDER BY seq", (AGENT_ID,))
    return [int(r[0]) for r in rows]


def stored_bindings(db: str) -> list[str]:
    return [str(r[0]) for r in query(db, "SELECT internal_id FROM bindings WHERE target = 't'")]


def spooled(spool: Path) -> list[int]:
    """Sequence numbers the agent holds unacknowledged (acknowledged ones are unlinked)."""
    return sorted(int(p.stem) for p in spool.glob("*.pb") if p.stem.isdigit())


def counter(spool: Path) -> int:
    """The last sequence number the agent numbered a report with."""
    return int((spool / "seq").read_text())


def acknowledged_at_kill(spool: Path) -> tuple[int, set[int]]:
    """After the agent's verifier died: (last seq numbered, seqs acknowledged). A report is
    numbered (counter) before it is spooled, so the spool is listed a moment after the
    counter is read: every seq up to it is then spooled or was acknowledged."""
    last = counter(spool)
    time.sleep(0.5)
    return last, set(range(1, last + 1)) - set(spooled(spool))


def audit_verify(db: str) -> dict[str, Any]:
    out = verifier_cli("audit", "verify", "--db", db, "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    got: dict[str, Any] = json.loads(out.stdout)
    assert got["ok"], got
    return got


def sqlite_integrity(db: str) -> None:
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def log_events(log: Path, event: str) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            if rec.get("event") == event:
                out.append(rec)
    return out


# 1. the verifier killed during ingest ------------------------------------------------------
def test_verifier_sigkilled_mid_ingest_loses_nothing_it_acknowledged(
    backend: Backend, worker: FakeWorker, tmp_path: Path
) -> None:
    """An agent reports every 0.1 s with request bindings streaming in; the verifier is
    SIGKILLed mid-stream. Every report the agent saw acknowledged (gone from its spool) is in
    the database and the chain verifies; restarted on the same database, the verifier gets
    the rest from the agent's spool, each sequence number and each binding exactly once."""
    db, addr = backend.target, f"unix:{tmp_path}/v.sock"
    logs = (tmp_path / "serve.log", tmp_path / "agent.log")
    worker.stream_bindings()
    server = serve(tmp_path, db, addr)
    a = agent(tmp_path, addr, worker.pid)
    try:
        wait_until("15 reports stored", lambda: len(stored_seqs(db)) >= 15, 60, *logs)
        assert server.stop(signal.SIGKILL) == -signal.SIGKILL
        last, acked = acknowledged_at_kill(tmp_path / "spool")
        stored = stored_seqs(db)
        assert acked, "the agent had reports acknowledged before the kill"
        assert acked <= set(stored), f"acknowledged but not stored: {acked - set(stored)}"
        # in order, one at a time: what is stored is 1..k; at most the one in flight is
        # stored without its acknowledgement having reached the agent
        assert stored == list(range(1, len(stored) + 1)), stored
        assert len(set(stored) - acked) <= 1, (set(stored) - acked, last)
        got = audit_verify(db)
        assert got["entries"] >= len(stored)
        if not db.startswith("postgresql"):
            sqlite_integrity(db)

        server = serve(tmp_path, db, addr, "serve2.log")
        wait_until("the spool drained", lambda: max(stored_seqs(db)) > last + 5, 60, *logs)
        worker.stop_bindings()
        n = len(worker.written)
        wait_until("every binding stored", lambda: len(stored_bindings(db)) >= n, 30, *logs)
        assert a.stop() == 0
        assert server.stop() == 0
    finally:
        for d in (a, server):
            if d.proc is not None:
                d.stop(signal.SIGKILL)
    seqs = stored_seqs(db)
    assert seqs == list(range(1, counter(tmp_path / "spool") + 1))  # no gap, no duplicate
    assert spooled(tmp_path / "spool") == []
    ids = stored_bindings(db)
    assert sorted(ids) == sorted(worker.written), "each binding exactly once"
    assert audit_verify(db)["entries"] > len(seqs)


# 2. the agent killed and restarted on its spool ----------------------------------------------
def test_agent_sigkilled_and_restarted_on_its_spool_delivers_each_seq_once(
    worker: FakeWorker, tmp_path: Path
) -> None:
    """The agent is SIGKILLed twice: once mid-stream against a live verifier, once while the
    verifier was away and reports were spooled. Restarted on the same --spool, everything
    that was spooled is stored exactly once; the only seq that may be missing is the one the
    agent had numbered but not yet spooled when it died. (SQLite only: the store's side of
    redelivery is the same on PostgreSQL, which the verifier-kill test covers.)"""
    db, addr = str(tmp_path / "db.sqlite3"), f"unix:{tmp_path}/v.sock"
    spool = tmp_path / "spool"
    logs = (tmp_path / "serve.log", tmp_path / "agent.log")
    server = serve(tmp_path, db, addr)
    a = agent(tmp_path, addr, worker.pid)
    try:
        wait_until("10 reports stored", lambda: len(stored_seqs(db)) >= 10, 30, *logs)
        assert a.stop(signal.SIGKILL) == -signal.SIGKILL
        c1, pending1 = counter(spool), spooled(spool)
        a = agent(tmp_path, addr, worker.pid, "agent2.log")
        wait_until("restarted agent delivers", lambda: max(stored_seqs(db)) > c1 + 3, 30, *logs)
        assert set(pending1) <= set(stored_seqs(db))

        assert server.stop(signal.SIGKILL) == -signal.SIGKILL  # now the verifier is away
        wait_until("3 reports spooled", lambda: len(spooled(spool)) >= 3, 30, *logs)
        assert a.stop(signal.SIGKILL) == -signal.SIGKILL
        c2, pending2 = counter(spool), spooled(spool)
        assert len(pending2) >= 3
        server = serve(tmp_path, db, addr, "serve2.log")
        a = agent(tmp_path, addr, worker.pid, "agent3.log")
        wait_until("the spool delivered", lambda: max(stored_seqs(db)) > c2 + 3, 30, *logs)
        assert a.stop() == 0
        assert server.stop() == 0
    finally:
        for d in (a, server):
            if d.proc is not None:
                d.stop(signal.SIGKILL)
    seqs = stored_seqs(db)
    assert len(seqs) == len(set(seqs))
    assert set(pending1) | set(pending2) <= set(seqs), "every spooled report was delivered"
    gaps = set(range(1, seqs[-1] + 1)) - set(seqs)
    assert gaps <= {c1, c2}, gaps  # numbered, never spooled: nothing was acknowledged for it
    assert audit_verify(db)["entries"] > len(seqs)


# 3. the verifier unreachable -------------------------------------------------------------
def test_unreachable_verifier_bounded_spool_drops_oldest_and_the_gate_fails_closed(
    worker: FakeWorker, tmp_path: Path
) -> None:
    """With nowhere to deliver, the agent keeps at most --spool-max-bytes on disk, drops the
    oldest reports and says so (spool_dropped); `verifier wait` against an unreachable
    verifier, and against one that dies while the gate waits (called again until its
    timeout), exits 4, never 0."""
    addr = f"unix:{tmp_path}/v.sock"
    spool = tmp_path / "spool"
    report_bytes = len(wire.report_to_bytes(probe_report(worker.pid, tmp_path)))
    budget = int(report_bytes * 2.5)  # room for two reports
    a = agent(tmp_path, addr, worker.pid, "agent.log", "--spool-max-bytes", str(budget))
    try:
        wait_until("a report dropped", lambda: bool(log_events(tmp_path / "agent.log",
                                                               "spool_dropped")), 20,
                   tmp_path / "agent.log")  # fmt: skip
        sizes = [p.stat().st_size for p in spool.glob("*.pb")]
        assert 0 < sum(sizes) <= budget and len(sizes) <= 2, (sizes, budget)
        assert a.proc is not None and a.proc.poll() is None, "the agent keeps running"
        dropped = log_events(tmp_path / "agent.log", "spool_dropped")[-1]
        assert dropped["dropped"] >= 1 and dropped["max_bytes"] == budget
        # what was kept is the newest: every seq numbered below the oldest kept was dropped
        last = counter(spool)
        kept = spooled(spool)
        assert kept == list(range(last - len(kept) + 1, last + 1)) or kept == list(
            range(last - len(kept), last)
        ), (kept, last)
        assert log_events(tmp_path / "agent.log", "verifier_unreachable")
    finally:
        a.stop()

    gone = verifier_cli("wait", "r", "--timeout", "5", "--verifier", addr)
    assert gone.returncode == 4 and "unreachable" in gone.stderr, gone.stderr

    # a verifier that dies while the gate waits on it
    (tmp_path / "p.toml").write_text(policy().replace("[evidence]", '[targets]\nnames = ["x"]\n'
                                                       "[evidence]"))  # fmt: skip
    server = serve(tmp_path, str(tmp_path / "db.sqlite3"), addr, "serve.log",
                   "--run", f"r={tmp_path / 'p.toml'}")  # fmt: skip
    # (a wait calls an unreachable verifier again until its timeout: 6 s, not 60)
    gate = subprocess.Popen([str(Path(sys.executable).parent / "verifier"), "wait", "r",
                             "--timeout", "6", "--verifier", addr],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        time.sleep(1.0)  # the gate polls a PENDING run (no target x ever reports)
        assert gate.poll() is None
        server.stop(signal.SIGKILL)
        _, err = gate.communicate(timeout=20)
    finally:
        if gate.poll() is None:
            gate.kill()
            gate.communicate()
        if server.proc is not None:
            server.stop(signal.SIGKILL)
    assert gate.returncode == 4 and "unreachable" in err, (gate.returncode, err)


def probe_report(pid: int, tmp: Path) -> TargetReport:
    """One report of PID as the agent builds it (to size the spool budget)."""
    a = Agent(AgentConfig("unix:/nonexistent", "t", "sizer", tmp / "sizer-spool",
                          root_pid=pid, docker_socket=None))  # fmt: skip
    try:
        return a.collect()
    finally:
        a.channel.close()


# 4. the verifier's disk full ---------------------------------------------------------------
@contextmanager
def small_disk(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of SIZE mounted at WHERE (root: the CI machines and this project's hosts)."""
    where.mkdir()
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                         capture_output=True, text=True, check=False)  # fmt: skip
    if out.returncode != 0:
        pytest.fail(f"cannot mount a {size} tmpfs at {where} (needs root): {out.stderr.strip()}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], check=False)


def fill(path: Path) -> int:
    """Write PATH until the file system is full; the bytes written."""
    written = 0
    chunk = b"\0" * 65536
    with path.open("wb", buffering=0) as f:
        while True:
            try:
                written += f.write(chunk)
            except OSError:
                for small in (4096, 512, 1):
                    try:
                        while True:
                            written += f.write(chunk[:small])
                    except OSError:
                        continue
                return written


def test_disk_full_refuses_reports_unacknowledged_then_ingest_resumes(
    worker: FakeWorker, tmp_path: Path
) -> None:
    """The verifier's database on a tmpfs filled to the last byte: reports are refused with an
    error status (the agent keeps them spooled), none is acknowledged without being stored,
    the verifier keeps running, the database stays intact; once space is freed, the spooled
    reports are stored in order, each once."""
    addr = f"unix:{tmp_path}/v.sock"
    spool = tmp_path / "spool"
    logs = (tmp_path / "serve.log", tmp_path / "agent.log")
    # 32 MiB: the database and its WAL (up to 4 MiB) take a few; the filler takes the rest, so
    # that freeing it leaves room for a checkpoint (one that cannot grow the database file
    # fails, and with it every later write, until space is freed).
    with small_disk(tmp_path / "disk", "32M") as disk:
        db = str(disk / "db.sqlite3")
        worker.stream_bindings(per_batch=50)
        server = serve(tmp_path, db, addr)
        a = agent(tmp_path, addr, worker.pid)
        try:
            wait_until("5 reports stored", lambda: len(stored_seqs(db)) >= 5, 60, *logs)
            filler = disk / "filler"
            freed = fill(filler)
            assert freed > 16 << 20, f"the filler took only {freed} B: the database took the rest"

            def refused() -> list[dict[str, Any]]:
                events = log_events(tmp_path / "agent.log", "verifier_unreachable")
                # what the verifier answers: not stored, retry later
                return [e for e in events if e["code"] == "StatusCode.UNAVAILABLE"]

            wait_until("2 reports refused", lambda: len(refused()) >= 2, 60, *logs)
            assert server.proc is not None and server.proc.poll() is None, "verifier alive"
            last, acked = acknowledged_at_kill(spool)
            stored = stored_seqs(db)
            assert acked <= set(stored), f"acknowledged, not stored: {acked - set(stored)}"
            assert stored == list(range(1, len(stored) + 1))
            assert last > stored[-1], "reports were refused, not acknowledged"
            sqlite_integrity(db)
            audit_verify(db)
            not_stored = log_events(tmp_path / "serve.log", "report_not_stored")
            assert not_stored and "full" in not_stored[0]["error"], not_stored

            filler.unlink()  # space again
            # The agent backs off up to 30 s between attempts (AgentConfig.max_backoff_s), and
            # the checks above took a while on a loaded machine: one more backoff, then the
            # spool drains. A bound on waiting, not a speed target.
            free = os.statvfs(disk)
            listing = {f.name: f.stat().st_size for f in disk.iterdir()}
            wait_until(f"ingest resumed (free {free.f_bavail * free.f_frsize} B; {listing})",
                       lambda: max(stored_seqs(db)) > last + 3, 180, *logs)  # fmt: skip
            assert a.stop() == 0
            assert server.stop() == 0
        finally:
            worker.stop_bindings()
            for d in (a, server):
                if d.proc is not None:
                    d.stop(signal.SIGKILL)
        seqs = stored_seqs(db)
        assert seqs == list(range(1, counter(spool) + 1))  # nothing lost, nothing twice
        assert spooled(spool) == []
        sqlite_integrity(db)
        audit_verify(db)


# 5. a served process crashes ---------------------------------------------------------------
def status_json(addr: str, run: str) -> dict[str, Any]:
    out = verifier_cli("status", run, "--json", "--verifier", addr)
    assert out.returncode in (0, 1), out.stderr
    got: dict[str, Any] = json.loads(out.stdout)["runs"][0]
    return got


def test_process_sigkilled_mid_run_is_never_pass_after_and_goes_stale_without_its_agent(
    worker: FakeWorker, tmp_path: Path
) -> None:
    """The target PASSes; its process is SIGKILLed: within a few report intervals the run is
    no longer PASS (the agent reports the process gone; no processes is PENDING), and it
    never PASSes again; with the agent SIGKILLed too, the target goes STALE."""
    addr = f"unix:{tmp_path}/v.sock"
    logs = (tmp_path / "serve.log", tmp_path / "agent.log")
    (tmp_path / "p.toml").write_text(policy(freshness_s=2.0))
    server = serve(tmp_path, str(tmp_path / "db.sqlite3"), addr, "serve.log",
                   "--run", f"r={tmp_path / 'p.toml'}")  # fmt: skip
    a = agent(tmp_path, addr, worker.pid)
    try:
        wait_until("PASS", lambda: status_json(addr, "r")["verdict"] == "PASS", 30, *logs)
        worker.proc.kill()
        worker.proc.wait(timeout=10)
        killed = time.monotonic()
        seen: list[tuple[float, str, list[str]]] = []
        while time.monotonic() - killed < 4.0:
            run = status_json(addr, "r")
            (t,) = run["targets"]
            seen.append(
                (time.monotonic() - killed, run["verdict"], [f["id"] for f in t["findings"]])
            )
        first_not_pass = next(i for i, s in enumerate(seen) if s[1] != "PASS")
        # Promptly, and why: the agent reported the process gone (no processes), not the
        # evidence aging out (freshness_s is 2 s). What the verdict says, not a stopwatch.
        assert "evidence.no_processes" in seen[first_not_pass][2], seen
        assert "evidence.stale" not in seen[first_not_pass][2], seen
        after = seen[first_not_pass:]
        assert all(v != "PASS" for _, v, _ in after), seen
        assert after[-1][1] == "PENDING" and "evidence.no_processes" in after[-1][2], seen
        assert gone_pids(tmp_path / "db.sqlite3") == {worker.pid}  # reported gone

        assert a.stop(signal.SIGKILL) == -signal.SIGKILL
        wait_until("STALE", lambda: status_json(addr, "r")["verdict"] == "STALE", 10, *logs)
        (t,) = status_json(addr, "r")["targets"]
        assert t["verdict"] == "STALE" and "evidence.stale" in [f["id"] for f in t["findings"]]
    finally:
        for d in (a, server):
            if d.proc is not None:
                d.stop(signal.SIGKILL)


def gone_pids(db: Path) -> set[int]:
    """Every pid a stored report says has exited."""
    rows = query(str(db), "SELECT report FROM reports")
    return {k.pid for (r,) in rows for k in wire.report_from_bytes(bytes(r)).gone}


# 6. clock skew between agent and verifier --------------------------------------------------
@pytest.fixture
def verifier(tmp_path: Path) -> Iterator[str]:
    """The real servicer over real gRPC (in this process, to fake nothing but the agent's
    clock), with run r (freshness 30 s)."""
    addr = f"unix:{tmp_path}/v.sock"
    server = VerifierServer(ServeConfig(addr, tmp_path / "db.sqlite3", report_interval_s=0.2))
    server.start()
    try:
        with VerifierClient(addr) as client:
            client.register_run("r", policy(30.0), "p.toml")
        yield addr
    finally:
        server.stop()


def skewed_clock(skew_s: float) -> types.SimpleNamespace:
    """The agent module's view of ``time``: wall clock SKEW_S off (``time``, ``time_ns``),
    ``monotonic``, ``perf_counter`` and the rest untouched."""
    real, real_ns = time.time, time.time_ns
    rest = {k: getattr(time, k) for k in dir(time) if not k.startswith("_")}  # perf_counter...
    return types.SimpleNamespace(
        **{
            **rest,
            "time": lambda: real() + skew_s,
            "time_ns": lambda: real_ns() + int(skew_s * 1e9),
        }
    )


def target_verdict(addr: str) -> tuple[Verdict, float, list[str]]:
    with VerifierClient(addr) as client:
        (t,) = client.status("r").targets
    assert t.report_unix is not None
    return t.verdict, t.report_unix, [f.id for f in t.findings]


@pytest.mark.parametrize("skew_s", [3600.0, -3600.0])
def test_agent_clock_an_hour_off_is_dated_by_the_verifier_clock(
    skew_s: float, worker: FakeWorker, verifier: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A real agent whose wall clock is an hour ahead or behind: its evidence is dated on
    the verifier's clock (receipt minus the agent's own collect span), so it is neither
    STALE for the skew nor newer than it is; but clocks an hour apart are a finding
    (evidence.clock_skew, beyond [evidence] clock_skew_s: issue 19), so it is PENDING, never
    PASS. Crafted reports with the same skew whose evidence the agent read 60 s before
    sending are STALE (freshness 30 s), skew or not."""
    monkeypatch.setattr(runner, "time", skewed_clock(skew_s))
    a = Agent(AgentConfig(verifier, "t", AGENT_ID, tmp_path / "spool", interval_s=0.1,
                          root_pid=worker.pid, docker_socket=None))  # fmt: skip
    try:
        before = time.time()
        a.step()
        after = time.time()
    finally:
        a.channel.close()
    verdict, report_unix, ids = target_verdict(verifier)
    assert verdict == Verdict.PENDING and "evidence.clock_skew" in ids, ids
    assert before - 1.0 <= report_unix <= after, (report_unix, before, after)

    with grpc.insecure_channel(verifier) as ch:
        stub = agent_stub(ch)
        nonce = stub.Hello(pb.HelloRequest(agent_id="crafted", targets=["t"])).nonce
        held_from = time.monotonic()  # as an agent says how long it held the nonce
        base = probe_report(worker.pid, tmp_path)
        for seq, read_before_send_s, want in ((1, 0.2, Verdict.PENDING), (2, 60.0, Verdict.STALE)):
            sent = time.time() + skew_s
            rep = TargetReport("crafted", "t", seq, nonce, sent, base.processes,
                               collected_unix=sent - read_before_send_s,
                               nonce_held_s=time.monotonic() - held_from)  # fmt: skip
            resp = stub.Report(pb.ReportRequest(report=wire.report_to_pb(rep)))
            assert resp.accepted
            nonce, held_from = resp.nonce, time.monotonic()
            received = time.time()
            verdict, report_unix, ids = target_verdict(verifier)
            assert verdict == want and "evidence.clock_skew" in ids, ids
            assert abs(report_unix - (received - read_before_send_s)) < 1.0, report_unix


def test_spooled_report_delivered_late_is_dated_by_when_it_was_read(
    worker: FakeWorker, tmp_path: Path
) -> None:
    """A report spooled while the verifier was away, delivered 3 s later to a run whose
    freshness is 2 s: it is 3 s old evidence, so the target is STALE, not PASS (the agent
    stamps sent_unix when it sends, so the collect span it reports covers the spool time)."""
    addr = f"unix:{tmp_path}/v.sock"
    a = Agent(AgentConfig(addr, "t", AGENT_ID, tmp_path / "spool", interval_s=0.1,
                          root_pid=worker.pid, docker_socket=None))  # fmt: skip
    try:
        with pytest.raises(grpc.RpcError):
            a.step()  # nobody listens: spooled
        assert len(a.spool) == 1
        time.sleep(3.0)
        server = VerifierServer(ServeConfig(addr, tmp_path / "db.sqlite3"))
        server.start()
        try:
            with VerifierClient(addr) as client:
                client.register_run("r", policy(2.0), "p.toml")
            a.nonce = None
            deadline = time.monotonic() + 20
            while len(a.spool):
                assert time.monotonic() < deadline
                try:
                    a.drain()  # only the spooled report: nothing newer was read
                except grpc.RpcError:
                    time.sleep(0.2)
            verdict, report_unix, ids = target_verdict(addr)
            assert verdict == Verdict.STALE, ids
            assert time.time() - report_unix >= 3.0
            a.step()  # fresh evidence now
            assert target_verdict(addr)[0] == Verdict.PASS
        finally:
            server.stop()
    finally:
        a.channel.close()


def test_a_postgresql_restart_costs_one_refused_write_not_the_verifier(
    postgres: PostgresServer, pg_database: str
) -> None:
    """The server drops every connection on a restart: the write in flight fails (so it is
    not acknowledged), the next one reconnects, and the ledger is intact."""
    store = Store(pg_database)
    try:
        assert store.save_report(StoredReport("a", 1, "t", time.time(), b"one"), {})
        postgres.restart()
        with pytest.raises(store.errors):
            store.save_report(StoredReport("a", 2, "t", time.time(), b"two"), {})
        assert store.save_report(StoredReport("a", 2, "t", time.time(), b"two"), {})
        assert store.last_seq("a") == 2 and store.verify_ledger().ok
    finally:
        store.close()
