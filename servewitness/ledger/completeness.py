"""Whether an answer may say "none" (or "these, and no others"): every ledgered content of a
kind checked whole against its ledger entry, so a row deleted behind the ledger's back is a
difference and never reads as "never stored".

An answer that finds a record rests on the rows it returns, each checked against its entry
(:mod:`servewitness.ledger.content_check`). An answer that finds nothing, or lists every
process that loaded a file, also rests on the rows it did *not* find: a deleted
``request_ids`` row made a served request read as never served, and a deleted manifest made
the worker that served it vanish from ``audit file``. So before such an answer:

- :func:`manifests`: every ledgered manifest's stored JSON recomputes its entry's subject (a
  manifest edited to drop a file, or deleted, is named). O(the stored manifests' bytes):
  manifests are kept once per distinct set of loaded files, so a fleet of identical workers
  stores a few.
- :func:`bindings`: every ledgered batch of request bindings, its span and id rows hashed
  whole, recomputes its entry's subject. O(every binding row): what ``audit verify`` does for
  bindings, paid only by an answer that found no request.

The ledger entries themselves are trusted here as far as each entry's own hash: an entry
deleted and the chain rewritten after it is ``chain.verify``'s and the signed checkpoints'
to find (the verifier's key signs the tree, which the database's writer does not hold).
"""

from __future__ import annotations

from servewitness.ledger import bindings as B
from servewitness.ledger import chain
from servewitness.ledger.content_check import Difference
from servewitness.ledger.interface import Database


def ledgered(db: Database, kind: str) -> dict[str, str]:
    """ref -> subject of every ledger entry of KIND whose fields match its own hash, in one
    pass over the kind's entries (a ref ledgered twice: the later entry)."""
    out: dict[str, str] = {}
    for seq, at, k, ref, subject, prev, h in db.execute(
        "SELECT seq, at_unix, kind, ref, subject, prev, hash FROM ledger WHERE kind = ? "
        "ORDER BY seq",
        (kind,),
    ):
        if chain.entry_hash((int(seq), at, k, ref, subject, prev)) == h:
            out[str(ref)] = str(subject)
    return out


def manifest_is_ledgered(db: Database, digest: str) -> bool:
    """Whether manifest DIGEST has a ledger entry (whose own hash holds): it was stored."""
    for seq, at, k, ref, subject, prev, h in db.execute(
        "SELECT seq, at_unix, kind, ref, subject, prev, hash FROM ledger WHERE kind = ? "
        "AND ref = ?",
        ("manifest", digest),
    ):
        if chain.entry_hash((int(seq), at, k, ref, subject, prev)) == h:
            return True
    return False


def manifests(db: Database) -> list[Difference]:
    """Every ledgered manifest: its row is stored and its JSON recomputes the entry's subject."""
    want = ledgered(db, "manifest")
    out: list[Difference] = []
    for digest, files_json in db.execute("SELECT digest, files_json FROM manifests"):
        d = str(digest)
        subject = want.pop(d, None)
        if subject is not None and subject != chain.manifest_subject(files_json):
            out.append(Difference("manifests", d, "ledger entry", "changed or unledgered", None))
    for d in sorted(want):
        out.append(Difference("manifests", d, "row", None, "a ledgered manifest"))
    return out


def bindings(db: Database) -> list[Difference]:
    """Every ledgered batch of request bindings: its ``binding_batches`` row is stored and its
    span and id rows, hashed whole in storage order, recompute the entry's subject."""
    want = ledgered(db, "bindings")
    out: list[Difference] = []
    for ref, target, received, spans, ids, counts in B.stored_batches(db):
        subject = want.pop(ref, None)
        if subject is None:
            continue  # rows behind the ledger's back: no evidence, and no answer counts them
        if subject != chain.bindings_subject(ref, target, received, spans, ids, counts):
            out.append(Difference("bindings", ref, "ledger entry", "changed or unledgered", None))
    for ref in sorted(want):
        out.append(Difference("binding_batches", ref, "row", None, "a ledgered batch"))
    return out
