"""Attacks by a holder of agent credentials on the verifier's ingest: the fast conversions, the
stored body cut from the message as it arrived, the bindings made rows straight from the
message, the content-addressed manifests and what the verdicts are judged on. Each works
through a real verifier (``tests.helpers.running_verifier``) on a real gRPC listener and a
real SQLite database (and a real PostgreSQL where the store decides).

Written by an attacker who had not read the code (2026-12-07). Four of its five attacks worked
and are closed; each test is the attack, run for real, asserting the defence, and says what
the attack did before:

- a binding time of -0.0 made an acknowledged batch look edited to ``verifier audit verify``
  (SQLite gives back 0.0): every float of a binding row is now the value a database gives
  back (``ledger.bindings.real``, ``wire.fields.finite_time``);
- the manifest digest covered (path, sha256) only, while the manifest stored under it keeps
  module, kind, size, when it was hashed and the unreadable entries: one agent's first report
  of a digest chose what every other target naming it was judged on (a forbidden module
  laundered: PASS). The digest now commits to every field of every entry
  (``model.manifest_digest``);
- a manifest listing a path twice made the index and the ledgered list disagree, and every
  ``audit file`` query on that path a tampering error: refused at ingest, and the check reads
  a stored list as the index was written;
- files sent without a manifest digest were never checked nor stored, and the process judged
  as having loaded nothing (PASS): refused at ingest, and a process whose files are not known
  (no digest, nothing stored under it) is judged as such (PENDING), never as loading
  nothing.

Its untried ideas, tried: a NUL in a stored text or an indexed text over what PostgreSQL's
b-tree takes stalled an agent for ever (PostgreSQL refused the transaction: UNAVAILABLE, the
report retried), while SQLite stored it: refused at ingest on both, and the agent escapes or
hashes what it reads (the last tests)."""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.api.v1 import verifier_pb2_grpc as pb_grpc
from servewitness.evidence import journal
from servewitness.ledger import chain, index_check, queries
from servewitness.model import FileEntry, ProcessReport, TargetReport, manifest_digest
from servewitness.server.db import open_database
from servewitness.server.index import processes_seen
from servewitness.server.store import Store, StoredReport
from servewitness.wire import fields as F
from servewitness.wire.verdicts import _varint  # the product's own base-128 encoder
from tests.helpers import Backend, agent_stub, running_verifier
from tests.test_policy_engine import SITE, V1_FILE, WORKER_FILES, api, engine, worker
from tests.test_status_bytes import POLICY

FORBID_EVIL = POLICY + '[[forbid]]\nmodule = "evil_patch"\n'
EVIL = FileEntry(SITE + "evil_patch.py", "c" * 64, 10, "source", "evil_patch", "load")


@dataclasses.dataclass(frozen=True)
class Verifier:
    server: Any
    stub: pb_grpc.VerifierServiceStub
    db: str


@contextmanager
def verifier(tmp_path: Path, policy: str = POLICY, db: str | None = None) -> Iterator[Verifier]:
    """A real verifier in this process, on a Unix socket, with run ``r`` under POLICY, on the
    database DB (default: a new SQLite file)."""
    addr = f"unix:{tmp_path}/v.sock"
    db = db or str(tmp_path / "v.sqlite3")
    with (
        running_verifier(addr, db) as server,
        grpc.insecure_channel(addr, options=list(wire.GRPC_OPTIONS)) as ch,
    ):
        stub = agent_stub(ch)
        stub.RegisterRun(pb.RegisterRunRequest(name="r", policy_toml=policy))
        yield Verifier(server, stub, db)


def with_digest(p: ProcessReport) -> ProcessReport:
    """P with the manifest digest of its files (what an honest agent sends)."""
    files = p.files or ()
    return dataclasses.replace(p, manifest_digest=manifest_digest(files))


def report_msg(
    v: Verifier, agent: str, target: str, procs: tuple[ProcessReport, ...], seq: int = 1
) -> pb.TargetReport:
    """A Hello for AGENT, then its report on TARGET of PROCS (as a message, to edit)."""
    hello = v.stub.Hello(pb.HelloRequest(agent_id=agent, targets=[target]))
    return wire.report_to_pb(TargetReport(agent, target, seq, hello.nonce, time.time(), procs))


