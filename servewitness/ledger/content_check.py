"""Stored content against its own ledger entry, for the rows one answer rests on, and the
differences the index checks name (:mod:`servewitness.ledger.index_check`).

A manifest, a report or a batch of request bindings is checked by recomputing the subject of
its ledger entry: one probe per entry through the ledger's index on (kind, ref) where the
database has it (``ledger_by_ref``), else one pass over the kind's entries. A batch an answer
returns rows of is hashed whole (O(its rows)): its ledger subject is one digest over every
row. The per-process request counts a batch's subject also covers (since they were ledgered)
are checked from its ``binding_batches`` row alone (:func:`ledgered_counts`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from servewitness.errors import CheckFailed
from servewitness.ledger import bindings, chain
from servewitness.ledger.interface import Database


class IndexDisagrees(CheckFailed):
    """An index row the answer would use is not what the ledgered content says (exit 1)."""


@dataclass(frozen=True)
class Difference:
    """One index row that is not what the ledgered content derives."""

    table: str
    key: str
    field: str  # a column, or "row" for a row missing from or extra in the table
    stored: Any
    derived: Any

    def __str__(self) -> str:
        if self.field == "row" and self.derived is None:
            return f"{self.table} {self.key}: a row no ledgered content derives"
        if self.field == "row":
            return f"{self.table} {self.key}: missing (the ledgered content derives it)"
        if self.field == "ledger entry":
            return f"{self.table} {self.key}: changed after it was ledgered, or never ledgered"
        if self.derived is None:
            return (
                f"{self.table} {self.key}: {self.field} {self.stored!r} is in no ledgered manifest"
            )
        return (
            f"{self.table} {self.key}: {self.field} is {self.stored!r}, the ledgered content "
            f"says {self.derived!r}"
        )

    def to_json(self) -> dict[str, Any]:
        return {"table": self.table, "key": self.key, "field": self.field,
                "stored": self.stored, "derived": self.derived}  # fmt: skip


def fmt_key(k: Sequence[Any]) -> str:
    return json.dumps(list(k))


# Content against its ledger entry (for the rows one answer uses) -----------------------------


def _has_ref_index(db: Database) -> bool:
    """Whether the ledger has its index on (kind, ref) (``ledger_by_ref``; a database made by
    an older verifier may not)."""
    sql = (
        "SELECT 1 FROM pg_indexes WHERE indexname = 'ledger_by_ref'"
        if db.kind == "postgresql"
        else "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = 'ledger_by_ref'"
    )
    return db.execute(sql).fetchone() is not None


def _subjects(db: Database, kind: str, refs: Iterable[str]) -> dict[str, str]:
    """The subject of the ledger entry of each of REFS of KIND whose fields match its own
    hash (the chain between entries is ``chain.verify``'s, or the inclusion proof's). One
    probe per ref through ``ledger_by_ref``; without that index, one pass over the kind's
    entries (a query per ref would scan the ledger once per ref)."""
    wanted = set(refs)
    out: dict[str, str] = {}
    if not wanted:
        return out
    sql = "SELECT seq, at_unix, kind, ref, subject, prev, hash FROM ledger WHERE kind = ?"
    rows: list[Any] = []
    if _has_ref_index(db):
        for r in sorted(wanted):
            rows += db.execute(sql + " AND ref = ? ORDER BY seq", (kind, r)).fetchall()
    else:
        rows = db.execute(sql + " ORDER BY seq", (kind,)).fetchall()
    for seq, at, k, r, subject, prev, h in rows:
        if r in wanted and chain.entry_hash((int(seq), at, k, r, subject, prev)) == h:
            out[str(r)] = str(subject)
    return out


def check_content(
    db: Database,
    manifests: Iterable[str] = (),
    reports: Iterable[tuple[str, int]] = (),
    batches: Iterable[str] = (),
    *,
    runs: Iterable[str] = (),
    verdicts: Iterable[tuple[str, float]] = (),
) -> list[Difference]:
    """The stored MANIFESTS (digests), REPORTS ((agent, seq)), binding BATCHES (refs), RUNS
    (names) and VERDICTS ((run, at_unix)) an answer rests on, each against the subject of its
    own ledger entry: content edited after it was ledgered, or never ledgered, is named
    (table, key, "ledger entry")."""
    manifests, batches = sorted(set(manifests)), sorted(set(batches))
    out: list[Difference] = _check_runs(db, runs, verdicts)
    want = _subjects(db, "manifest", manifests)
    for d in sorted(set(manifests)):
        row = db.execute("SELECT files_json FROM manifests WHERE digest = ?", (d,)).fetchone()
        if row is not None and want.get(d) != chain.manifest_subject(row[0]):
            out.append(Difference("manifests", d, "ledger entry", "changed or unledgered", None))
    refs = {chain.report_ref(a, int(n)): (a, int(n)) for a, n in reports}
    want = _subjects(db, "report", refs)
    for ref, (agent, seq) in sorted(refs.items()):
        row = db.execute(
            "SELECT target, received_unix, report, receipt_json FROM reports "
            "WHERE agent_id = ? AND seq = ?",
            (agent, seq),
        ).fetchone()
        got = (
            None
            if row is None
            else chain.report_subject(
                agent, seq, row[0], row[1], bytes(row[2]), receipt_json=row[3]
            )
        )
        if got is not None and want.get(ref) != got:
            out.append(Difference("reports", ref, "ledger entry", "changed or unledgered", None))
    want = _subjects(db, "bindings", batches)
    for ref in sorted(set(batches)):
        if want.get(ref) != batch_subject(db, ref):
            out.append(Difference("bindings", ref, "ledger entry", "changed or unledgered", None))
    return out


def _check_runs(
    db: Database, runs: Iterable[str], verdicts: Iterable[tuple[str, float]]
) -> list[Difference]:
    """The ``runs`` rows of RUNS and the ``verdicts`` rows of VERDICTS against their entries."""
    out: list[Difference] = []
    names = sorted(set(runs))
    want = _subjects(db, "run", [chain.run_ref(n) for n in names])
    for n in names:
        for row in db.execute(
            "SELECT policy_toml, policy_digest, source, created_unix FROM runs WHERE name = ?",
            (n,),
        ).fetchall():
            if want.get(chain.run_ref(n)) != chain.run_subject(n, *row):
                out.append(Difference("runs", n, "ledger entry", "changed or unledgered", None))
    refs = {chain.verdict_ref(r, at): (r, at) for r, at in verdicts}
    want = _subjects(db, "verdict", refs)
    for ref, (r, at) in sorted(refs.items()):
        for verdict, detail in db.execute(
            "SELECT verdict, detail_json FROM verdicts WHERE run = ? AND at_unix = ?", (r, at)
        ).fetchall():
            if want.get(ref) != chain.verdict_subject(r, at, verdict, detail):
                out.append(
                    Difference("verdicts", ref, "ledger entry", "changed or unledgered", None)
                )
    return out


def _batch(db: Database, ref: str) -> tuple[Any, list[Any], list[Any]] | None:
    """Batch REF's ``binding_batches`` row (target, received, digests, counts), its span rows
    and its id rows, in storage order (None: no such batch)."""
    head = db.execute(
        f"SELECT target, received_unix, {bindings.batch_columns(db)} FROM binding_batches "  # noqa: S608
        "WHERE ref = ?",
        (ref,),
    ).fetchone()
    if head is None:
        return None
    spans = db.execute(
        f"SELECT {bindings.span_select(db)} FROM bindings WHERE batch = ? ORDER BY rowid",  # noqa: S608
        (ref,),
    ).fetchall()
    ids = db.execute(
        f"SELECT {bindings.ID_COLUMNS} FROM request_ids WHERE batch = ? ORDER BY rowid",  # noqa: S608
        (ref,),
    ).fetchall()
    return head, spans, ids


def _subject_of(ref: str, head: Any, spans: list[Any], ids: list[Any]) -> str:
    derived = (bindings.rows_sha256(spans), bindings.rows_sha256(ids), bindings.counts_json(spans))
    counts = head[4]
    if counts is not None and tuple(head[2:5]) != derived:
        return "the batch's stored digests or counts are not its rows'"
    return chain.bindings_subject(
        ref, head[0], float(head[1]), derived[0], derived[1], None if counts is None else derived[2]
    )


def batch_subject(db: Database, ref: str) -> str | None:
    """The ledger subject batch REF's stored rows recompute to (None: no such batch), hashed
    whole: O(its rows). For a batch stored with its digests and counts, those must be its
    rows' (else a subject that matches no entry)."""
    got = _batch(db, ref)
    return None if got is None else _subject_of(ref, *got)


