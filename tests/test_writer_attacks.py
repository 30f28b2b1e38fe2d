"""Attacks on ``verifier serve --processes N``'s store writer process
(servewitness/server/writer_process.py): one process commits every serving process's reports,
over socket pairs the verifier's processes inherited.

The rule under attack: a report the verifier acknowledged is durably stored, and nothing is
stored that a real agent did not send. Real `verifier serve --processes 2` processes (two
serving, one writer), real gRPC agents, real SQLite (and PostgreSQL where cheap), real faults
(SIGKILL, SIGSTOP, SIGTERM and a restart, a database trigger, another process of the same uid
taking a descriptor with ``pidfd_getfd``). No wall-clock thresholds: deadlines only stop a hung
test. A test that fails here is an attack that succeeds (its docstring says which).
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.model import ProcessKey, ProcessReport, TargetReport
from servewitness.server import writer_process
from servewitness.server.db import open_database
from tests.helpers import Backend, agent_stub
from tests.test_backpressure import audit_ok
from tests.test_contention import manifest, report
from tests.test_group_commit import HUNG_S, REFUSE, agent_loop, stored
from tests.test_listen_exclusive import free_port, free_ports, serving
from tests.test_processes import (
    DEADLINE_S,
    alive,
    children,
    is_writer,
    own_connection,
    verifier,
    wait_until,
)

REPO = Path(__file__).resolve().parent.parent
O_CLOEXEC = 0o2000000


@dataclass
class Verifier:
    proc: subprocess.Popen[bytes]
    addr: str
    db: str
    log: Path
    metrics: int  # process I's metrics on metrics + I
    writer: int  # the writer's pid
    second: int  # serving process 1's pid


@contextlib.contextmanager
def started(
    tmp_path: Path, db: str | None = None, port: int | None = None, prefix: Sequence[str] = ()
) -> Iterator[Verifier]:
    """`verifier serve --processes 2` (with its writer; run under PREFIX, a command such as
    setpriv's), serving; stopped (killed if need be) when the block ends."""
    port = port or free_port()
    metrics = free_ports(2, avoid=port)  # process I's metrics on metrics + I
    addr, log = f"127.0.0.1:{port}", tmp_path / f"serve-{port}.log"
    db = db or str(tmp_path / "v.sqlite3")
    args = ["--processes", "2", "--listen", addr, "--db", db,
            "--metrics-listen", f"127.0.0.1:{metrics}"]  # fmt: skip
    with verifier(args, log, prefix) as proc:
        serving(addr, proc, log)
        wait_until("the writer and serving process 1", lambda: len(children(proc.pid)) == 2, log)
        kids = children(proc.pid)
        (w,) = [c for c in kids if is_writer(c)]
        (second,) = [c for c in kids if c != w]
        yield Verifier(proc, addr, db, log, metrics, w, second)


def counter(port: int, result: str) -> float:
    """Process's verifier_reports_total{result=RESULT} (its metrics on PORT)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except (OSError, http.client.HTTPException):  # not serving yet (or met itself: a self-connect)
        return 0.0
    for line in text.splitlines():
        if line.startswith(f'verifier_reports_total{{result="{result}"}}'):
            return float(line.split()[-1])
    return 0.0


def answers(port: int) -> bool:
    """Whether a process serves its metrics on PORT (it is past its start)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5):
            return True
    except (OSError, http.client.HTTPException):  # a self-connect reads its own request back
        return False


def hello(ch: grpc.Channel, agent: str) -> str:
    return str(agent_stub(ch).Hello(pb.HelloRequest(agent_id=agent, targets=["t-" + agent])).nonce)


def small(agent: str, seq: int, nonce: str, tag: str = "") -> pb.ReportRequest:
    proc = ProcessReport(
        key=ProcessKey("boot", 10, 20), ns_pid=10, ppid=1, start_time=1.0, role="worker",
        rank=0, container_id=None, cmdline=("python", tag), exe="/usr/bin/python3",
        probe_present=True,
    )  # fmt: skip
    rep = TargetReport(agent, "t-" + agent, seq, nonce, 1.0, (proc,))
    return pb.ReportRequest(report=wire.report_to_pb(rep))


def outcome(ch: grpc.Channel, req: pb.ReportRequest, timeout: float) -> object:
    """The ack, or the RpcError."""
    try:
        return agent_stub(ch).Report(req, timeout=timeout)
    except grpc.RpcError as e:
        return e