def send(v: Verifier, msg: pb.TargetReport) -> pb.ReportResponse:
    ack: pb.ReportResponse = v.stub.Report(pb.ReportRequest(report=msg))
    assert ack.accepted
    return ack


def status(v: Verifier) -> dict[str, tuple[int, list[str]]]:
    """Each target's verdict and finding ids in run ``r``'s status answer (over gRPC)."""
    got = v.stub.GetRunStatus(pb.GetRunStatusRequest(name="r")).verdict
    return {t.target: (t.verdict, [f.id for f in t.findings]) for t in got.targets}


def honest_processes() -> tuple[ProcessReport, ...]:
    return (with_digest(api()), with_digest(engine()), with_digest(worker()))


# ------------------------------------------------------------------ bindings as rows


def test_a_negative_zero_binding_time_leaves_the_ledger_verifiable(
    tmp_path: Path, backend: Backend
) -> None:
    """Attack: one span and one request id whose times are -0.0 (a valid double, >= 0 to every
    check), on SQLite and on PostgreSQL. Before: SQLite stored -0.0 as 0 and read back 0.0,
    so the batch's rows digested otherwise than the ledger entry said: ``chain.verify`` called
    the acknowledged batch changed and ``audit request`` refused the request. Defence: the
    rows hold 0.0; what the ledger commits to is what the database holds."""
    with verifier(tmp_path, db=backend.target) as v:
        msg = report_msg(v, "a", "t", honest_processes())
        span = msg.spans.add(internal_id="req-1", first_step=1, last_step=2, last_unix=1.0)
        span.process.pid = 300
        span.first_unix = -0.0
        rid = msg.request_ids.add(internal_id="req-1", external_id="cmpl-x-0", unix=-0.0)
        rid.process.pid = 100
        send(v, msg)
        assert status(v)["t"][0] == pb.VERDICT_PASS
    db = open_database(v.db, read_only=True)
    try:
        result = chain.verify(db)
        assert result.ok, result.problem
        # and the request's audit answers instead of reporting its batch as edited
        assert [s.target for s in queries.find_request(db, "req-1")] == ["t"]
    finally:
        db.close()


# ------------------------------------------------------------------ manifests by digest


def test_one_agent_cannot_choose_the_file_metadata_another_target_is_judged_on(
    tmp_path: Path,
) -> None:
    """Attack: mallory (its own agent and target) reports first the files the victim's
    worker will report (the same paths and hashes: the same image), its forbidden file's
    ``module`` left out, under the digest of the victim's files. Before: the digest covered
    paths and hashes only, so it matched, the laundered manifest was stored under it, the
    victim's own files were ignored (the digest was known) and the victim PASSed. Defence:
    the digest commits to every field, so mallory's claim of the victim's digest is refused
    (its files do not match it), and under its own digest the laundered manifest is another
    manifest: the victim is judged on its own files and FAILs ``provenance.file.forbidden``."""
    with verifier(tmp_path, FORBID_EVIL) as v:
        laundered = dataclasses.replace(EVIL, module=None)
        honest = (
            with_digest(api()),
            with_digest(engine()),
            with_digest(worker(files=(*WORKER_FILES, EVIL))),
        )
        fake = (
            with_digest(api(pid=101)),
            with_digest(engine(pid=201)),
            with_digest(worker(pid=301, files=(*WORKER_FILES, laundered))),
        )
        assert fake[2].manifest_digest != honest[2].manifest_digest
        claimed = dataclasses.replace(fake[2], manifest_digest=honest[2].manifest_digest)
        with pytest.raises(grpc.RpcError) as refused:
            send(v, report_msg(v, "mallory", "mallory-t", (fake[0], fake[1], claimed)))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "does not match its files" in (refused.value.details() or "")
        send(v, report_msg(v, "mallory", "mallory-t", fake, seq=2))  # its own digest: stored
        send(v, report_msg(v, "victim", "victim-t", honest))
        verdict, ids = status(v)["victim-t"]
        assert "provenance.file.forbidden" in ids
        assert verdict == pb.VERDICT_FAIL
        # and the victim's next report, by digest only, is judged on its own files again
        send(v, report_msg(v, "victim", "victim-t", tuple(strip(p) for p in honest), seq=2))
        verdict, ids = status(v)["victim-t"]
        assert verdict == pb.VERDICT_FAIL and "provenance.file.forbidden" in ids


