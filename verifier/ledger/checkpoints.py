"""Signed checkpoints of the ledger: the RFC 6962 tree head over its first SIZE entries,
signed with the verifier's Ed25519 key (a DSSE envelope of an in-toto statement), kept in the
``checkpoints`` table. A hash chain alone can be rewritten from an edit onwards and verify
again; a checkpoint pins the tree as it was: ``check`` recomputes each stored checkpoint's
root from the ledger as it is now, so a rewrite behind a checkpoint is named.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from verifier.ledger import dsse, merkle
from verifier.ledger import statement as st
from verifier.ledger.interface import Database
from verifier.ledger.keys import Ed25519PrivateKey, Ed25519PublicKey, key_id


@dataclass(frozen=True)
class Checkpoint:
    size: int
    root: str
    head: str
    at_unix: float
    envelope: str


def _tree(db: Database) -> tuple[merkle.Tree, list[str]]:
    hashes = [str(h) for (h,) in db.execute("SELECT hash FROM ledger ORDER BY seq")]
    return merkle.Tree(bytes.fromhex(h) for h in hashes), hashes


def sign(db: Database, key: Ed25519PrivateKey, at: float | None = None) -> Checkpoint | None:
    """Sign the tree head of the whole ledger and store it (inside the caller's transaction);
    None when the ledger is empty or has not grown since the latest checkpoint."""
    size_row = db.execute("SELECT COUNT(*) FROM ledger").fetchone()
    size = int(size_row[0]) if size_row else 0
    last = db.execute("SELECT MAX(size) FROM checkpoints").fetchone()
    if size == 0 or (last is not None and last[0] is not None and int(last[0]) >= size):
        return None
    at = time.time() if at is None else at
    root = merkle.root(
        bytes.fromhex(h) for (h,) in db.execute("SELECT hash FROM ledger ORDER BY seq")
    ).hex()
    head = str(db.execute("SELECT hash FROM ledger WHERE seq = ?", (size,)).fetchone()[0])
    statement = st.statement(
        [st.subject("ledger", root)],
        st.CHECKPOINT,
        st.checkpoint(size=size, root=root, at_unix=at, verifier_id=key_id(key), head=head),
    )
    envelope = json.dumps(dsse.sign(st.encode(statement), st.PAYLOAD_TYPE, key))
    db.execute(
        "INSERT INTO checkpoints (size, root, head, at_unix, envelope) VALUES (?, ?, ?, ?, ?)",
        (size, root, head, at, envelope),
    )
    return Checkpoint(size, root, head, at, envelope)


def stored(db: Database) -> list[Checkpoint]:
    return [
        Checkpoint(int(s), str(r), str(h), float(a), str(e))
        for s, r, h, a, e in db.execute(
            "SELECT size, root, head, at_unix, envelope FROM checkpoints ORDER BY rowid"
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
        if cp.size > tree.size:
            return i, f"{where}: the ledger now has only {tree.size} entries (entries deleted)"
        if tree.root(cp.size).hex() != cp.root or hashes[cp.size - 1] != cp.head:
            return i, (
                f"{where}: the ledger's first {cp.size} entries no longer have the signed root: "
                "the chain was rewritten after it was signed"
            )
        if key is not None:
            try:
                got = dsse.verify(json.loads(cp.envelope), key, where)
                pred = st.parse(got.payload).predicate
            except Exception as e:  # noqa: BLE001 - any failure is this checkpoint's problem
                return i, f"{where}: its signature does not verify with the key given ({e})"
            if (pred.get("size"), pred.get("root")) != (cp.size, cp.root):
                return i, f"{where}: the signed statement says another size or root"
    return len(cps), None