def unavailable(o: object) -> bool:
    return isinstance(o, grpc.RpcError) and o.code() == grpc.StatusCode.UNAVAILABLE


def stored_once_with_retry(v: Verifier, agent: str, req: pb.ReportRequest) -> None:
    """Send REQ again after a new Hello (as the agent does with a report it keeps spooled):
    acknowledged (stored now, or a duplicate of the stored one)."""
    with own_connection(v.addr) as ch:
        req.report.nonce = hello(ch, agent)
        ack = agent_stub(ch).Report(req, timeout=HUNG_S)
    assert ack.accepted, ack


def acked_are_stored(db: str, *phases: dict[str, int]) -> None:
    have = stored(db)
    for acked in phases:
        assert sum(acked.values()) > 0, "nothing acknowledged: the check would be vacuous"
        missing = {(a, s) for a, last in acked.items() for s in range(1, last + 1)} - have
        assert not missing, f"acknowledged but not stored: {sorted(missing)[:10]}"


def socket_fds(pid: int) -> dict[int, str]:
    out = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:"):
                out[int(fd)] = link
    return out


def load(addr: str, names: list[str], acked: dict[str, int]) -> tuple[threading.Event, list[str]]:
    """Agents NAMES reporting as fast as they are acknowledged (until the event is set)."""
    stop, errors = threading.Event(), list[str]()
    for n in names:
        threading.Thread(
            target=agent_loop, args=(addr, n, stop, acked, errors), daemon=True
        ).start()
    return stop, errors


# 1 -------------------------------------------------------------------------------------------
def test_writer_sockets_are_held_by_one_pair_of_processes_each_and_cannot_be_opened(
    tmp_path: Path,
) -> None:
    """Attack: reach the writer's socket from outside its pair: open /proc/WRITER/fd/N (what
    a same-uid process would try first), or find a writer end inherited by another process
    (serving process, or anything they start: a descriptor without close-on-exec).
    Defence: a socket cannot be opened through /proc (ENXIO); no socket is held by two of the
    verifier's processes (each socket pair end lives in exactly one); every socket of the
    writer is close-on-exec once it stored a report (before its set-up, the ends it was
    given are inheritable: it starts nothing, so nothing inherits them). Non-vacuous: the
    writer holds sockets (its ends)."""
    with started(tmp_path) as v:
        with own_connection(v.addr) as ch:  # the writer set up: it stored a report
            ack = agent_stub(ch).Report(small("a0", 1, hello(ch, "a0")), timeout=HUNG_S)
            assert ack.accepted
        held = {p: socket_fds(p) for p in (v.proc.pid, v.second, v.writer)}
        assert len(held[v.writer]) >= 2, held  # an end per serving process
        inodes = [set(s.values()) for s in held.values()]
        for i, a in enumerate(inodes):
            for b in inodes[i + 1 :]:
                assert not a & b, f"a socket held by two processes: {a & b}"
        for fd in held[v.writer]:
            with pytest.raises(OSError):
                open(f"/proc/{v.writer}/fd/{fd}", "rb").close()
            flags = Path(f"/proc/{v.writer}/fdinfo/{fd}").read_text().split("flags:")[1]
            assert int(flags.split()[0], 8) & O_CLOEXEC, f"writer fd {fd} is inheritable"
        v.proc.send_signal(signal.SIGTERM)
        assert v.proc.wait(timeout=DEADLINE_S) == 0


# 2 -------------------------------------------------------------------------------------------
# Takes descriptor FD of process PID (pidfd_getfd) and sends on it: a pickled report no agent
# sent ("forged"), or a message that is not a report ("garbage").
THIEF = r"""
import ctypes, os, sys
from multiprocessing.connection import Connection
from servewitness.server import follow, report_rows
from servewitness.server.report_rows import StoredReport
pid, fd, what = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
libc = ctypes.CDLL(None, use_errno=True)
got = libc.syscall(438, os.pidfd_open(pid), fd, 0)  # pidfd_getfd
if got < 0:
    print("refused", ctypes.get_errno())
    sys.exit(0)
if what == "forged":
    rep = StoredReport("forged", 1, "t-forged", 100.0, b"no agent sent this")
    prepared = report_rows.prepare(rep, [], [])
    Connection(got).send((2**40, prepared, follow.ReceiptAt("agent:forged", 0.0)))
else:
    Connection(got).send(("not", "a", "report"))
print("sent")
"""


