"""Checking an export bundle (:mod:`servewitness.ledger.bundle`) offline, with the verifier's
public key alone: the checkpoint's signature, every entry's hash and its inclusion in the
signed tree, the chain between consecutive entries, the optional consistency proof, and that
every statement is signed, bound to an included entry, and carried with content that
recomputes that entry's subject. :func:`verify_bundle` raises at the first problem;
:func:`check_bundle` reports it. What each check proves is in docs/audit.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from servewitness.ledger import chain, dsse, merkle
from servewitness.ledger import statement as st
from servewitness.ledger.bundle import FORMAT, HEX64, Fields, LedgerEntry, binding, content_subject
from servewitness.ledger.errors import BundleCorrupt, WrongKey
from servewitness.ledger.keys import Ed25519PublicKey, key_id

_JSON_TYPES = {dict: "object", list: "array"}


@dataclass
class BundleVerification:
    ok: bool
    keyid: str
    size: int = 0
    root: str = ""
    head: str = ""
    at_unix: float = 0.0
    verifier_id: str = ""
    entries: int = 0
    statements: int = 0
    proofs: int = 0
    consistency: dict[str, Any] | None = None  # {"size", "root"} proven to be a prefix
    checks: list[str] = field(default_factory=list)
    problem: str | None = None
    location: str | None = None
    exit_code: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "keyid": self.keyid,
            "checkpoint": {
                "size": self.size,
                "root": self.root,
                "head": self.head,
                "at_unix": self.at_unix,
                "verifier_id": self.verifier_id,
            },
            "counts": {
                "entries": self.entries,
                "statements": self.statements,
                "proofs": self.proofs,
            },
            "consistency": self.consistency,
            "checks": self.checks,
            "problem": self.problem,
            "location": self.location,
            "exit_code": self.exit_code,
        }


def _hex64(v: object, what: str, where: str) -> str:
    if not isinstance(v, str) or not HEX64.fullmatch(v):
        raise BundleCorrupt(f"{what} must be 64 lowercase hex digits", where)
    return v


def _entry(d: object, where: str) -> LedgerEntry:
    if not isinstance(d, Mapping):
        raise BundleCorrupt("an entry must be a JSON object", where)
    f = Fields(d, where)
    seq = f.integer("seq")
    if seq < 1:
        raise BundleCorrupt("seq must be at least 1", where)
    return LedgerEntry(
        seq,
        f.number("at"),
        f.text("kind"),
        f.text("ref"),
        _hex64(d.get("subject"), "subject", where),
        _hex64(d.get("prev"), "prev", where),
        _hex64(d.get("hash"), "hash", where),
    )


def _hex_list(v: object, where: str) -> list[bytes]:
    if not isinstance(v, list):
        raise BundleCorrupt("a proof must be a list of hex hashes", where)
    return [bytes.fromhex(_hex64(p, "a proof hash", where)) for p in v]


class _Check:
    def __init__(self, key: Ed25519PublicKey) -> None:
        self.key = key
        self.result = BundleVerification(ok=False, keyid=key_id(key))

    def note(self, what: str) -> None:
        self.result.checks.append(what)

    def statement(self, env: object, where: str) -> st.Statement:
        v = dsse.verify(env, self.key, where)
        if v.payload_type != st.PAYLOAD_TYPE:
            raise BundleCorrupt(f"payloadType {v.payload_type!r}, not {st.PAYLOAD_TYPE}", where)
        try:
            return st.parse(v.payload)
        except ValueError as e:
            raise BundleCorrupt(str(e), where) from None

    def run(self, data: bytes) -> BundleVerification:
        doc = self.document(data)
        root = self.checkpoint(doc["checkpoint"])
        by_seq = self.entries(doc["entries"])
        self.proofs(doc["proofs"], by_seq, root)
        if doc.get("consistency") is not None:
            self.consistency(doc["consistency"], root)
        self.statements(doc["statements"], doc["contents"], by_seq)
        self.result.ok = True
        return self.result

    def document(self, data: bytes) -> dict[str, Any]:
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, bad UTF-8, too deep
            raise BundleCorrupt(f"not JSON ({e})", "bundle") from None
        if not isinstance(doc, dict):
            raise BundleCorrupt("not a JSON object", "bundle")
        if doc.get("bundle") != FORMAT:
            raise BundleCorrupt(f"not a bundle of format {FORMAT}", "bundle")
        for name, typ in (("checkpoint", dict), ("entries", list), ("proofs", dict),
                          ("statements", list), ("contents", list)):  # fmt: skip
            if not isinstance(doc.get(name), typ):
                raise BundleCorrupt("missing, or not a JSON " + _JSON_TYPES[typ], name)
        return doc

    def checkpoint(self, env: object) -> bytes:
        """(b) signed by the key, a well-formed tree head. The root."""
        r = self.result
        cp = self.statement(env, "checkpoint")
        if cp.predicate_type != st.CHECKPOINT:
            raise BundleCorrupt(f"predicateType {cp.predicate_type!r}", "checkpoint")
        f = Fields(cp.predicate, "checkpoint.predicate")
        r.size, r.at_unix = f.integer("size"), f.number("at_unix")
        r.verifier_id = f.text("verifier_id")
        r.root = _hex64(cp.predicate.get("root"), "root", "checkpoint.predicate")
        r.head = _hex64(cp.predicate.get("head"), "head", "checkpoint.predicate")
        if r.size < 0 or [d for _, d in cp.subjects] != [r.root]:
            raise BundleCorrupt("size or subject does not match the tree head", "checkpoint")
        self.note(f"checkpoint signed by key {r.keyid[:16]}: {r.size} entries, root {r.root[:16]}")
        return bytes.fromhex(r.root)

    def entries(self, items: list[Any]) -> dict[int, LedgerEntry]:
        """(c) each hash recomputes, the chain links where seqs are consecutive, and the last
        entry is the checkpoint's head."""
        r = self.result
        by_seq: dict[int, LedgerEntry] = {}
        last: LedgerEntry | None = None
        for i, d in enumerate(items):
            e = _entry(d, f"entries[{i}]")
            where = f"entries[{i}] (seq {e.seq})"
            if last is not None and e.seq <= last.seq:
                raise BundleCorrupt(f"out of order: after seq {last.seq}", where)
            if e.seq > r.size:
                raise BundleCorrupt(f"beyond the checkpoint's {r.size} entries", where)
            if chain.entry_hash(e.fields()) != e.hash:
                raise BundleCorrupt("its fields do not match its hash", where)
            if e.seq == 1 and e.prev != chain.GENESIS:
                raise BundleCorrupt("the first entry does not start the chain", where)
            if last is not None and e.seq == last.seq + 1 and e.prev != last.hash:
                raise BundleCorrupt(f"does not follow entry {last.seq}", where)
            by_seq[e.seq] = e
            last = e
        r.entries = len(by_seq)
        if r.size == 0:
            if by_seq or r.head != chain.GENESIS or r.root != merkle.EMPTY_ROOT.hex():
                raise BundleCorrupt("an empty checkpoint with entries or a head", "checkpoint")
        elif r.size not in by_seq:
            raise BundleCorrupt(f"the head entry {r.size} is not included", "entries")
        elif by_seq[r.size].hash != r.head:
            raise BundleCorrupt("the last entry is not the checkpoint's head", f"seq {r.size}")
        self.note(f"{r.entries} entries: hashes recompute, consecutive entries chain")
        return by_seq

    def proofs(self, proofs: dict[str, Any], by_seq: dict[int, LedgerEntry], root: bytes) -> None:
        """(c) every entry is leaf seq-1 of the checkpoint's tree."""
        r = self.result
        if set(proofs) != {str(s) for s in by_seq}:
            odd = sorted(set(proofs) ^ {str(s) for s in by_seq})
            raise BundleCorrupt(f"proofs and entries differ (seq {', '.join(odd)})", "proofs")
        for seq, e in by_seq.items():
            where = f"proofs[{seq}]"
            path = _hex_list(proofs[str(seq)], where)
            if not merkle.verify_inclusion(e.leaf, seq - 1, r.size, path, root):
                raise BundleCorrupt("entry is not in the checkpoint's tree", where)
        r.proofs = len(by_seq)
        self.note(f"{r.proofs} inclusion proofs against the checkpoint root")

    def consistency(self, cons: object, root: bytes) -> None:
        """The checkpoint's tree extends an earlier tree head (which the bundle does not sign:
        compare it with a checkpoint recorded earlier)."""
        r = self.result
        if not isinstance(cons, Mapping):
            raise BundleCorrupt("not a JSON object", "consistency")
        m = Fields(cons, "consistency").integer("size")
        m_root = _hex64(cons.get("root"), "root", "consistency")
        path = _hex_list(cons.get("proof"), "consistency.proof")
        if not merkle.verify_consistency(m, r.size, bytes.fromhex(m_root), root, path):
            raise BundleCorrupt(f"the checkpoint does not extend size {m}", "consistency")
        r.consistency = {"size": m, "root": m_root}
        self.note(f"the checkpoint extends the tree of size {m}, root {m_root[:16]}")

    def statements(
        self, statements: list[Any], contents: list[Any], by_seq: dict[int, LedgerEntry]
    ) -> None:
        """(a)+(d) signed, bound to an included entry, the content recomputes its subject."""
        r = self.result
        if len(contents) != len(statements):
            raise BundleCorrupt(
                f"{len(statements)} statements and {len(contents)} contents", "contents"
            )
        for i, env in enumerate(statements):
            self.bound(i, self.statement(env, f"statements[{i}]"), contents[i], by_seq)
        r.statements = len(statements)
        self.note(
            f"{r.statements} statements signed, each bound to an included entry whose "
            "subject its content recomputes"
        )

    def bound(self, i: int, s: st.Statement, c: object, by_seq: dict[int, LedgerEntry]) -> None:
        where, cwhere = f"statements[{i}]", f"contents[{i}]"
        if s.predicate_type == st.CHECKPOINT:
            raise BundleCorrupt("a checkpoint among the statements", where)
        b = s.predicate.get("ledger")
        if not isinstance(b, Mapping):
            raise BundleCorrupt("the predicate has no ledger binding", where)
        seq = Fields(b, f"{where}.predicate.ledger").integer("seq")
        e = by_seq.get(seq)
        if e is None:
            raise BundleCorrupt(f"bound to entry {seq}, which the bundle lacks", where)
        if dict(b) != binding(e):
            raise BundleCorrupt(f"its ledger binding does not match entry {seq}", where)
        if [d for _, d in s.subjects] != [e.subject]:
            raise BundleCorrupt(f"its subject is not entry {seq}'s subject", where)
        if not isinstance(c, Mapping):
            raise BundleCorrupt("not a JSON object", cwhere)
        kind, subject, ref = content_subject(c, cwhere)
        if kind != e.kind:
            raise BundleCorrupt(f"a {kind}, but entry {seq} is a {e.kind}", cwhere)
        if subject != e.subject:
            raise BundleCorrupt(f"does not recompute entry {seq}'s subject", cwhere)
        if ref is not None and ref != e.ref:
            raise BundleCorrupt(f"does not recompute entry {seq}'s ref", cwhere)


def verify_bundle(data: bytes, public_key: Ed25519PublicKey) -> BundleVerification:
    """Check bundle DATA offline with PUBLIC_KEY; see the module docstring. Raises
    :class:`BundleCorrupt` (exit 7) at the first problem, :class:`WrongKey` (exit 8) when the
    signatures are by another key."""
    return _Check(public_key).run(data)


def check_bundle(data: bytes, public_key: Ed25519PublicKey) -> BundleVerification:
    """:func:`verify_bundle` that reports instead of raising: ``ok`` False, with the problem,
    its location, the exit code and the checks that passed before it."""
    c = _Check(public_key)
    try:
        return c.run(data)
    except (BundleCorrupt, WrongKey) as e:
        c.result.problem, c.result.location = e.problem, e.location
        c.result.exit_code = e.exit_code
        return c.result
