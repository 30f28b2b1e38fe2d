"""The ledger against a checkpoint kept outside its database: append-only, or what broke it.

Whoever can write the verifier's database can rewrite the chain from an edit onwards and
delete the checkpoints stored beside it; the chain then verifies again. A signed checkpoint
note (:mod:`servewitness.ledger.note`) kept anywhere else (an auditor's disk, a witness, a
ticket) pins the tree at its size: :func:`check` proves the ledger as it is now is an
append-only extension of it (the tree over the first SIZE entries has the signed root, and
an RFC 9162 consistency proof leads from it to the tree of the whole ledger), and that the
database still holds that checkpoint. Each way it can fail is its own :class:`NotAnExtension`
kind, so a report says which: ``truncated``, ``rewritten``, ``checkpoint_dropped``.

Consistency proofs between two notes travel as JSON (:func:`proof_json`, :func:`read_proof`):
``{"from": {"size", "root"}, "to": {"size", "root"}, "proof": [base64 hashes]}``, roots in
base64 as in the notes.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from servewitness.errors import CheckFailed
from servewitness.ledger import merkle
from servewitness.ledger.errors import BundleCorrupt
from servewitness.ledger.interface import Database
from servewitness.ledger.note import SignedCheckpoint


class NotAnExtension(CheckFailed):
    """The ledger is not an append-only extension of the checkpoint kept elsewhere."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Anchored:
    """The ledger is an extension of OLD: the tree now, and the proof from OLD to it."""

    old_size: int
    old_root: bytes
    size: int
    root: bytes
    proof: tuple[bytes, ...]


def ledger_tree(db: Database) -> merkle.Tree:
    """The RFC 6962 tree over the ledger's entry hashes, as stored now."""
    return merkle.Tree(
        bytes.fromhex(str(h)) for (h,) in db.execute("SELECT hash FROM ledger ORDER BY seq")
    )


def check(db: Database, old: SignedCheckpoint, tree: merkle.Tree | None = None) -> Anchored:
    """Whether the ledger in DB extends OLD (a checkpoint whose signature was verified)."""
    tree = ledger_tree(db) if tree is None else tree
    signed = f"the checkpoint kept elsewhere ({old.size} entries, root {old.root_hex[:16]})"
    if tree.size < old.size:
        raise NotAnExtension(
            "truncated",
            f"the ledger has {tree.size} entries, fewer than the {old.size} of {signed}: "
            "entries were deleted",
        )
    if tree.root(old.size) != old.root:
        raise NotAnExtension(
            "rewritten",
            f"the ledger's first {old.size} entries no longer have the root of {signed}: "
            "the chain was rewritten after it was signed",
        )
    proof = tree.consistency_proof(old.size)
    root = tree.root()
    if not merkle.verify_consistency(old.size, tree.size, old.root, root, proof):
        raise NotAnExtension(  # cannot happen for a tree whose prefix root matched
            "rewritten", f"no consistency proof from {signed} to the ledger's {tree.size}"
        )
    if not _stored(db, old):
        raise NotAnExtension(
            "checkpoint_dropped",
            f"the database no longer holds {signed}: its stored checkpoints were deleted or "
            "rewritten",
        )
    return Anchored(old.size, old.root, tree.size, root, tuple(proof))


def _stored(db: Database, old: SignedCheckpoint) -> bool:
    rows = db.execute("SELECT root FROM checkpoints WHERE size = ?", (old.size,)).fetchall()
    return any(str(r) == old.root_hex for (r,) in rows)


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def proof_json(
    old_size: int, old_root: bytes, size: int, root: bytes, proof: tuple[bytes, ...]
) -> dict[str, Any]:
    return {
        "from": {"size": old_size, "root": _b64(old_root)},
        "to": {"size": size, "root": _b64(root)},
        "proof": [_b64(p) for p in proof],
    }


def _hash(value: object, where: str) -> bytes:
    try:
        b = base64.b64decode(str(value), validate=True) if isinstance(value, str) else b""
    except (binascii.Error, ValueError):
        b = b""
    if len(b) != merkle.HASH_SIZE:
        raise BundleCorrupt("not the base64 of a 32-byte hash", where)
    return b


def read_proof(data: bytes, where: str) -> tuple[int, bytes, int, bytes, list[bytes]]:
    """(from size, from root, to size, to root, proof) of a proof written by
    :func:`proof_json`; :class:`BundleCorrupt` for anything else."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BundleCorrupt(f"not JSON ({e})", where) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("proof"), list):
        raise BundleCorrupt('no "proof" list', where)
    ends = []
    for side in ("from", "to"):
        part = doc.get(side)
        if not isinstance(part, dict) or type(part.get("size")) is not int or part["size"] < 0:
            raise BundleCorrupt(f'no "{side}" with a size', where)
        ends.append((int(part["size"]), _hash(part.get("root"), f"{where}: {side}.root")))
    hashes = [_hash(p, f"{where}: proof[{i}]") for i, p in enumerate(doc["proof"])]
    return ends[0][0], ends[0][1], ends[1][0], ends[1][1], hashes