# Another process of the verifier's user, without CAP_SYS_PTRACE (what a same-uid process
# that is not root has: here root with that capability dropped from its bounding set).
NO_PTRACE = ["setpriv", "--inh-caps=-sys_ptrace", "--bounding-set=-sys_ptrace"]


def steal(pid: int, fd: int, what: str = "forged", prefix: Sequence[str] = NO_PTRACE) -> str:
    """THIEF run under PREFIX (by default without CAP_SYS_PTRACE) against FD of process PID,
    sending WHAT: "sent" or "refused ERRNO"."""
    thief = subprocess.run(
        [*prefix, sys.executable, "-c", THIEF, str(pid), str(fd), what],
        check=False, cwd=REPO, capture_output=True, text=True, timeout=HUNG_S,
    )  # fmt: skip
    assert thief.returncode == 0, thief.stderr
    return thief.stdout.strip()


def writer_fd(pid: int) -> int:
    """Serving process PID's end of its socket pair to the writer, as its environment says."""
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    (fd,) = [int(e.split(b"=", 1)[1]) for e in env if e.startswith(b"VERIFIER_STORE_WRITER_FD=")]
    return fd


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs util-linux's setpriv")
def test_a_same_uid_process_cannot_take_a_writer_socket_and_store_a_forged_report(
    tmp_path: Path,
) -> None:
    """Attack: another process of the verifier's uid, not one of its processes, takes serving
    process 1's end of its socket pair with pidfd_getfd(2) (which a same-uid process may do to
    any process it may ptrace) and sends the writer a pickled report no agent sent. Before the
    fix the writer stored the forgery with a ledger entry of its own, and `verifier audit
    verify` said the ledger was fine.
    Defence: every process of `--processes` is undumpable (PR_SET_DUMPABLE 0), so a process
    without CAP_SYS_PTRACE is refused the descriptor (EPERM) and nothing forged is stored.
    Negative control: the same thief, as it runs here, does take a socket from a dumpable
    process of the same uid (the method works; only the verifier's processes refuse it)."""
    ((mine, theirs),) = writer_process.pairs(1)
    holder = subprocess.Popen(  # as the verifier runs below: the same uid and capabilities
        [*NO_PTRACE, sys.executable, "-c", "import time; time.sleep(60)"],
        pass_fds=[theirs.fileno()],
    )
    try:
        assert steal(holder.pid, theirs.fileno()) == "sent"  # dumpable: taken, and sent on
        assert writer_process.connection(mine.detach()).poll(HUNG_S)  # it arrived here
    finally:
        holder.kill()
        holder.wait()
        theirs.close()
    # the verifier with the thief's capabilities: a root one with CAP_SYS_PTRACE would refuse
    # it whatever its dumpable flag (the kernel refuses a tracer lacking a capability the
    # target has), and so would prove nothing
    with started(tmp_path, prefix=NO_PTRACE) as v:
        # past their start (undumpable from there: between exec and that, a same-uid process
        # can take the socket, docs/operations.md): serving process 1 serves its metrics, the
        # writer stored a report
        wait_until("serving process 1's metrics", lambda: answers(v.metrics + 1), v.log)
        with own_connection(v.addr) as ch:
            ack = agent_stub(ch).Report(small("a0", 1, hello(ch, "a0")), timeout=HUNG_S)
            assert ack.accepted
        fd = writer_fd(v.second)
        assert fd in socket_fds(v.second), "its end is not where its environment says"
        took = {pid: steal(pid, fd) for pid in (v.second, v.writer, v.proc.pid)}
        v.proc.send_signal(signal.SIGTERM)
        assert v.proc.wait(timeout=DEADLINE_S) == 0
    assert all(t == f"refused {errno.EPERM}" for t in took.values()), took
    assert ("forged", 1) not in stored(v.db)
    audit_ok(v.db)


def test_a_serving_process_whose_writer_drops_it_stops_the_verifier(tmp_path: Path) -> None:
    """Attack: something with CAP_SYS_PTRACE (root: what undumpable does not stop) takes
    serving process 1's socket to the writer and sends it a message that is not a report.
    Defence: the writer drops that connection (and stores nothing of it); the serving process,
    which can no longer store anything, stops, and the verifier with it (exit 4, naming serving
    process 1), rather than serve on with every report refused. Non-vacuous: the message was
    sent (root is let through)."""
    with started(tmp_path) as v:
        wait_until("serving process 1's metrics", lambda: answers(v.metrics + 1), v.log)
        assert steal(v.second, writer_fd(v.second), "garbage", prefix=()) == "sent"
        others = children(v.proc.pid)
        assert v.proc.wait(timeout=DEADLINE_S) == 4
        wait_until("every process gone", lambda: not any(map(alive, others)), v.log)
    log = v.log.read_text()
    assert re.search(rf"serving process 1 \(pid {v.second}\) exited with code", log), log[-3000:]
    assert "store_writer_bad_request" in log and "serving_process_stops" in log, log[-3000:]
    assert not stored(v.db)
    audit_ok(v.db)