def strip(p: ProcessReport) -> ProcessReport:
    """P as an agent sends it once the verifier has its manifest: the digest, no files."""
    return dataclasses.replace(p, files=None)


def test_a_manifest_listing_a_path_twice_does_not_break_audit_file_for_everyone(
    tmp_path: Path,
) -> None:
    """Attack: the victim reports an honest worker; mallory reports a worker whose manifest
    lists the victim's runner file twice, with its real hash and another. Before: both
    entries went into the digest and the ledgered list, the index kept the first, the index
    check read the last, and every ``audit file`` query on that path or hash was a tampering
    error. Defence: a manifest listing a path twice is refused at ingest (naming the path);
    ``audit file`` for the runner file (by path and by hash) answers with the victim's."""
    with verifier(tmp_path) as v:
        send(v, report_msg(v, "victim", "victim-t", honest_processes()))
        twice = dataclasses.replace(WORKER_FILES[0], sha256="d" * 64)
        fake = (
            with_digest(api(pid=101)),
            with_digest(engine(pid=201)),
            with_digest(worker(pid=301, files=(*WORKER_FILES, twice))),
        )
        with pytest.raises(grpc.RpcError) as refused:
            send(v, report_msg(v, "mallory", "mallory-t", fake))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "listed twice" in (refused.value.details() or "")
    db = open_database(v.db, read_only=True)
    try:
        assert chain.verify(db).ok  # nothing was tampered with
        for query in (V1_FILE, WORKER_FILES[0].sha256 or ""):
            seen = queries.find_file(db, query)
            assert "victim-t" in {s.target for s in seen}
    finally:
        db.close()


def test_files_sent_without_a_digest_are_not_judged_as_no_files(tmp_path: Path) -> None:
    """Attack: the worker's report carries its whole file list (``files_included``), the
    forbidden ``evil_patch`` among them, and no manifest digest. Before: the files were never
    checked nor stored, and the process was judged as having loaded nothing: PASS under
    ``[[forbid]]``. Defence: refused at ingest (files without their digest)."""
    with verifier(tmp_path, FORBID_EVIL) as v:
        procs = (
            with_digest(api()),
            with_digest(engine()),
            dataclasses.replace(worker(files=(*WORKER_FILES, EVIL)), manifest_digest=None),
        )
        msg = report_msg(v, "a", "t", procs)
        assert msg.processes[2].files_included and not msg.processes[2].HasField("manifest_digest")
        assert any(f.module == "evil_patch" for f in msg.processes[2].files)
        with pytest.raises(grpc.RpcError) as refused:
            v.stub.Report(pb.ReportRequest(report=msg))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "without a manifest_digest" in (refused.value.details() or "")
        assert "t" not in status(v)  # nothing stored, nothing judged


def test_a_probed_process_without_a_manifest_is_not_judged_as_loading_nothing(
    tmp_path: Path,
) -> None:
    """The variation: the worker sends neither its files nor a digest (nothing to refuse:
    a process without a probe sends neither). Before: a probed process without a digest was
    judged as having loaded no file at all, so ``[[forbid]]`` found nothing: PASS. Defence:
    its files are not known, and a rule that needs them says so (PENDING,
    ``evidence.manifest_unresolved``); the same report with its files FAILs."""
    with verifier(tmp_path, FORBID_EVIL) as v:
        bare = dataclasses.replace(worker(files=None), manifest_digest=None)
        assert bare.probe_present
        send(v, report_msg(v, "a", "t", (with_digest(api()), with_digest(engine()), bare)))
        verdict, ids = status(v)["t"]
        assert verdict == pb.VERDICT_PENDING
        assert "evidence.manifest_unresolved" in ids
        evil = with_digest(worker(files=(*WORKER_FILES, EVIL)))
        send(v, report_msg(v, "a", "t", (with_digest(api()), with_digest(engine()), evil), seq=2))
        assert status(v)["t"][0] == pb.VERDICT_FAIL  # negative control: the files judged


# ------------------------------------------------------------------ the stored body


def _len_field(number: int, body: bytes) -> bytes:
    """Field NUMBER (length-delimited) holding BODY, encoded by hand."""
    return _varint(number << 3 | 2) + _varint(len(body)) + body


