"""The audit ledger: an append-only hash chain over everything the verifier stores.

Every run (with its policy), manifest, report, recorded verdict, target expired or forgotten,
measurement window opened and sealed (``window``, ``seal``: their content is canonical JSON,
:func:`canonical`, so an offline check recomputes the subject from a signed seal's statement)
and batch of request bindings
(:mod:`servewitness.ledger.bindings`, which this module reads and which never imports it) gets one
ledger entry in the same transaction that stores it: ``(seq, at, kind, ref, subject, prev,
hash)``, where ``subject`` is the sha256 of the stored content, ``prev`` the previous entry's
hash and ``hash`` the sha256 of all of these. :func:`verify` walks the chain and re-derives every
subject from the content tables, so editing, deleting or reordering a row, in the content or
in the ledger, and inserting content behind the ledger's back, each name the first entry that
no longer matches.

A chain alone cannot stop someone who rewrites the whole chain after an edit: the head hash
that :func:`verify` returns is what to record elsewhere (a signed checkpoint) to pin it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass

from servewitness.ledger import bindings
from servewitness.ledger.interface import Database

GENESIS = "0" * 64
KINDS = ("run", "manifest", "report", "verdict", "bindings", "target", "window", "seal")


def sha(*parts: object) -> str:
    """The hex sha256 of PARTS as compact JSON: every subject and entry hash is one (the
    bundle's content kinds recompute subjects with it)."""
    return hashlib.sha256(json.dumps(parts, separators=(",", ":")).encode()).hexdigest()


Entry = tuple[int, float, str, str, str, str]  # seq, at, kind, ref, subject, prev


def entry_hash(e: Entry) -> str:
    return sha(*e)


# What each kind's subject covers, and how to find its content again ----------------------


def run_ref(name: str) -> str:
    return name


def run_subject(name: str, policy: str, digest: str, source: str, created: float) -> str:
    return sha("run", name, policy, digest, source, created)


def manifest_subject(files_json: str) -> str:
    return sha("manifest", files_json)


def report_ref(agent_id: str, seq: int) -> str:
    return json.dumps([agent_id, seq])


def report_subject(
    agent_id: str,
    seq: int,
    target: str,
    received: float,
    body: bytes,
    *,
    receipt_json: str | None = None,
    body_sha256: str | None = None,
) -> str:
    """A stored report. RECEIPT_JSON: how the verifier that stored it received it (who it
    was authenticated as, how long it took to store: ``server/follow.py``), in reports stored
    since it was kept; NULL in older rows, whose subject leaves it out. BODY_SHA256: BODY's
    sha256 in hex, when the caller computed it already (outside the write lock)."""
    digest = hashlib.sha256(body).hexdigest() if body_sha256 is None else body_sha256
    parts: list[object] = [agent_id, seq, target, received, digest]
    if receipt_json is not None:
        parts.append(receipt_json)
    return sha("report", *parts)


def verdict_ref(run: str, at: float) -> str:
    return json.dumps([run, at])


def verdict_subject(run: str, at: float, verdict: str, detail_json: str) -> str:
    return sha("verdict", run, at, verdict, detail_json)


def target_ref(target: str, at: float) -> str:
    return json.dumps([target, at])


def target_subject(  # noqa: PLR0917 - the stored row, column by column
    target: str, at: float, event: str, by: str, last_agent: str, last_seq: int
) -> str:
    """A target expired or forgotten (EVENT) by BY, retiring its report LAST_SEQ of
    LAST_AGENT (what it last reported, which no verdict counts after this)."""
    return sha("target", target, at, event, by, last_agent, last_seq)


def bindings_ref(agent_id: str, seq: int) -> str:
    """A batch of request bindings is the one that came with report SEQ of AGENT_ID."""
    return report_ref(agent_id, seq)


def bindings_subject(  # noqa: PLR0917 - the stored batch, column by column
    ref: str,
    target: str,
    received: float,
    spans_sha256: str,
    ids_sha256: str,
    counts_json: str | None = None,
) -> str:
    """A batch of request bindings: its rows' digests and (since they were ledgered) its
    requests counted per process and manifest (``bindings.counts_json``); a batch stored
    before has no counts (None) and the subject it was ledgered with."""
    if counts_json is None:
        return sha("bindings", ref, target, received, spans_sha256, ids_sha256)
    return sha("bindings", ref, target, received, spans_sha256, ids_sha256, counts_json)


def canonical(obj: object) -> str:
    """The one JSON text of a window's or seal's content (sorted keys, compact): what is
    stored, and what an offline check re-serialises from a statement to recompute a subject."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def window_subject(content_json: str) -> str:
    """A measurement window the verifier opened (ref: its id)."""
    return sha("window", content_json)


def seal_subject(content_json: str) -> str:
    """A window's seal (ref: the window's id): results digest, held, findings, evidence."""
    return sha("seal", content_json)


def append(db: Database, at: float, kind: str, ref: str, subject: str) -> str:
    """Append one entry; call inside the transaction that stores its content. Its hash."""
    last = db.execute("SELECT seq, hash FROM ledger ORDER BY seq DESC LIMIT 1").fetchone()
    seq, prev = (int(last[0]) + 1, str(last[1])) if last else (1, GENESIS)
    h = entry_hash((seq, at, kind, ref, subject, prev))
    db.execute(
        "INSERT INTO ledger (seq, at_unix, kind, ref, subject, prev, hash) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (seq, at, kind, ref, subject, prev, h),
    )
    return h


# Re-deriving subjects from the content tables ----------------------------------------------


def _contents(db: Database) -> Iterator[tuple[str, str, str, float]]:
    """(kind, ref, subject, at) of every stored row, in storage order per table."""
    for name, policy, digest, source, created in db.execute(
        "SELECT name, policy_toml, policy_digest, source, created_unix FROM runs ORDER BY rowid"
    ):
        yield "run", run_ref(name), run_subject(name, policy, digest, source, created), created
    for digest, files_json in db.execute("SELECT digest, files_json FROM manifests ORDER BY rowid"):
        yield "manifest", digest, manifest_subject(files_json), 0.0
    for agent_id, seq, target, received, body, receipt in db.execute(
        "SELECT agent_id, seq, target, received_unix, report, receipt_json FROM reports "
        "ORDER BY rowid"
    ):
        subject = report_subject(
            agent_id, int(seq), target, received, bytes(body), receipt_json=receipt
        )
        yield "report", report_ref(agent_id, int(seq)), subject, received
    for run, at, verdict, detail in db.execute(
        "SELECT run, at_unix, verdict, detail_json FROM verdicts ORDER BY rowid"
    ):
        yield "verdict", verdict_ref(run, at), verdict_subject(run, at, verdict, detail), at
    for target, at, event, by, agent, seq in db.execute(
        "SELECT target, at_unix, event, by_whom, last_agent, last_seq FROM target_events "
        "ORDER BY rowid"
    ):
        subject = target_subject(target, at, event, by, agent, int(seq))
        yield "target", target_ref(target, at), subject, at
    for wid, at, content_json in db.execute(
        "SELECT id, opened_unix, content_json FROM windows ORDER BY rowid"
    ):
        yield "window", str(wid), window_subject(content_json), at
    sealed = "held" if db.has_column("seals", "held") else "NULL"
    for wid, at, content_json, held in db.execute(
        f"SELECT window_id, sealed_unix, content_json, {sealed} FROM seals ORDER BY rowid"  # noqa: S608
    ):
        # The held column, what later seals count, must say what the ledgered content says.
        agrees = held is None or seal_held(content_json) is bool(held)
        yield "seal", str(wid), seal_subject(content_json) if agrees else "", at
    for ref, target, received, spans, ids, counts in bindings.stored_batches(db):
        subject = bindings_subject(ref, target, received, spans, ids, counts)
        yield "bindings", ref, subject, received


def seal_held(content_json: str) -> bool | None:
    """The ``held`` of a seal's stored content (None: not a seal's content)."""
    try:
        held = json.loads(content_json).get("held")
    except (ValueError, AttributeError):
        return None
    return held if isinstance(held, bool) else None


def backfill(db: Database, now: float) -> int:
    """Ledger entries for content stored before the ledger existed (a database from an older
    verifier), in storage order, so nothing stored is left outside the chain. Only into an
    empty ledger: rows that appear beside a started chain were inserted behind its back, and
    adopting them on the next start would launder them; :func:`verify` names them instead."""
    if db.execute("SELECT 1 FROM ledger LIMIT 1").fetchone():
        return 0
    added = 0
    for kind, ref, subject, at in list(_contents(db)):
        append(db, at or now, kind, ref, subject)
        added += 1
    return added


@dataclass(frozen=True)
class Verification:
    entries: int
    head: str  # the last entry's hash (GENESIS when empty): record it elsewhere to pin it
    problem: str | None = None  # None: intact
    seq: int | None = None  # the first entry that does not match (None: not an entry)

    @property
    def ok(self) -> bool:
        return self.problem is None


def _problem(e: Entry, h: str, prev: str, content: dict[tuple[str, str], str]) -> str | None:
    """What is wrong with entry E (stored hash H) after an entry whose hash is PREV."""
    seq, _, kind, ref, subject, prev_col = e
    if prev_col != prev:
        return f"does not follow entry {seq - 1}"
    if entry_hash(e) != h:
        return "its fields do not match its hash"
    if kind not in KINDS:
        return "unknown kind"
    stored = content.get((kind, ref))
    if stored is None:
        return f"the {kind} it records is gone"
    if stored != subject:
        return f"the stored {kind} was changed"
    return None


def verify(db: Database) -> Verification:
    """Walk the chain from the start; stop at the first entry that does not match."""
    content = {(k, r): s for k, r, s, _ in _contents(db)}
    prev, count = GENESIS, 0
    seen: set[tuple[str, str]] = set()
    for seq, at, kind, ref, subject, prev_col, h in db.execute(
        "SELECT seq, at_unix, kind, ref, subject, prev, hash FROM ledger ORDER BY seq"
    ):
        if seq != count + 1:
            missing = count + 1
            return Verification(count, prev, f"ledger entry {missing} is missing", missing)
        problem = _problem((seq, at, kind, ref, subject, prev_col), h, prev, content)
        if problem is not None:
            return Verification(count, prev, f"ledger entry {seq} ({kind} {ref}): {problem}", seq)
        seen.add((kind, ref))
        prev, count = h, count + 1
    extra = [key for key in content if key not in seen]
    if extra:
        kind, ref = extra[0]
        return Verification(
            count, prev, f"{len(extra)} stored row(s) are not in the ledger, first {kind} {ref}"
        )
    return Verification(count, prev)