# 3 -------------------------------------------------------------------------------------------
def test_a_stopped_writer_gets_every_report_refused_within_the_bound_however_large(
    tmp_path: Path,
) -> None:
    """Attack (HANG today): SIGSTOP the writer (or any writer stuck without reading), then
    report. The docs: a serving process that gets no answer within 30 s refuses the report
    (UNAVAILABLE, "may be stored"). A small report is refused so. A report whose rows do not
    fit the socket pair's buffer (a 20,000-file manifest: MBs pickled) blocks in the
    unbounded send, holding the connection's send lock, so a small report sent after it to the
    same serving process ("late") waits behind it too: neither agent gets an answer, only its
    own deadline, however long.
    Defence asked for: both refused within the bound; after SIGCONT, each retried report is
    acknowledged and stored once, and the ledger verifies. Non-vacuous: a report was
    acknowledged before the stop."""
    bound = writer_process.ANSWER_S
    got: dict[str, object] = {}
    with started(tmp_path) as v:
        with own_connection(v.addr) as ch:
            ack = agent_stub(ch).Report(small("before", 1, hello(ch, "before")), timeout=HUNG_S)
            assert ack.accepted
        big_req = report("big", "t-big", manifest(20_000, "big"), 1)
        small_req, late_req = small("small", 1, ""), small("late", 1, "")

        def send(name: str, req: pb.ReportRequest, ch: grpc.Channel | None = None) -> None:
            with contextlib.ExitStack() as stack:
                ch = ch or stack.enter_context(own_connection(v.addr))
                req.report.nonce = hello(ch, name)
                got[name] = outcome(ch, req, bound + 30)

        os.kill(v.writer, signal.SIGSTOP)
        shared = own_connection(v.addr)  # "big" and then "late" on one serving process
        try:
            threads = [
                threading.Thread(target=send, args=("small", small_req)),
                threading.Thread(target=send, args=("big", big_req, shared)),
                threading.Thread(target=send, args=("late", late_req, shared)),
            ]
            for t in threads:
                t.start()
                t.join(2)  # only to send them in this order (the small one before the buffer fills)
            for t in threads:
                t.join(bound + 60)
        finally:
            os.kill(v.writer, signal.SIGCONT)
            shared.close()
        assert v.proc.poll() is None, "the verifier stopped"
        for name, req in (("small", small_req), ("big", big_req), ("late", late_req)):
            stored_once_with_retry(v, name, req)
        v.proc.send_signal(signal.SIGTERM)
        assert v.proc.wait(timeout=DEADLINE_S) == 0
    assert {("small", 1), ("big", 1), ("late", 1), ("before", 1)} <= stored(v.db)
    audit_ok(v.db)
    codes = {
        n: (o.code(), o.details()) if isinstance(o, grpc.RpcError) else o for n, o in got.items()
    }
    assert isinstance(got["small"], grpc.RpcError), codes
    assert got["small"].code() == grpc.StatusCode.UNAVAILABLE, codes
    assert "may be stored" in str(got["small"].details()), codes
    hung = {n: codes[n] for n in ("big", "late") if not unavailable(got[n])}
    assert not hung, (
        f"not refused within {bound:g} s by a serving process whose writer is stopped (a report "
        f"larger than the socket buffer, and a small one after it on its serving process): {hung}"
    )


