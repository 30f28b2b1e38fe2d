"""The export bundle: ledger entries, their inclusion in a signed checkpoint, and signed
statements bound to them, in one JSON file that verifies offline with the public key alone.

Format (``"bundle": 1``)::

    {"bundle": 1,
     "checkpoint": DSSE(in-toto Statement, predicateType CHECKPOINT,
                        subject [{name: "ledger", digest: {sha256: ROOT}}],
                        predicate {size, root, at_unix, verifier_id, head}),
     "entries":   [{seq, at, kind, ref, subject, prev, hash}, ...]   (ascending seq),
     "proofs":    {"SEQ": [hex, ...], ...}   (inclusion of entry SEQ at leaf SEQ-1, tree SIZE),
     "statements": [DSSE(in-toto Statement), ...],
     "contents":  [{"kind": K, "fields": {...}}, ...]   (one per statement, same order),
     "consistency": {"size": M, "root": hex, "proof": [hex, ...]}   (optional)}

Merkle leaves are the entries' hashes as raw 32 bytes (:mod:`servewitness.ledger.merkle`). Each
statement's predicate carries ``ledger: {seq, kind, ref, hash}``, its one subject's sha256 is
that entry's ``subject``, and its content recomputes that subject with the ledger's own
functions (:data:`CONTENT_KINDS`, one subject function per kind; :func:`register_kind` adds
one). Checking a bundle offline is :mod:`servewitness.ledger.verify_bundle`; what each check
proves is in docs/audit.md.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from servewitness.ledger import bindings, chain, dsse, merkle
from servewitness.ledger import statement as st
from servewitness.ledger.errors import BundleCorrupt
from servewitness.ledger.interface import Database
from servewitness.ledger.keys import Ed25519PrivateKey, key_id

FORMAT = 1
HEX64 = re.compile(r"[0-9a-f]{64}")


# Ledger entries --------------------------------------------------------------------------


@dataclass(frozen=True)
class LedgerEntry:
    seq: int
    at: float
    kind: str
    ref: str
    subject: str
    prev: str
    hash: str

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> LedgerEntry:
        """From a ``ledger`` table row (seq, at_unix, kind, ref, subject, prev, hash)."""
        seq, at, kind, ref, subject, prev, h = row
        return cls(int(seq), float(at), str(kind), str(ref), str(subject), str(prev), str(h))

    def fields(self) -> chain.Entry:
        return (self.seq, self.at, self.kind, self.ref, self.subject, self.prev)

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "at": self.at,
            "kind": self.kind,
            "ref": self.ref,
            "subject": self.subject,
            "prev": self.prev,
            "hash": self.hash,
        }

    @property
    def leaf(self) -> bytes:
        return bytes.fromhex(self.hash)


def tree_from_db(db: Database, size: int | None = None) -> merkle.Tree:
    """The Merkle tree over the ledger's first SIZE entries (all by default), in seq order."""
    sql = "SELECT hash FROM ledger ORDER BY seq"
    rows = db.execute(sql + " LIMIT ?", (size,)) if size is not None else db.execute(sql, ())
    return merkle.Tree(bytes.fromhex(h) for (h,) in rows)


def entries_from_db(db: Database, seqs: Iterable[int]) -> list[LedgerEntry]:
    wanted = sorted(set(seqs))
    out = []
    for seq in wanted:
        row = db.execute(
            "SELECT seq, at_unix, kind, ref, subject, prev, hash FROM ledger WHERE seq = ?",
            (seq,),
        ).fetchone()
        if row is None:
            raise ValueError(f"no ledger entry {seq}")
        out.append(LedgerEntry.from_row(row))
    return out


# Content kinds: what recomputes an entry's subject ----------------------------------------


