"""The ``reports`` table: a report's row written with its manifests, index rows and request
bindings, each ledgered in the same transaction; and the reads that following other verifiers
on the same database makes (``server/follow.py``). Functions over a database the caller holds
(the store's lock, and for writes its transaction)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from servewitness.ledger import bindings, chain
from servewitness.server.db import Database
from servewitness.server.index import (
    ProcessSeen,
    process_rows,
    request_counts,
    write_manifest_index,
    write_processes,
    write_request_counts,
)
from servewitness.server.manifest_rows import PreparedManifest
from servewitness.wire.fields import MAX_INDEXED_BYTES, over_index


@dataclass(frozen=True)
class StoredReport:
    """A report as stored. RECEIPT: how the verifier that stored it received it
    (``follow.receipt_json``), None in a row stored before receipts were kept; ROWID: its
    place in storage order (0: not stored yet)."""

    agent_id: str
    seq: int
    target: str
    received_unix: float
    report: bytes
    receipt: str | None = None
    rowid: int = 0


def identity(rep: StoredReport) -> tuple[str, int, str, float, bytes]:
    """What of REP a receipt's vouch binds (``vouch.row_digest``'s arguments)."""
    return rep.agent_id, rep.seq, rep.target, rep.received_unix, rep.report


def from_row(row: Sequence[Any]) -> StoredReport:
    """A ``StoredReport`` from (agent_id, seq, target, received_unix, report or NULL,
    receipt_json, rowid)."""
    body = b"" if row[4] is None else bytes(row[4])
    return StoredReport(row[0], int(row[1]), row[2], float(row[3]), body, row[5], int(row[6]))


@dataclass(frozen=True, slots=True)
class PreparedReport:
    """A report and everything stored with it, as rows and digests built before its
    transaction (``prepare``): inside, ``write`` runs the statements and the ledger's chain,
    which need the database, and nothing else."""

    rep: StoredReport
    manifests: Sequence[PreparedManifest]
    body_sha256: str
    processes: list[tuple[Any, ...]]
    bindings: bindings.PreparedBatch | None
    request_counts: list[tuple[Any, ...]]


def unstorable_text(
    rep: StoredReport,
    manifests: Sequence[PreparedManifest],
    processes: Sequence[ProcessSeen],
    tails: bindings.Tails,
) -> str | None:
    """What of REP's rows no database takes alike, or None: a NUL character in a column of
    text (PostgreSQL refuses it, SQLite keeps it), or an indexed text (a request id, a file
    path) over ``MAX_INDEXED_BYTES`` UTF-8 bytes (PostgreSQL's b-tree refuses an index row over
    2,704). PostgreSQL's refusal failed the transaction, the agent was told UNAVAILABLE and
    retried that report for ever, its target's evidence stuck behind it: refused here,
    before either database is asked, so a report means the same on both. (Text kept as JSON,
    the files' list and a binding's hooks, escapes a NUL; the report's body is bytes; an
    agent hashes a request id that long itself: ``wire.fields.bounded_id``.)"""
    return _named(rep, processes) or _bindings(tails) or _paths(manifests)


def _named(rep: StoredReport, processes: Sequence[ProcessSeen]) -> str | None:
    named = [("the agent id", rep.agent_id), ("the target", rep.target)]
    for p in processes:
        for what, v in (("boot id", p.boot_id), ("role", p.role),
                        ("container id", p.container_id), ("runner", p.runner)):  # fmt: skip
            if v is not None:
                named.append((f"pid {p.pid}'s {what}", v))
    return next((f"{what} holds a NUL character" for what, v in named if "\x00" in v), None)


def _bindings(tails: bindings.Tails) -> str | None:
    for kind, rows, indexed in (
        ("request span", tails.spans, (3,)),  # boot_id, pid, start_ticks, internal_id, ...
        ("request id", tails.ids, (0, 1, 2)),  # internal_id, external_id, client_id, unix
    ):
        for row in rows:
            nul = next((v for v in row if v.__class__ is str and "\x00" in v), None)
            if nul is not None:
                return f"a {kind} ({nul[:64]!r}) holds a NUL character"
            long = next((row[i] for i in indexed if over_index(row[i])), None)
            if long is not None:
                return f"a {kind}'s id ({long[:64]!r}...) is over {MAX_INDEXED_BYTES} bytes"
    return None


def _paths(manifests: Sequence[PreparedManifest]) -> str | None:
    for m in manifests:
        for (path,) in m.index.paths:
            if "\x00" in path:
                return f"a path of manifest {m.digest} holds a NUL character"
            if over_index(path):
                return f"a path of manifest {m.digest} is over {MAX_INDEXED_BYTES} bytes"
    return None


def prepare(
    rep: StoredReport,
    manifests: Sequence[PreparedManifest],
    processes: Sequence[ProcessSeen],
    tails: bindings.Tails = bindings.NO_TAILS,
) -> PreparedReport:
    """REP with its new MANIFESTS, the PROCESSES it saw and its bindings (as rows, but for
    the batch's columns: ``binding_rows.tails_from_pb``, or ``bindings.tails_of`` of
    converted ones), ready to write."""
    batch = None
    if tails.spans or tails.ids:
        ref = chain.bindings_ref(rep.agent_id, rep.seq)
        batch = bindings.prepare_tails(ref, rep.target, tails, rep.received_unix)
    return PreparedReport(
        rep,
        manifests,
        hashlib.sha256(rep.report).hexdigest(),
        process_rows(rep.target, rep.received_unix, processes),
        batch,
        request_counts(rep.target, tails.spans),
    )


def write(
    db: Database, p: PreparedReport, *, receipt: Callable[[], str] | None = None
) -> int | None:
    """Write P (inside the caller's transaction): its row's rowid, or None if its seq (or a
    later one of its agent) is stored already. RECEIPT makes its receipt now (else the
    report's own)."""
    rep = p.rep
    # Seqs only grow: this seq, or a later one, stored already (by this verifier or another
    # on the same database, whose acknowledgement this verifier's cache has not seen)
    last = db.execute("SELECT MAX(seq) FROM reports WHERE agent_id = ?", (rep.agent_id,)).fetchone()
    if last is not None and last[0] is not None and int(last[0]) >= rep.seq:
        return None
    for m in p.manifests:  # content-addressed: each digest once
        if db.execute("SELECT 1 FROM manifests WHERE digest = ?", (m.digest,)).fetchone():
            continue
        db.execute(
            "INSERT INTO manifests (digest, files_json) VALUES (?, ?)",
            (m.digest, m.files_json),
        )
        chain.append(db, rep.received_unix, "manifest", m.digest, m.subject)
        write_manifest_index(db, m.index)
    got = rep.receipt if receipt is None else receipt()
    row = (rep.agent_id, rep.seq, rep.target, rep.received_unix, rep.report, got)
    (rowid,) = db.execute(
        "INSERT INTO reports (agent_id, seq, target, received_unix, report, "
        "receipt_json) VALUES (?, ?, ?, ?, ?, ?) RETURNING rowid",
        row,
    ).fetchone()
    ref = chain.report_ref(rep.agent_id, rep.seq)
    subject = chain.report_subject(*row[:5], receipt_json=got, body_sha256=p.body_sha256)
    chain.append(db, rep.received_unix, "report", ref, subject)
    write_processes(db, p.processes)
    if p.bindings is not None:
        b = p.bindings
        digests = bindings.write_batch(db, b)
        write_request_counts(db, p.request_counts)
        subject = chain.bindings_subject(b.ref, b.target, b.received, *digests)
        chain.append(db, rep.received_unix, "bindings", b.ref, subject)
    return int(rowid)


def latest(db: Database) -> list[StoredReport]:
    """The most recent report of every target: the last stored (storage order, never a
    receiver's wall clock, which another verifier's, or a stepped one, can put anywhere)."""
    rows = db.execute(
        "SELECT r.agent_id, r.seq, r.target, r.received_unix, r.report, r.receipt_json, "
        "r.rowid FROM reports r "
        "JOIN (SELECT target, MAX(rowid) AS m FROM reports GROUP BY target) m "
        "ON r.rowid = m.m ORDER BY r.target"
    ).fetchall()
    return [from_row(row) for row in rows]


def last_of(db: Database, target: str) -> tuple[str, int, int] | None:
    """TARGET's last stored report: (agent id, seq, rowid), None if it has none."""
    row = db.execute(
        "SELECT agent_id, seq, rowid FROM reports WHERE target = ? ORDER BY rowid DESC LIMIT 1",
        (target,),
    ).fetchone()
    return None if row is None else (str(row[0]), int(row[1]), int(row[2]))


def marks(db: Database) -> tuple[int, int]:
    """The last rowid of ``reports`` and of ``target_events``."""
    got = []
    for table in ("reports", "target_events"):
        row = db.execute(f"SELECT MAX(rowid) FROM {table}").fetchone()  # noqa: S608 - fixed
        got.append(int(row[0]) if row and row[0] is not None else 0)
    return got[0], got[1]


def after(db: Database, rowid: int, limit: int) -> list[StoredReport]:
    """Up to LIMIT reports stored after ROWID, in storage order, without their bodies."""
    rows = db.execute(
        "SELECT agent_id, seq, target, received_unix, NULL, receipt_json, rowid FROM reports "
        "WHERE rowid > ? ORDER BY rowid LIMIT ?",
        (rowid, limit),
    ).fetchall()
    return [from_row(r) for r in rows]


def body(db: Database, rowid: int) -> bytes | None:
    row = db.execute("SELECT report FROM reports WHERE rowid = ?", (rowid,)).fetchone()
    return None if row is None else bytes(row[0])


def ledgered_body(db: Database, rep: StoredReport) -> tuple[bytes | None, bool]:
    """REP's body (None: its row is gone) and whether its ledger entry records this very
    row: its agent, seq, target, receipt time, body and receipt. A row written into the
    database behind the ledger's back (or one edited since) has no such entry."""
    got = body(db, rep.rowid)
    if got is None:
        return None, False
    row = db.execute(
        "SELECT subject FROM ledger WHERE kind = 'report' AND ref = ?",
        (chain.report_ref(rep.agent_id, rep.seq),),
    ).fetchone()
    expected = chain.report_subject(
        rep.agent_id, rep.seq, rep.target, rep.received_unix, got, receipt_json=rep.receipt
    )
    return got, row is not None and str(row[0]) == expected


@dataclass(frozen=True)
class TargetEvent:
    """A stored retirement of a target (``target_events``), and whether its ledger entry
    records this very row."""

    rowid: int
    target: str
    at: float
    event: str
    by: str
    last: tuple[str, int]
    vouch: str | None
    ledgered: bool

    @property
    def row(self) -> tuple[str, float, str, str, str, int]:
        return (self.target, self.at, self.event, self.by, *self.last)


def events_after(db: Database, rowid: int, limit: int) -> list[TargetEvent]:
    """Up to LIMIT target events recorded after ROWID, in storage order, each checked
    against its ledger entry (one a writer of the database added without one is not)."""
    rows = db.execute(
        "SELECT rowid, target, at_unix, event, by_whom, last_agent, last_seq, vouch "
        "FROM target_events WHERE rowid > ? ORDER BY rowid LIMIT ?",
        (rowid, limit),
    ).fetchall()
    out = []
    for rid, target, at, event, by, agent, seq, given in rows:
        row = (str(target), float(at), str(event), str(by), str(agent), int(seq))
        entry = db.execute(
            "SELECT subject FROM ledger WHERE kind = 'target' AND ref = ?",
            (chain.target_ref(row[0], row[1]),),
        ).fetchone()
        ledgered = entry is not None and str(entry[0]) == chain.target_subject(*row)
        vouched = None if given is None else str(given)
        out.append(TargetEvent(int(rid), *row[:4], (row[4], row[5]), vouched, ledgered))
    return out