def test_a_report_split_over_repeated_fields_is_stored_as_it_was_judged(tmp_path: Path) -> None:
    """Attack on the stored body cut from the message as it arrived: the ReportRequest's
    ``report`` field sent twice (protobuf merges them: the second's worker process is
    appended, its sent_unix wins), the worker's ``key`` itself split in two occurrences
    (pid in one, start_ticks in the other), and an unknown field inside the worker. The
    verifier must judge and store the same merged report: the body it kept reads back as
    the processes it judged (the forbidden module's process among them) and the verdict
    FAILs on it."""
    with verifier(tmp_path, FORBID_EVIL) as v:
        honest = honest_processes()
        evil = with_digest(worker(pid=400, files=(*WORKER_FILES, EVIL)))
        first = report_msg(v, "a", "t", honest)
        second = pb.TargetReport()
        proc = wire.report_to_pb(TargetReport("a", "t", 1, "", 0.0, (evil,)))
        second.processes.add().CopyFrom(proc.processes[0])
        second.processes[0].ClearField("key")
        second.sent_unix = first.sent_unix + 0.25
        worker_bytes = second.processes[0].SerializeToString()
        worker_bytes += _len_field(1, pb.ProcessKey(pid=400).SerializeToString())
        worker_bytes += _len_field(1, pb.ProcessKey(start_ticks=7).SerializeToString())
        worker_bytes += _len_field(777, b"never judged")
        second_bytes = pb.TargetReport(sent_unix=second.sent_unix).SerializeToString()
        second_bytes += _len_field(6, worker_bytes)
        raw = _len_field(1, first.SerializeToString()) + _len_field(1, second_bytes)
        # raw bytes on a plain channel, with the metadata an agent sends
        channel_call = grpc.insecure_channel(f"unix:{tmp_path}/v.sock")
        try:
            method: Any = channel_call.unary_unary(
                "/verifier.api.v1.VerifierService/Report",
                request_serializer=None,
                response_deserializer=pb.ReportResponse.FromString,
            )
            ack = method(raw, metadata=wire.agent_metadata("a", ["t"]))
        finally:
            channel_call.close()
        assert ack.accepted
        judged = v.server.service.evaluator.get("t").snapshot
        keys = sorted((p.key.pid, p.key.start_ticks) for p in judged.processes)
        assert (400, 7) in keys
        stored = v.server.store.latest_reports()
        back = wire.report_from_bytes(stored[0].report)
        assert sorted((p.key.pid, p.key.start_ticks) for p in back.processes) == keys
        assert back.sent_unix == second.sent_unix
        assert b"never judged" not in stored[0].report
        verdict, ids = status(v)["t"]
        assert verdict == pb.VERDICT_FAIL and "provenance.file.forbidden" in ids


def test_a_manifest_stored_before_the_refusal_reads_as_its_index_was_written(
    backend: Backend,
) -> None:
    """A database written before the refusal may hold a manifest listing a path twice (the
    store takes it as the verifier gave it then). The index kept the path's first entry with
    a hash, and the index check now reads the ledgered list the same way, so the untouched
    database verifies and ``audit file`` answers for the path and for its first hash. (Read
    last-one-wins, the check called that database tampered with.)"""
    first, again = WORKER_FILES[0], dataclasses.replace(WORKER_FILES[0], sha256="d" * 64)
    files = (*WORKER_FILES, again)
    digest = "sha256:" + "9" * 64
    w = dataclasses.replace(worker(files=files), manifest_digest=digest)
    now = time.time()
    store = Store(backend.target)
    try:
        # stored as the verifier stores a report: its files in the manifest, not the body
        body = wire.report_to_bytes(TargetReport("a", "t", 1, "", now, (strip(w),)))
        assert store.save_report(StoredReport("a", 1, "t", now, body), {digest: files},
                                 processes_seen((w,)))  # fmt: skip
    finally:
        store.close()
    db = open_database(backend.target, read_only=True)
    try:
        assert chain.verify(db).ok
        assert index_check.check_manifest_files(db) == []
        assert "t" in {s.target for s in queries.find_file(db, first.sha256 or "")}
        assert "t" in {s.target for s in queries.find_file(db, first.path)}
    finally:
        db.close()


LONG = hashlib.sha256(b"incompressible").hexdigest() * 44  # 2,816 bytes, as random text