class Fields:
    """A content's fields, read with types; a missing or mistyped field is BundleCorrupt."""

    def __init__(self, data: Mapping[str, Any], where: str) -> None:
        self._data = data
        self.where = where

    def _get(self, name: str) -> Any:
        if name not in self._data:
            raise BundleCorrupt(f"the content has no field {name!r}", self.where)
        return self._data[name]

    def has(self, name: str) -> bool:
        return name in self._data

    def text(self, name: str) -> str:
        v = self._get(name)
        if not isinstance(v, str):
            raise BundleCorrupt(f"field {name!r} must be a string", self.where)
        return v

    def integer(self, name: str) -> int:
        v = self._get(name)
        if not isinstance(v, int) or isinstance(v, bool):
            raise BundleCorrupt(f"field {name!r} must be an integer", self.where)
        return v

    def number(self, name: str) -> float:
        v = self._get(name)
        if not isinstance(v, int | float) or isinstance(v, bool):
            raise BundleCorrupt(f"field {name!r} must be a number", self.where)
        try:
            return float(v)
        except OverflowError:
            raise BundleCorrupt(f"field {name!r} is out of range", self.where) from None

    def sha256_of(self, name: str) -> str:
        """The hex sha256 of field NAME_b64 (base64 bytes) or NAME_text (UTF-8 text), or the
        hex digest given as NAME_sha256 (then the bytes themselves are not in the bundle)."""
        if self.has(f"{name}_b64"):
            try:
                data = dsse.b64decode(self.text(f"{name}_b64"))
            except ValueError as e:
                raise BundleCorrupt(f"field {name}_b64: {e}", self.where) from None
            return hashlib.sha256(data).hexdigest()
        if self.has(f"{name}_text"):
            try:
                data = self.text(f"{name}_text").encode()
            except UnicodeEncodeError:  # a lone surrogate ("\\ud800" in the JSON): not text
                raise BundleCorrupt(f"field {name}_text is not valid Unicode", self.where) from None
            return hashlib.sha256(data).hexdigest()
        digest = self.text(f"{name}_sha256")
        if not HEX64.fullmatch(digest):
            raise BundleCorrupt(f"field {name}_sha256 must be 64 hex digits", self.where)
        return digest


@dataclass(frozen=True)
class ContentKind:
    name: str
    subject: Callable[[Fields], str]  # the ledger subject the content recomputes to
    ref: Callable[[Fields], str] | None = None  # the entry's ref, where it derives from content


CONTENT_KINDS: dict[str, ContentKind] = {}


def register_kind(
    name: str, subject: Callable[[Fields], str], ref: Callable[[Fields], str] | None = None
) -> None:
    CONTENT_KINDS[name] = ContentKind(name, subject, ref)


def _report_subject(f: Fields) -> str:
    agent_id, seq, target, received = (
        f.text("agent_id"),
        f.integer("seq"),
        f.text("target"),
        f.number("received"),
    )
    receipt = f.text("receipt_json") if f.has("receipt_json") else None
    if f.has("body_b64"):
        try:
            body = dsse.b64decode(f.text("body_b64"))
        except ValueError as e:
            raise BundleCorrupt(f"field body_b64: {e}", f.where) from None
        return chain.report_subject(agent_id, seq, target, received, body, receipt_json=receipt)
    # The digest alone: the same layout as chain.report_subject (tests hold them together).
    tail = () if receipt is None else (receipt,)
    return chain.sha("report", agent_id, seq, target, received, f.sha256_of("body"), *tail)


def _bindings_subject(f: Fields) -> str:
    """A batch of request bindings (the one that came with report SEQ of AGENT_ID): the same
    layout as ``chain.bindings_subject`` (tests hold them together)."""
    ref = chain.report_ref(f.text("agent_id"), f.integer("seq"))
    parts = [ref, f.text("target"), f.number("received"), f.sha256_of("spans"), f.sha256_of("ids")]
    if f.has("counts_json"):  # a batch stored since per-process counts were ledgered
        counts = f.text("counts_json")
        if f.has("spans_b64") and counts != _counts_of_spans(f):
            raise BundleCorrupt("counts_json is not the counts of the batch's rows", f.where)
        parts.append(counts)
    return chain.sha("bindings", *parts)


def _counts_of_spans(f: Fields) -> str:
    """``bindings.counts_json`` of the span rows in field spans_b64."""
    try:
        rows = json.loads(dsse.b64decode(f.text("spans_b64")))
        return bindings.counts_json(rows)
    except (ValueError, TypeError, IndexError, KeyError) as e:
        raise BundleCorrupt(f"field spans_b64 does not hold span rows: {e}", f.where) from None


register_kind(
    "run",
    lambda f: chain.run_subject(
        f.text("name"), f.text("policy"), f.text("digest"), f.text("source"), f.number("created")
    ),
    lambda f: chain.run_ref(f.text("name")),
)
register_kind(
    "manifest", lambda f: chain.manifest_subject(f.text("files_json")), lambda f: f.text("digest")
)
register_kind(
    "report", _report_subject, lambda f: chain.report_ref(f.text("agent_id"), f.integer("seq"))
)
register_kind(
    "verdict",
    lambda f: chain.verdict_subject(
        f.text("run"), f.number("at"), f.text("verdict"), f.text("detail_json")
    ),
    lambda f: chain.verdict_ref(f.text("run"), f.number("at")),
)
register_kind(
    "target",
    lambda f: chain.target_subject(
        f.text("target"),
        f.number("at"),
        f.text("event"),
        f.text("by"),
        f.text("last_agent"),
        f.integer("last_seq"),
    ),
    lambda f: chain.target_ref(f.text("target"), f.number("at")),
)
register_kind(
    "bindings",
    _bindings_subject,
    lambda f: chain.report_ref(f.text("agent_id"), f.integer("seq")),
)


