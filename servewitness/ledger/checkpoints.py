"""Signed checkpoints of the ledger: the RFC 6962 tree head over its first SIZE entries,
signed with the verifier's Ed25519 key twice over, as a DSSE envelope of an in-toto statement
and as a C2SP signed note (:mod:`servewitness.ledger.note`, the format witnesses read), kept in the
``checkpoints`` table. A hash chain alone can be rewritten from an edit onwards and verify
again; a checkpoint pins the tree as it was: ``check`` recomputes each stored checkpoint's
root from the ledger as it is now, so a rewrite behind a checkpoint is named. A checkpoint
kept only in the database it protects goes down with it (whoever rewrites the chain deletes
the rows); :mod:`servewitness.ledger.anchor` checks the ledger against one kept elsewhere.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from servewitness.ledger import dsse, merkle, note
from servewitness.ledger import statement as st
from servewitness.ledger.interface import Database
from servewitness.ledger.keys import Ed25519PrivateKey, Ed25519PublicKey, key_id


@dataclass(frozen=True)
class Checkpoint:
    size: int
    root: str
    head: str
    at_unix: float
    envelope: str
    note: str | None = None  # the C2SP signed note (None: signed by an older verifier)


def _tree(db: Database) -> tuple[merkle.Tree, list[str]]:
    hashes = [str(h) for (h,) in db.execute("SELECT hash FROM ledger ORDER BY seq")]
    return merkle.Tree(bytes.fromhex(h) for h in hashes), hashes


class NotAppendOnly(Exception):
    """The ledger is no longer an extension of what this verifier last signed: it refuses to
    sign a checkpoint inconsistent with one it signed before (tlog-checkpoint's first rule)."""


def sign(
    db: Database,
    key: Ed25519PrivateKey,
    at: float | None = None,
    frontier: merkle.Frontier | None = None,
) -> Checkpoint | None:
    """Sign the tree head of the whole ledger and store it (inside the caller's transaction);
    None when the ledger is empty or has not grown since the latest checkpoint.

    With FRONTIER (the tree as this verifier last saw it), only the entries after it are
    read and hashed, so a checkpoint costs the entries since the last one; entries behind it
    that were rewritten meanwhile are not re-read, so the head signed is the one over what
    the verifier appended, and the rewrite shows against it. A ledger shorter than FRONTIER
    raises :class:`NotAppendOnly`."""
    size_row = db.execute("SELECT MAX(seq) FROM ledger").fetchone()
    size = int(size_row[0]) if size_row and size_row[0] is not None else 0
    last = db.execute("SELECT MAX(size) FROM checkpoints").fetchone()
    if frontier is not None and size < frontier.size:
        raise NotAppendOnly(
            f"the ledger has {size} entries, fewer than the {frontier.size} this verifier "
            "appended: entries were deleted behind its back"
        )
    if size == 0 or (last is not None and last[0] is not None and int(last[0]) >= size):
        return None
    at = time.time() if at is None else at
    if frontier is None:
        frontier = merkle.Frontier()
    frontier.extend(
        bytes.fromhex(h)
        for (h,) in db.execute(
            "SELECT hash FROM ledger WHERE seq > ? AND seq <= ? ORDER BY seq",
            (frontier.size, size),
        )
    )
    if frontier.size != size:
        raise NotAppendOnly(f"ledger entries are missing below entry {size}")
    root_b = frontier.root()
    root = root_b.hex()
    head = str(db.execute("SELECT hash FROM ledger WHERE seq = ?", (size,)).fetchone()[0])
    statement = st.statement(
        [st.subject("ledger", root)],
        st.CHECKPOINT,
        st.checkpoint(size=size, root=root, at_unix=at, verifier_id=key_id(key), head=head),
    )
    envelope = json.dumps(dsse.sign(st.encode(statement), st.PAYLOAD_TYPE, key))
    signed = note.sign_checkpoint(key, size, root_b)
    db.execute(
        "INSERT INTO checkpoints (size, root, head, at_unix, envelope, note) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (size, root, head, at, envelope, signed),
    )
    return Checkpoint(size, root, head, at, envelope, signed)


def latest_note(db: Database) -> Checkpoint | None:
    """The latest stored checkpoint that has a signed note (None: none has)."""
    if not db.has_column("checkpoints", "note"):
        return None
    row = db.execute(
        "SELECT size, root, head, at_unix, envelope, note FROM checkpoints "
        "WHERE note IS NOT NULL ORDER BY size DESC, rowid DESC LIMIT 1"
    ).fetchone()
    if row is None:
        return None
    s, r, h, a, e, n = row
    return Checkpoint(int(s), str(r), str(h), float(a), str(e), str(n))


def stored(db: Database) -> list[Checkpoint]:
    notes = db.has_column("checkpoints", "note")
    cols = "size, root, head, at_unix, envelope" + (", note" if notes else ", NULL")
    return [
        Checkpoint(int(s), str(r), str(h), float(a), str(e), None if n is None else str(n))
        for s, r, h, a, e, n in db.execute(
            f"SELECT {cols} FROM checkpoints ORDER BY rowid"  # noqa: S608 - fixed names
        )
    ]


def check(db: Database, key: Ed25519PublicKey | None = None) -> tuple[int, str | None]:
    """(checkpoints that hold, the first problem or None). Each stored checkpoint's root must
    be the root of the ledger's first SIZE entries as stored now; with KEY, its envelope must
    be signed by KEY and say the same size and root."""
    cps = stored(db)
    if not cps:
        return 0, None
    tree, hashes = _tree(db)
    for i, cp in enumerate(cps):
        where = f"checkpoint {i + 1} (size {cp.size}, signed {st.rfc3339(cp.at_unix)})"
        head = hashes[cp.size - 1] if cp.size <= tree.size else None
        problem = _problem(cp, tree, head, key, where)
        if problem is not None:
            return i, problem
    return len(cps), None


def check_new(
    db: Database, tree: merkle.Proofs, key: Ed25519PublicKey, after: int
) -> tuple[int, str | None]:
    """``check`` of the checkpoints stored after row AFTER only, against TREE (the ledger's
    tree as a verifier keeps it, ``servewitness.ledger.tiles``): (the last row checked, the
    first problem or None)."""
    cols = "rowid, size, root, head, at_unix, envelope, " + (
        "note" if db.has_column("checkpoints", "note") else "NULL"
    )
    last = after
    for rowid, s, r, h, a, e, n in list(
        db.execute(f"SELECT {cols} FROM checkpoints WHERE rowid > ? ORDER BY rowid", (after,))  # noqa: S608 - fixed names
    ):
        cp = Checkpoint(int(s), str(r), str(h), float(a), str(e), None if n is None else str(n))
        where = f"checkpoint row {rowid} (size {cp.size}, signed {st.rfc3339(cp.at_unix)})"
        row = db.execute("SELECT hash FROM ledger WHERE seq = ?", (cp.size,)).fetchone()
        problem = _problem(cp, tree, None if row is None else str(row[0]), key, where)
        if problem is not None:
            return last, problem
        last = int(rowid)
    return last, None


def _problem(
    cp: Checkpoint, tree: merkle.Proofs, head: str | None, key: Ed25519PublicKey | None, where: str
) -> str | None:
    """What is wrong with CP over TREE, whose entry CP.SIZE has the hash HEAD (None: no such
    entry), with KEY's signature if KEY is given."""
    if cp.size > tree.size or head is None:
        return f"{where}: the ledger now has only {tree.size} entries (entries deleted)"
    if tree.root(cp.size).hex() != cp.root or head != cp.head:
        return (
            f"{where}: the ledger's first {cp.size} entries no longer have the signed root: "
            "the chain was rewritten after it was signed"
        )
    if key is not None:
        return _signature_problem(cp, key, where)
    return None


def _signature_problem(cp: Checkpoint, key: Ed25519PublicKey, where: str) -> str | None:
    """What is wrong with CP's signatures by KEY (its envelope, and its note if it has one)."""
    try:
        got = dsse.verify(json.loads(cp.envelope), key, where)
        pred = st.parse(got.payload).predicate
    except Exception as e:  # noqa: BLE001 - any failure is this checkpoint's problem
        return f"{where}: its signature does not verify with the key given ({e})"
    if (pred.get("size"), pred.get("root")) != (cp.size, cp.root):
        return f"{where}: the signed statement says another size or root"
    if cp.note is not None:
        try:
            signed = note.verify(cp.note, key, where)
        except Exception as e:  # noqa: BLE001 - any failure is this checkpoint's problem
            return f"{where}: its signed note does not verify with the key given ({e})"
        if (signed.size, signed.root_hex) != (cp.size, cp.root):
            return f"{where}: the signed note says another size or root"
    return None