@pytest.mark.parametrize(
    "where",
    ["request span", "request id", "role", "path", "long span id", "long request id",
     "long path"],
)  # fmt: skip
def test_a_text_no_database_stores_alike_is_refused_on_either(
    tmp_path: Path, backend: Backend, where: str
) -> None:
    """The variation the attacker left untried, found by trying it: a NUL character in a
    text the store keeps in a column (a binding's request id, a process's role, a manifest's
    path), or an indexed text (a request id, a path) of 2,816 bytes that do not compress,
    within what a report may carry. Before: PostgreSQL refused the transaction (text takes
    no NUL; its b-tree no index row over 2,704 bytes) and the agent was told UNAVAILABLE, so
    it retried that report for ever and its target's later evidence queued behind it (a
    request id is a client's to choose: one API call could do that to an honest agent),
    while SQLite stored it. Defence: refused at ingest with INVALID_ARGUMENT on both (the
    agent drops a report so refused), naming what; the agent escapes a NUL it reads and
    hashes an id that long (tests below)."""
    with verifier(tmp_path, db=backend.target) as v:
        msg = report_msg(v, "a", "t", honest_processes())
        if where in ("request span", "long span id"):
            internal = "req\x00x" if where == "request span" else LONG
            span = msg.spans.add(internal_id=internal, first_step=1, last_step=2, last_unix=1.0)
            span.process.pid = 300
        elif where in ("request id", "long request id"):
            external = "cmpl-\x00-0" if where == "request id" else f"cmpl-{LONG}-0"
            rid = msg.request_ids.add(internal_id="req-1", external_id=external, unix=1.0)
            rid.process.pid = 100
        elif where == "role":
            msg.processes[0].role = "api\x00server"
        else:
            name = "evil\x00.py" if where == "path" else LONG + ".py"
            odd = dataclasses.replace(WORKER_FILES[0], path=SITE + name)
            w = with_digest(worker(files=(*WORKER_FILES, odd)))
            msg = report_msg(v, "a", "t", (with_digest(api()), with_digest(engine()), w), seq=1)
        with pytest.raises(grpc.RpcError) as refused:
            v.stub.Report(pb.ReportRequest(report=msg))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        said = refused.value.details() or ""
        assert ("NUL" if "long" not in where else "over 2048 bytes") in said
        send(v, report_msg(v, "a", "t", honest_processes(), seq=2))  # the next one is stored
        assert status(v)["t"][0] == pb.VERDICT_PASS


def test_an_agent_hashes_a_request_id_longer_than_an_index_takes() -> None:
    """The agent's side of a long id: an id whose UTF-8 bytes are over 2,048 (a client's
    ``X-Request-Id``) is sent as its digest, as ``audit request`` looks it up; one of 2,048
    bytes, or 2,048 characters of one byte, is sent as it is (characters of several bytes
    count as their bytes)."""
    assert F.bounded_id("x" * 2048) == "x" * 2048
    assert F.bounded_id(LONG) == "sha256:" + hashlib.sha256(LONG.encode()).hexdigest()
    wide = "é" * 1025  # 2,050 bytes in 1,025 characters
    assert F.bounded_id(wide) == "sha256:" + hashlib.sha256(wide.encode()).hexdigest()
    assert F.bounded_id("é" * 1024) == "é" * 1024


def test_an_agent_escapes_a_nul_it_reads_from_the_probe() -> None:
    """The agent's side: a request id with a NUL (``\\u0000`` in the probe's JSON, which any
    API client can put there) is read as the four characters ``\\x00``, by the journal's and
    the bindings' readers alike, so an honest agent never sends a report the verifier must
    refuse."""
    line = b'{"k": "req", "id": "cmpl-a\\u0000b-0", "path": "/x\\u0000.py"}'
    rec = journal.load_record(line)
    assert rec == {"k": "req", "id": "cmpl-a\\x00b-0", "path": "/x\\x00.py"}
    assert journal.parse_text(line + b"\n" + line + b"\n") == [rec, rec]
    plain = b'{"k": "req", "id": "cmpl-a\\\\u0000b-0"}'  # an escaped backslash: no NUL
    assert journal.load_record(plain) == {"k": "req", "id": "cmpl-a\\u0000b-0"}