def content(kind: str, **fields: Any) -> dict[str, Any]:
    """A content object: KIND and the fields its subject function reads."""
    return {"kind": kind, "fields": fields}


def content_subject(c: Mapping[str, Any], where: str = "content") -> tuple[str, str, str | None]:
    """(kind, subject, ref or None) that content C recomputes to."""
    kind = c.get("kind")
    fields = c.get("fields")
    if not isinstance(kind, str) or not isinstance(fields, Mapping):
        raise BundleCorrupt("a content needs a kind and a fields object", where)
    k = CONTENT_KINDS.get(kind)
    if k is None:
        raise BundleCorrupt(f"unknown content kind {kind!r}", where)
    f = Fields(fields, where)
    return kind, k.subject(f), k.ref(f) if k.ref else None


# Building ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attestation:
    """One statement to bind to ledger entry SEQ: its CONTENT (from :func:`content`) must
    recompute that entry's subject."""

    seq: int
    content: Mapping[str, Any]
    predicate_type: str
    predicate: Mapping[str, Any]


def binding(e: LedgerEntry) -> dict[str, Any]:
    """The ``ledger`` binding a statement about entry E carries in its predicate."""
    return {"seq": e.seq, "kind": e.kind, "ref": e.ref, "hash": e.hash}


def build_bundle(
    entries: Iterable[LedgerEntry],
    tree: merkle.Proofs,
    key: Ed25519PrivateKey,
    attestations: Sequence[Attestation] = (),
    *,
    at_unix: float,
    size: int | None = None,
    verifier_id: str | None = None,
    since: int | None = None,
) -> dict[str, Any]:
    """A bundle over the ledger's first SIZE entries (default: the whole TREE).

    ENTRIES are the ledger entries to include; they must contain the head (seq SIZE) and every
    attestation's entry, and agree with TREE. SINCE adds a consistency proof from the tree of
    that size (the size of a checkpoint published earlier). ValueError when the inputs do not
    agree with each other."""
    size = tree.size if size is None else size
    if not 1 <= size <= tree.size:
        raise ValueError(f"checkpoint size {size} outside 1..{tree.size}")
    by_seq = {e.seq: e for e in entries if e.seq <= size}
    if size not in by_seq:
        raise ValueError(f"the head entry {size} must be among the entries")
    head = by_seq[size]
    for e in by_seq.values():
        if tree.leaf_hash(e.seq - 1) != merkle.leaf_hash(e.leaf):
            raise ValueError(f"entry {e.seq} is not leaf {e.seq - 1} of the tree")
        if chain.entry_hash(e.fields()) != e.hash:
            raise ValueError(f"entry {e.seq} does not match its hash")
    root = tree.root(size).hex()
    vid = verifier_id or key_id(key)
    cp = st.statement(
        [st.subject("ledger", root)],
        st.CHECKPOINT,
        st.checkpoint(size=size, root=root, at_unix=at_unix, verifier_id=vid, head=head.hash),
    )
    statements, contents = [], []
    for a in attestations:
        if a.seq not in by_seq:
            raise ValueError(f"attestation for entry {a.seq}, which is not among the entries")
        e = by_seq[a.seq]
        kind, subject, ref = content_subject(a.content)
        if (kind, subject) != (e.kind, e.subject) or ref not in (None, e.ref):
            raise ValueError(f"the content for entry {a.seq} does not recompute its subject")
        predicate = {**a.predicate, "ledger": binding(e)}
        s = st.statement([st.subject(f"{e.kind}:{e.ref}", e.subject)], a.predicate_type, predicate)
        statements.append(dsse.sign(st.encode(s), st.PAYLOAD_TYPE, key))
        contents.append(dict(a.content))
    ordered = sorted(by_seq.values(), key=lambda e: e.seq)
    out: dict[str, Any] = {
        "bundle": FORMAT,
        "checkpoint": dsse.sign(st.encode(cp), st.PAYLOAD_TYPE, key),
        "entries": [e.to_json() for e in ordered],
        "proofs": {
            str(e.seq): [p.hex() for p in tree.inclusion_proof(e.seq - 1, size)] for e in ordered
        },
        "statements": statements,
        "contents": contents,
    }
    if since is not None:
        if not 1 <= since <= size:
            raise ValueError(f"consistency from size {since} outside 1..{size}")
        out["consistency"] = {
            "size": since,
            "root": tree.root(since).hex(),
            "proof": [p.hex() for p in tree.consistency_proof(since, size)],
        }
    return out


def dump(bundle: Mapping[str, Any]) -> bytes:
    return json.dumps(bundle, indent=1, sort_keys=True).encode() + b"\n"
