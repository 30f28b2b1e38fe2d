"""``verifier serve --processes N``: one verifier served by N processes on one TCP port.

Real processes, real gRPC over TCP, a real SQLite database: agents on connections of their own
(as a fleet's are) are spread by the kernel over the processes, each acknowledged report is
stored, every process answers with every target, the ledger is one chain; a process that
dies stops the verifier (exit 4) rather than leaving part of it serving, and none outlives the
first; arguments that cannot be shared are refused. No wall-clock thresholds: deadlines only
stop a hung test.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import grpc
import pytest

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.api.v1 import verifier_pb2_grpc as pb_grpc
from servewitness.server.db import open_database
from tests.helpers import VENV_BIN, agent_stub, not_vllm_policy, verifier_cli
from tests.test_backpressure import audit_ok
from tests.test_contention import manifest, report
from tests.test_listen_exclusive import free_port, free_ports, serving

CLI = [str(VENV_BIN / "verifier")] if (VENV_BIN / "verifier").exists() else [
    sys.executable, "-m", "servewitness"]  # fmt: skip
DEADLINE_S = 60.0


def wait_until(what: str, pred: Callable[[], bool], log: Path) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}\n{log.read_text()[-4000:]}")
        time.sleep(0.05)


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(c) for c in text.split()]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def metric(port: int, prefix: str) -> float:
    """The sum of the series starting with PREFIX on the metrics endpoint at PORT."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))


def accepted(port: int) -> float:
    return metric(port, 'verifier_reports_total{result="accepted"}')


