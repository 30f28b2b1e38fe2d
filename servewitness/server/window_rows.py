"""The ``windows`` and ``seals`` tables, each row ledgered as it is stored (``window`` and
``seal`` entries, ``ledger/chain.py``), and the proofs a seal document carries: the signed
checkpoint note covering both entries, their inclusion proofs, and a consistency proof from
the checkpoint signed before it. Functions over a database the caller holds (the store's
lock, and for writes its transaction)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servewitness.ledger import chain, checkpoints, merkle
from servewitness.ledger.bundle import LedgerEntry, tree_from_db
from servewitness.ledger.seal import OTHER_OUTCOMES
from servewitness.server.db import Database

ENTRY_COLUMNS = "seq, at_unix, kind, ref, subject, prev, hash"


class AlreadySealed(Exception):
    pass


def _last_entry(db: Database) -> LedgerEntry:
    row = db.execute(
        f"SELECT {ENTRY_COLUMNS} FROM ledger ORDER BY seq DESC LIMIT 1"  # noqa: S608
    ).fetchone()
    return LedgerEntry.from_row(row)


def ledger_size(db: Database) -> int:
    row = db.execute("SELECT MAX(seq) FROM ledger").fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def insert_window(db: Database, wid: str, run: str, at: float, content_json: str) -> LedgerEntry:
    db.execute(
        "INSERT INTO windows (id, run, opened_unix, content_json) VALUES (?, ?, ?, ?)",
        (wid, run, at, content_json),
    )
    chain.append(db, at, "window", wid, chain.window_subject(content_json))
    return _last_entry(db)


def insert_seal(db: Database, wid: str, run: str, at: float, content_json: str) -> LedgerEntry:
    if db.execute("SELECT 1 FROM seals WHERE window_id = ?", (wid,)).fetchone():
        raise AlreadySealed(f"window {wid} is already sealed")
    held = chain.seal_held(content_json)
    db.execute(
        "INSERT INTO seals (window_id, run, sealed_unix, content_json, held) "
        "VALUES (?, ?, ?, ?, ?)",
        (wid, run, at, content_json, None if held is None else int(held)),
    )
    chain.append(db, at, "seal", wid, chain.seal_subject(content_json))
    return _last_entry(db)


def other_windows(db: Database, wid: str, run: str) -> dict[str, Any]:
    """Every window the ledger holds but WID, counted by outcome, on the whole ledger and on
    RUN (inside the transaction that appends WID's seal, so the counts are exactly those of
    the entries before it): what a seal says about the windows it was chosen from. A window
    whose stored row is gone counts on the ledger only, as unreadable."""
    # Each table read alone, from an index that holds what is read (a join would read the
    # seals' rows, kilobytes each, through their unique key), and joined here.
    held = dict(db.execute("SELECT window_id, held FROM seals").fetchall())
    for ref in [r for r, h in held.items() if h is None]:  # stored before the held column
        row = db.execute("SELECT content_json FROM seals WHERE window_id = ?", (ref,)).fetchone()
        held[ref] = chain.seal_held(str(row[0]))
    outcome = {
        str(ref): "unreadable" if held.get(ref) is None else _OUTCOME[bool(held[ref])]
        for (ref,) in db.execute("SELECT ref FROM ledger WHERE kind = 'seal'").fetchall()
    }
    runs = dict(db.execute("SELECT id, run FROM windows").fetchall())
    counts = {"ledger": dict.fromkeys(("opened", *OTHER_OUTCOMES), 0)}
    counts["run"] = dict(counts["ledger"])
    for (ref,) in db.execute("SELECT ref FROM ledger WHERE kind = 'window'").fetchall():
        if ref == wid:
            continue
        wrun = runs.get(ref)
        got = "unreadable" if wrun is None else outcome.get(str(ref), "not_sealed")
        for scope in ("ledger", "run") if wrun == run else ("ledger",):
            counts[scope]["opened"] += 1
            counts[scope][got] += 1
    return {"ledger_size": ledger_size(db), **counts}


_OUTCOME = {True: "held", False: "not_held"}


@dataclass(frozen=True)
class StoredWindow:
    window_id: str
    run: str
    content_json: str
    entry: LedgerEntry
    sealed: bool
    # its content is not what its ledger entry records (the database edited since the open):
    # a seal would rest on an opening nobody made
    edited: bool = False


def get_window(db: Database, wid: str) -> StoredWindow | None:
    row = db.execute("SELECT run, content_json FROM windows WHERE id = ?", (wid,)).fetchone()
    if row is None:
        return None
    entry = db.execute(
        f"SELECT {ENTRY_COLUMNS} FROM ledger WHERE kind = 'window' AND ref = ?",  # noqa: S608
        (wid,),
    ).fetchone()
    if entry is None:
        return None  # content outside the ledger: `audit verify` names it; never sealed
    # Sealed if either says so: a seal's row deleted (or moved to another id) leaves its
    # ledger entry, and a window has one seal (a broken one is never replaced by a better)
    sealed = db.execute("SELECT 1 FROM seals WHERE window_id = ?", (wid,)).fetchone() or (
        db.execute("SELECT 1 FROM ledger WHERE kind = 'seal' AND ref = ?", (wid,)).fetchone()
    )
    content = str(row[1])
    opened = LedgerEntry.from_row(entry)
    edited = opened.subject != chain.window_subject(content)
    return StoredWindow(wid, str(row[0]), content, opened, bool(sealed), edited)


def report_entry(db: Database, agent_id: str, seq: int) -> tuple[int, str] | None:
    """The ledger entry (seq, hash) of report SEQ of AGENT_ID."""
    row = db.execute(
        "SELECT seq, hash FROM ledger WHERE kind = 'report' AND ref = ?",
        (chain.report_ref(agent_id, seq),),
    ).fetchone()
    return None if row is None else (int(row[0]), str(row[1]))


@dataclass(frozen=True)
class SealProofs:
    note: str  # the signed checkpoint note covering both entries
    size: int
    open_proof: list[bytes]
    seal_proof: list[bytes]
    consistency: tuple[str, list[bytes]] | None  # (an earlier signed note, proof to this one)


def proofs(
    db: Database, open_seq: int, seal_seq: int, tree: merkle.Proofs | None = None
) -> SealProofs | None:
    """Inclusion of entries OPEN_SEQ and SEAL_SEQ in the latest signed checkpoint note (None:
    no note covers SEAL_SEQ yet), and consistency from the note signed before it. TREE: the
    ledger's tree at the note's size or beyond (the verifier's, ``Store.audit_read``); None:
    built from the ledger."""
    cp = checkpoints.latest_note(db)
    if cp is None or cp.note is None or cp.size < seal_seq:
        return None
    if tree is None or tree.size < cp.size:
        tree = tree_from_db(db, cp.size)
    before: Any = db.execute(
        "SELECT size, note FROM checkpoints WHERE note IS NOT NULL AND size < ? "
        "ORDER BY size DESC LIMIT 1",
        (cp.size,),
    ).fetchone()
    consistency = None
    if before is not None:
        consistency = (str(before[1]), tree.consistency_proof(int(before[0]), cp.size))
    return SealProofs(
        cp.note,
        cp.size,
        tree.inclusion_proof(open_seq - 1, cp.size),
        tree.inclusion_proof(seal_seq - 1, cp.size),
        consistency,
    )