class LedgeredRows:
    """The rows of binding batches that their ledger entries cover, for a reader that counts
    rows as evidence (a seal's requests check): each batch it is asked about is read and
    hashed whole once (O(its rows); one ledger probe), and kept as the set of its rows when
    they recompute its entry's subject. A row is evidence only when it is one of those: a
    row of a batch with no ledger entry, of a batch whose rows no longer recompute it, or
    added to a checked batch afterwards (or edited since) is not. The refs of the batches
    refused are kept in ``refused``."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.span_columns = bindings.span_select(db)  # read once: a probe of the schema
        self._rows: dict[str, tuple[frozenset[Any], frozenset[Any]] | None] = {}
        self.refused: set[str] = set()

    def _checked(self, ref: str) -> tuple[frozenset[Any], frozenset[Any]] | None:
        if ref in self._rows:
            return self._rows[ref]
        got = _batch(self.db, ref)
        rows = None
        if got is not None and _subjects(self.db, "bindings", [ref]).get(ref) == _subject_of(
            ref, *got
        ):
            rows = (frozenset(map(tuple, got[1])), frozenset(map(tuple, got[2])))
        else:
            self.refused.add(ref)
        self._rows[ref] = rows
        return rows

    def has_span(self, row: Any) -> bool:
        """Whether ROW (``bindings.span_select``'s columns) is a ledgered row of its batch."""
        got = self._checked(str(row[0]))
        return got is not None and tuple(row) in got[0]

    def has_id(self, row: Any) -> bool:
        """Whether ROW (``bindings.ID_COLUMNS``) is a ledgered row of its batch."""
        got = self._checked(str(row[0]))
        return got is not None and tuple(row) in got[1]


Counts = dict[str, list[tuple[tuple[str, str, int, int, str], int]]]


def ledgered_counts(
    db: Database, refs: Iterable[str]
) -> tuple[Counts, list[str], list[Difference]]:
    """The per-process counts of the stored batches REFS as their ledger entries commit to
    them, without reading a binding row: each batch's stored digests and counts recompute
    its entry's subject (one ledger probe and one ``binding_batches`` row per batch). A batch
    stored before counts were ledgered (no counts) is hashed whole instead, O(its rows), and
    counted from its rows. Returns (ref -> [((target, boot, pid, start, manifest), count)],
    the refs hashed whole, differences): a
    batch whose entry its stored values do not recompute, a ledgered batch whose row is gone,
    a batch row with no ledger entry."""
    refs = sorted(set(refs))
    want = _subjects(db, "bindings", refs)
    out: Counts = {}
    whole: list[str] = []
    bad: list[Difference] = []
    for ref in refs:
        head = db.execute(
            f"SELECT target, received_unix, {bindings.batch_columns(db)} FROM binding_batches "  # noqa: S608
            "WHERE ref = ?",
            (ref,),
        ).fetchone()
        ledgered = want.get(ref)
        if head is None:
            if ledgered is not None:
                bad.append(Difference("binding_batches", ref, "row", None, "a ledgered batch"))
            continue
        target, received, s_sha, i_sha, counts = head
        if counts is None:  # stored before counts were ledgered: its rows are the evidence
            whole.append(ref)
            if ledgered is None or ledgered != batch_subject(db, ref):
                bad.append(
                    Difference("bindings", ref, "ledger entry", "changed or unledgered", None)
                )
                continue
            rows = db.execute(
                f"SELECT {bindings.span_select(db)} FROM bindings WHERE batch = ? "  # noqa: S608
                "ORDER BY rowid",
                (ref,),
            ).fetchall()
            counts = bindings.counts_json(rows)
        elif ledgered != chain.bindings_subject(
            ref, str(target), float(received), str(s_sha), str(i_sha), str(counts)
        ):
            bad.append(Difference("bindings", ref, "ledger entry", "changed or unledgered", None))
            continue
        try:
            out[ref] = [((str(target), *k), n) for k, n in bindings.parse_counts(str(counts))]
        except (ValueError, TypeError):  # ledgered so, yet no counts: never written by us
            bad.append(Difference("binding_batches", ref, "counts_json", counts, None))
    return out, whole, bad


def require(differences: Sequence[Difference], what: str) -> None:
    """Raise :class:`IndexDisagrees` naming the first differences, if any."""
    if not differences:
        return
    shown = "; ".join(str(d) for d in differences[:3])
    more = f" (and {len(differences) - 3} more)" if len(differences) > 3 else ""
    raise IndexDisagrees(
        f"{what}: the index tables disagree with the ledgered content: {shown}{more}; "
        "`verifier audit verify --db` lists every difference"
    )