# 4 -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("victim", ["serving process 1", "first process"])
def test_a_process_sigkilled_under_load_loses_nothing_acknowledged(
    tmp_path: Path, victim: str
) -> None:
    """Attack: SIGKILL a serving process, or the first process (the supervisor, which holds
    its own end to the writer), while agents report through the writer. Defence: the
    verifier stops whole (serving process: exit 4 naming it; first process: the others are
    told by PR_SET_PDEATHSIG and none outlives it, the writer included); every acknowledged
    report is stored; the ledger verifies. Non-vacuous: reports were acknowledged before the
    kill."""
    acked: dict[str, int] = {}
    with started(tmp_path) as v:
        stop, _ = load(v.addr, [f"a{i}" for i in range(6)], acked)
        wait_until("reports acknowledged", lambda: sum(acked.values()) >= 60, v.log)
        others = children(v.proc.pid)
        target = v.second if victim == "serving process 1" else v.proc.pid
        os.kill(target, signal.SIGKILL)
        code = v.proc.wait(timeout=DEADLINE_S)
        wait_until("every process gone", lambda: not any(map(alive, others)), v.log)
        stop.set()
    if victim == "serving process 1":
        assert code == 4
        said = rf"serving process 1 \(pid {v.second}\) exited with code -9"
        assert re.search(said, v.log.read_text()), v.log.read_text()[-3000:]
    else:
        assert code == -signal.SIGKILL
    acked_are_stored(v.db, acked)
    audit_ok(v.db)


# 5 -------------------------------------------------------------------------------------------
def test_the_same_seq_on_both_serving_processes_at_once_is_stored_once(tmp_path: Path) -> None:
    """Attack: one agent, Hello'd on several connections (the kernel spreads them over both
    serving processes), sends the same seq with different bodies on all of them at once, so
    that both processes hand the writer the same (agent, seq), possibly in one batch.
    Defence: each (agent, seq) is stored exactly once, and what is stored is one of the bodies
    acknowledged; the others are acknowledged as duplicates, not stored; the ledger verifies.
    Non-vacuous: both processes acknowledged this agent's reports (metrics), and some seq was
    acknowledged more than once."""
    agent, conns = "twin", 6
    acks: dict[int, list[str]] = {}

    def send(
        ch: grpc.Channel, i: int, req: pb.ReportRequest, go: threading.Barrier,
        results: list[tuple[str, object]],
    ) -> None:  # fmt: skip
        go.wait(HUNG_S)
        results[i] = (f"body-{i}", outcome(ch, req, HUNG_S))

    with started(tmp_path) as v:
        for seq in range(1, 21):  # new connections each round, until both processes answered
            chans = [own_connection(v.addr) for _ in range(conns)]
            try:
                nonces = [hello(ch, agent) for ch in chans]
                go = threading.Barrier(conns)
                results: list[tuple[str, object]] = [("", None)] * conns
                threads = [
                    threading.Thread(
                        target=send,
                        args=(ch, i, small(agent, seq, nonces[i], f"body-{i}"), go, results),
                    )
                    for i, ch in enumerate(chans)
                ]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(HUNG_S)
            finally:
                for ch in chans:
                    ch.close()
            acks[seq] = [
                body for body, r in results if isinstance(r, pb.ReportResponse) and r.accepted
            ]
            if all(counter(v.metrics + i, "accepted") > 0 for i in (0, 1)) and any(
                len(b) > 1 for b in acks.values()
            ):
                break
        per = {i: counter(v.metrics + i, "accepted") for i in (0, 1)}
        v.proc.send_signal(signal.SIGTERM)
        assert v.proc.wait(timeout=DEADLINE_S) == 0
    assert all(n > 0 for n in per.values()), per
    assert any(len(b) > 1 for b in acks.values()), acks
    db = open_database(v.db, read_only=True)
    try:
        rows = db.execute("SELECT seq, report FROM reports WHERE agent_id = ?", (agent,)).fetchall()
    finally:
        db.close()
    seqs = [int(s) for s, _ in rows]
    assert len(seqs) == len(set(seqs)), f"a seq stored twice: {sorted(seqs)}"
    for seq, bodies in acks.items():
        if not bodies:
            continue
        (body,) = [bytes(b) for s, b in rows if int(s) == seq]
        assert sum(tag.encode() in body for tag in bodies) == 1, (seq, bodies)
    audit_ok(v.db)