@contextlib.contextmanager
def verifier(
    args: list[str], log: Path, prefix: Sequence[str] = ()
) -> Iterator[subprocess.Popen[bytes]]:
    """`verifier serve ARGS` (run under PREFIX, e.g. setpriv), killed with its children after."""
    with log.open("ab") as f:
        proc = subprocess.Popen([*prefix, *CLI, "serve", *args], stdout=f, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for c in children(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(c, signal.SIGKILL)


def own_connection(addr: str) -> grpc.Channel:
    """A channel with a TCP connection of its own (gRPC shares one per target otherwise)."""
    return grpc.insecure_channel(
        addr, options=[*wire.GRPC_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":  # writers queue on the file's flock
        return str(tmp_path / "v.sqlite3")
    return str(request.getfixturevalue("pg_database"))  # on PostgreSQL's advisory lock


@pytest.mark.parametrize("writer", ["writer process", "each commits"])
def test_processes_share_the_port_and_serve_as_one_verifier(
    tmp_path: Path, database: str, writer: str
) -> None:
    """Both ways of storing: one writer process for both serving processes (the default), and
    each serving process committing its own reports (--no-writer-process). The first process
    alone re-evaluates the run after new evidence and records its verdict history, for reports
    either process stored; the second computes no verdict unless asked for one."""
    port = free_port()
    metrics = free_ports(2, avoid=port)  # process I's metrics on metrics + I
    addr, db, log = f"127.0.0.1:{port}", database, tmp_path / "serve.log"
    policy = tmp_path / "p.toml"
    policy.write_text(POLICY)
    args = ["--processes", "2", "--listen", addr, "--db", db, "--run", f"r={policy}",
            "--metrics-listen", f"127.0.0.1:{metrics}"]  # fmt: skip
    more = 2 if writer == "writer process" else 1  # children: the second, and the writer
    args += [] if more == 2 else ["--no-writer-process"]
    acked: dict[str, int] = {}
    with verifier(args, log) as proc:
        serving(addr, proc, log)
        wait_until("the other processes", lambda: len(children(proc.pid)) == more, log)
        for m in (metrics, metrics + 1):  # each process its own metrics port
            wait_until(f"metrics on {m}", functools.partial(_answers, m), log)
        # agents on connections of their own until both processes acknowledged reports
        n = 0
        while min(accepted(metrics), accepted(metrics + 1)) == 0:
            assert n < 40, "40 connections and the kernel gave every one to one process"
            agent, target = f"agent-{n}", f"target-{n}"
            with own_connection(addr) as ch:
                stub = agent_stub(ch)
                nonce = stub.Hello(pb.HelloRequest(agent_id=agent, targets=[target])).nonce
                for seq in (1, 2, 3):
                    files = manifest(3, f"{agent}-{seq}")
                    ack = stub.Report(report(agent, target, files, seq, nonce))
                    assert ack.accepted, ack
                    nonce, acked[agent] = ack.nonce, seq
            n += 1
        targets = {f"target-{i}" for i in range(n)}

        # every process, asked on a connection of its own, knows every target (it follows
        # what the others stored)
        def everyone_sees_all() -> bool:
            for _ in range(6):
                with own_connection(addr) as ch:
                    got = pb_grpc.VerifierServiceStub(ch).ListTargets(pb.ListTargetsRequest())
                if {t.target for t in got.targets} != targets:
                    return False
            return True

        wait_until("every process listing every target", everyone_sees_all, log)
        # the history: the run's verdict over every target, those the second process stored too
        wait_until("the run's history over every target", lambda: judged(db) == targets, log)
        assert metric(metrics, "verifier_verdicts_total{") > 0  # the first evaluated the run
        assert metric(metrics + 1, "verifier_verdicts_total{") == 0  # the second did not
        others = children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=DEADLINE_S) == 0, log.read_text()[-3000:]
        wait_until("the other process gone", lambda: not any(map(alive, others)), log)
    store = open_database(db, read_only=True)
    try:
        stored = {(a, int(s)) for a, s in store.execute("SELECT agent_id, seq FROM reports")}
    finally:
        store.close()
    assert {(a, s) for a, last in acked.items() for s in range(1, last + 1)} <= stored
    audit_ok(db)  # one chain, whichever process appended


POLICY = not_vllm_policy('version = 1\n[[hooks]]\nname = "h"\nrole = "worker"\n')


def judged(db: str) -> set[str]:
    """The targets the verdict history's latest record of run r judged."""
    store = open_database(db, read_only=True)
    try:
        row = store.execute(
            "SELECT detail_json FROM verdicts WHERE run = 'r' ORDER BY rowid DESC LIMIT 1"
        ).fetchone()
    finally:
        store.close()
    return set() if row is None else set(json.loads(row[0])["targets"])


def _answers(port: int) -> bool:
    try:
        accepted(port)
    # Not listening yet. A connect to a free port of the ephemeral range can meet itself
    # (TCP simultaneous open) and read back its own request: BadStatusLine "GET /metrics".
    except (OSError, http.client.HTTPException):
        return False
    return True


def test_a_process_that_exits_stops_the_verifier(tmp_path: Path) -> None:
    addr, log = f"127.0.0.1:{free_port()}", tmp_path / "serve.log"
    args = ["--processes", "3", "--listen", addr, "--db", str(tmp_path / "v.sqlite3")]
    with verifier(args, log) as proc:
        serving(addr, proc, log)
        wait_until("three more processes", lambda: len(children(proc.pid)) == 3, log)
        everyone = children(proc.pid)
        first = next(c for c in everyone if not is_writer(c))  # a serving process
        os.kill(first, signal.SIGKILL)
        assert proc.wait(timeout=DEADLINE_S) == 4  # unavailable: restart all of it
        wait_until("the others gone", lambda: not any(map(alive, everyone)), log)
    said = rf"serving process [12] \(pid {first}\) exited with code -9; the other processes"
    assert re.search(said, log.read_text()), log.read_text()[-3000:]


def is_writer(pid: int) -> bool:
    """Whether PID is the store's writer process a verifier started."""
    return "--as-store-writer" in Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def test_no_process_outlives_the_first(tmp_path: Path) -> None:
    port = free_port()
    addr, log, metrics = f"127.0.0.1:{port}", tmp_path / "serve.log", free_ports(2, avoid=port)
    args = ["--processes", "2", "--listen", addr, "--db", str(tmp_path / "v.sqlite3"),
            "--metrics-listen", f"127.0.0.1:{metrics}"]  # fmt: skip
    with verifier(args, log) as proc:
        serving(addr, proc, log)
        wait_until("the other processes", lambda: len(children(proc.pid)) == 2, log)
        others = children(proc.pid)  # the second serving process and the writer
        # serving (its metrics answer): past its start-up check that the first is there
        wait_until("the second process serving", functools.partial(_answers, metrics + 1), log)
        proc.kill()  # no chance to stop the others: the kernel tells them (PR_SET_PDEATHSIG)
        proc.wait()
        wait_until("the other processes gone", lambda: not any(map(alive, others)), log)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--processes", "2", "--listen", "unix:/tmp/x.sock"], "needs a TCP --listen"),
        (["--processes", "2", "--listen", "127.0.0.1:0"], "needs a fixed port"),
        (["--processes", "0", "--listen", "127.0.0.1:9"], "--processes must be 1 to 64"),
        (["--process-index", "1", "--listen", "127.0.0.1:9"], "--process-index is given to"),
        (["--as-store-writer", "--listen", "127.0.0.1:9"], "--as-store-writer is given to"),
        (["--no-writer-process", "--listen", "127.0.0.1:9"], "goes with --processes N > 1"),
        (["--writer-process", "--listen", "127.0.0.1:9"], "goes with --processes N > 1"),
    ],
)
def test_what_cannot_be_shared_is_refused(args: list[str], says: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "VERIFIER_SERVE_PARENT"}
    cmd = [*CLI, "serve", *args, "--db", str(tmp_path / "v.sqlite3")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, check=False)
    assert out.returncode == 2, out.stderr
    assert says in out.stderr


def test_help_says_what_processes_share() -> None:
    out = verifier_cli("serve", "--help")
    assert "--processes N" in out.stdout and "--process-index" not in out.stdout


def test_a_process_whose_first_is_gone_does_not_serve(tmp_path: Path) -> None:
    """Started for a first process that died before it ran (its parent is someone else)."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    env = {**os.environ, "VERIFIER_SERVE_PARENT": str(gone.pid)}
    cmd = [*CLI, "serve", "--process-index", "1", "--listen", f"127.0.0.1:{free_port()}",
           "--db", str(tmp_path / "v.sqlite3")]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, check=False)
    assert out.returncode == 4, out.stderr
    assert "the verifier's first process is gone" in out.stderr


def test_sqlite_writers_of_two_processes_queue_in_the_kernel(tmp_path: Path) -> None:
    """A second writer on the same SQLite file waits for the first in the kernel's queue and
    goes the moment it commits, instead of polling with SQLite's busy handler (sleeps of up to
    100 ms: two --processes slept through most of their time). Shown with SQLite's own waiting
    switched off (busy_timeout 0): without the queue, the second BEGIN IMMEDIATE fails at once
    with "database is locked"."""
    import threading

    from servewitness.server.db import SQLiteDatabase

    path = tmp_path / "v.sqlite3"
    first, second = SQLiteDatabase(path), SQLiteDatabase(path)  # two open files, as 2 processes
    first.execute("CREATE TABLE t (x INTEGER)")
    second.raw.execute("PRAGMA busy_timeout = 0")
    first.begin()
    first.execute("INSERT INTO t VALUES (1)")
    began, failed = threading.Event(), []

    def write() -> None:
        try:
            second.begin()
            second.execute("INSERT INTO t VALUES (2)")
            second.commit()
        except Exception as e:  # noqa: BLE001 - reported to the test below
            failed.append(e)
        began.set()

    t = threading.Thread(target=write)
    t.start()
    assert not began.wait(0.5)  # queued behind the first writer (not failed, not through)
    first.commit()
    t.join(timeout=DEADLINE_S)
    assert failed == [] and began.is_set()
    assert [r[0] for r in first.execute("SELECT x FROM t ORDER BY x").fetchall()] == [1, 2]
    first.close()
    second.close()