# 6 -------------------------------------------------------------------------------------------
def test_a_report_the_database_refuses_is_refused_alone_and_never_acknowledged(
    tmp_path: Path, backend: Backend
) -> None:
    """Attack: a report the database refuses (a trigger, as a full disk or a constraint
    would) arrives through the writer among other agents' reports, and is retried after the
    refusal. Defence: it is refused each time (UNAVAILABLE with the database's reason), never
    acknowledged nor stored (a retry is not taken for a stored duplicate); the others keep
    being acknowledged and stored; the verifier keeps serving; the ledger verifies."""
    acked: dict[str, int] = {}
    database = backend.target
    with started(tmp_path, db=database) as v:
        kind = "postgresql" if database.startswith("postgres") else "sqlite"
        backend.sql(*REFUSE[kind])
        stop, errors = load(v.addr, [f"a{i}" for i in range(4)], acked)
        wait_until("reports acknowledged", lambda: sum(acked.values()) >= 20, v.log)
        refusals = []
        for _ in range(3):
            with own_connection(v.addr) as ch:
                refusals.append(outcome(ch, small("refused", 1, hello(ch, "refused")), HUNG_S))
        before = sum(acked.values())
        wait_until("more acknowledged after", lambda: sum(acked.values()) >= before + 20, v.log)
        stop.set()
        assert v.proc.poll() is None
        v.proc.send_signal(signal.SIGTERM)
        assert v.proc.wait(timeout=DEADLINE_S) == 0
    for r in refusals:
        assert isinstance(r, grpc.RpcError), r
        assert r.code() == grpc.StatusCode.UNAVAILABLE, r
        assert "refused by the test" in str(r.details()), r.details()
    assert not errors, errors
    have = stored(database)
    assert not {k for k in have if k[0] == "refused"}
    acked_are_stored(database, acked)
    audit_ok(database)


# 7 -------------------------------------------------------------------------------------------
def test_a_large_report_goes_through_the_writer_whole(tmp_path: Path) -> None:
    """Attack: a large report (a 30,000-file manifest, MBs of pickled rows: many times the
    socket pair's buffer) through the writer while other agents report: a framing error
    would truncate it, mix it with another report's bytes, or kill the connection. Defence:
    it is acknowledged and stored whole (every file row, ledgered); the other agents' reports
    keep being acknowledged and stored; the ledger verifies."""
    n = 30_000
    acked: dict[str, int] = {}
    with started(tmp_path) as v:
        stop, errors = load(v.addr, [f"a{i}" for i in range(3)], acked)
        files = manifest(n, "large")
        with own_connection(v.addr) as ch:
            ack = agent_stub(ch).Report(
                report("large", "t-large", files, 1, hello(ch, "large")), timeout=HUNG_S
            )
        assert ack.accepted, ack
        before = sum(acked.values())
        wait_until("more acknowledged after", lambda: sum(acked.values()) >= before + 10, v.log)
        stop.set()
        v.proc.send_signal(signal.SIGTERM)
        assert v.proc.wait(timeout=DEADLINE_S) == 0
    assert not errors, errors
    assert ("large", 1) in stored(v.db)
    db = open_database(v.db, read_only=True)
    try:
        (files_json,) = db.execute(
            "SELECT files_json FROM manifests ORDER BY length(files_json) DESC LIMIT 1"
        ).fetchone()
    finally:
        db.close()
    assert str(files_json).count("/site-packages/") == n
    acked_are_stored(v.db, acked)
    audit_ok(v.db)


# 8 -------------------------------------------------------------------------------------------
def test_sigterm_and_restart_under_load_lose_nothing_acknowledged(tmp_path: Path) -> None:
    """Attack: SIGTERM the verifier while agents report through the writer (the writer is
    stopped last: reports still in flight in the serving processes must either be stored or
    not acknowledged), then start it again on the same database and port under load. Defence:
    exit 0; no process of the first run outlives it; every report acknowledged in either run
    is stored; the ledger verifies. Non-vacuous: both runs acknowledged reports."""
    port = free_port()
    first: dict[str, int] = {}
    second: dict[str, int] = {}
    with started(tmp_path, port=port) as v:
        stop, _ = load(v.addr, [f"a{i}" for i in range(6)], first)
        wait_until("reports acknowledged", lambda: sum(first.values()) >= 60, v.log)
        others = children(v.proc.pid)
        v.proc.send_signal(signal.SIGTERM)
        assert v.proc.wait(timeout=DEADLINE_S) == 0, v.log.read_text()[-3000:]
        stop.set()
        wait_until("every process gone", lambda: not any(map(alive, others)), v.log)
    acked_are_stored(v.db, first)
    with started(tmp_path, db=v.db, port=port) as w:
        stop, _ = load(w.addr, [f"b{i}" for i in range(6)], second)
        wait_until("reports acknowledged", lambda: sum(second.values()) >= 60, w.log)
        w.proc.send_signal(signal.SIGTERM)
        assert w.proc.wait(timeout=DEADLINE_S) == 0, w.log.read_text()[-3000:]
        stop.set()
    acked_are_stored(v.db, first, second)
    audit_ok(v.db)
