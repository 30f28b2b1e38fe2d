"""Request bindings in the store: which steps served which request, under which manifest,
runner and hook counts (``bindings``), and the API server's external ids for the engine's
internal ids (``request_ids``). They arrive with a report and are stored apart from it, as one
batch per report (``binding_batches``) with one ledger entry (kind ``bindings``) whose subject
covers every row of the batch in order; a retransmitted report is stored once, its batch too.
Since per-process counts were ledgered, the subject also covers the batch's requests counted
per process and manifest (:func:`counts_json`), stored beside the rows' digests in
``binding_batches``: a quick audit checks a count against its batch's ledger entry without
reading the rows (``servewitness.ledger.index_check``). A batch stored before has NULL there.

Rows are plain columns (no JSON to decode on the query path) and indexed by internal id,
external id, client id and manifest digest, so a lookup stays milliseconds at millions of rows.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from servewitness.ledger.interface import Database
from servewitness.model import RequestId, RequestSpan, RequestSpec

# The client's id inside an external id, kept beside each id row: derived by the wire, so that
# the agent bounds a long id the way a query by the client's id finds it.
from servewitness.wire.fields import client_id as client_id  # noqa: PLC0414 - re-exported

SPAN_COLUMNS = (
    "batch, target, boot_id, pid, start_ticks, internal_id, first_step, last_step, steps, "
    "tokens, first_unix, last_unix, manifest_first, manifest_last, runner, hooks_json, finished, "
    "spec_json"
)
ID_COLUMNS = "batch, target, internal_id, external_id, client_id, at_unix"


def span_select(db: Database) -> str:
    """SPAN_COLUMNS for a SELECT: a database made before ``spec_json`` existed, opened read
    only (so not upgraded), reads NULL there."""
    if db.has_column("bindings", "spec_json"):
        return SPAN_COLUMNS
    return SPAN_COLUMNS.replace("spec_json", "NULL AS spec_json")


# Fixed column lists, no input: S608 does not apply.
INSERT_SPAN = f"INSERT INTO bindings ({SPAN_COLUMNS}) VALUES ({', '.join('?' * 18)})"  # noqa: S608
INSERT_ID = f"INSERT INTO request_ids ({ID_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)"  # noqa: S608


@functools.lru_cache(maxsize=4096)
def _name(name: str) -> str:
    return json.dumps(name)


def hooks_json(hooks: tuple[tuple[str, int], ...]) -> str:
    """``{"name":fires,...}`` in name order (what ``json.dumps(..., sort_keys=True)`` with
    compact separators writes), without a JSON encoder call per row."""
    return "{" + ",".join(f"{_name(k)}:{int(v)}" for k, v in sorted(hooks)) + "}"


def spec_json(s: RequestSpec | None) -> str | None:
    """A request's speculative decoding as stored (None: off, or not recorded)."""
    if s is None:
        return None
    return (
        f'{{"accepted":{int(s.accepted_tokens)},"drafts":{int(s.drafts)},'
        f'"draft_tokens":{int(s.draft_tokens)},"emitted":{int(s.emitted_tokens)},'
        f'"pos":[{",".join(str(int(p)) for p in s.accepted_per_position)}]}}'
    )


def span_row(batch: str, target: str, b: RequestSpan) -> tuple[Any, ...]:
    hooks = hooks_json(b.hooks)
    return (
        batch, target, b.process.boot_id, b.process.pid, b.process.start_ticks, b.internal_id,
        b.first_step, b.last_step, b.steps, b.tokens, real(b.first_unix), real(b.last_unix),
        b.manifest_first, b.manifest_last, b.runner, hooks, int(b.finished), spec_json(b.spec),
    )  # fmt: skip


def id_row(batch: str, target: str, r: RequestId) -> tuple[Any, ...]:
    return (batch, target, r.internal_id, r.external_id, client_id(r.external_id), real(r.unix))


def real(value: float) -> float:
    """VALUE as a database column of floats gives it back: SQLite stores a REAL -0.0 as the
    integer 0 and reads 0.0, so a row digested with -0.0 would read back as another row (an
    acknowledged batch then looks edited to ``chain.verify`` and ``audit request``). Every
    float a binding row holds goes through here, whichever path made the row."""
    return float(value) + 0.0  # -0.0 + 0.0 is 0.0; every other float is itself


@dataclass(frozen=True, slots=True)
class Tails:
    """A report's bindings as the rows ``write_batch`` inserts, but for their first two
    columns (the batch's ref and target, known once the report is): ``span_row(...)[2:]``
    and ``id_row(...)[2:]``."""

    spans: list[tuple[Any, ...]]
    ids: list[tuple[Any, ...]]


NO_TAILS = Tails([], [])


def tails_of(spans: Sequence[RequestSpan], ids: Sequence[RequestId]) -> Tails:
    """SPANS' and IDS' rows (converted objects: a caller that holds them)."""
    return Tails([span_row("", "", b)[2:] for b in spans], [id_row("", "", r)[2:] for r in ids])


@dataclass(frozen=True, slots=True)
class PreparedBatch:
    """One report's bindings as the rows ``write_batch`` inserts, with their digests and
    counts: built before the transaction (nothing here needs the database), so that the
    write lock is held for the inserts alone."""

    ref: str
    target: str
    received: float
    span_rows: list[tuple[Any, ...]]
    id_rows: list[tuple[Any, ...]]
    digests: tuple[str, str, str]  # spans_sha256, ids_sha256, counts_json


def prepare_batch(
    batch: str,
    target: str,
    spans: Sequence[RequestSpan],
    ids: Sequence[RequestId],
    received: float,
) -> PreparedBatch:
    """Batch BATCH of TARGET's SPANS and IDS received at RECEIVED, as rows and digests."""
    return prepare_tails(batch, target, tails_of(spans, ids), received)


def prepare_tails(batch: str, target: str, tails: Tails, received: float) -> PreparedBatch:
    """``prepare_batch`` of bindings already made rows (``Tails``)."""
    head = (batch, target)
    span_rows = [head + t for t in tails.spans]
    id_rows = [head + t for t in tails.ids]
    digests = (rows_sha256(span_rows), rows_sha256(id_rows), counts_json(span_rows))
    return PreparedBatch(batch, target, received, span_rows, id_rows, digests)


def write_batch(db: Database, p: PreparedBatch) -> tuple[str, str, str | None]:
    """Insert P (inside the caller's transaction); the digests of its span and id rows and its
    per-process counts, for the ledger subject. The index of requests served per process
    (``servewitness.server.index``) is the caller's."""
    db.execute(
        "INSERT INTO binding_batches (ref, target, received_unix, spans, ids, spans_sha256, "
        "ids_sha256, counts_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (p.ref, p.target, p.received, len(p.span_rows), len(p.id_rows), *p.digests),
    )
    if p.span_rows:
        db.executemany(INSERT_SPAN, p.span_rows)
    if p.id_rows:
        db.executemany(INSERT_ID, p.id_rows)
    return p.digests


# The columns of a span row a count is keyed by: boot_id, pid, start_ticks, manifest_first.
_COUNT_KEY = (2, 3, 4, 12)


def counts_json(span_rows: Iterable[Sequence[Any]]) -> str:
    """A batch's requests counted per process and manifest of their first step (what
    ``servewitness.server.index.write_request_counts`` adds to ``processes.requests``), as
    compact JSON ``[[boot_id, pid, start_ticks, manifest, count], ...]`` in key order: what
    the ledger subject of a batch covers beside its rows' digests."""
    counts: dict[tuple[str, int, int, str], int] = {}
    for r in span_rows:
        k = (str(r[2]), int(r[3]), int(r[4]), str(r[12]))
        counts[k] = counts.get(k, 0) + 1
    return _ROWS_JSON([[*k, n] for k, n in sorted(counts.items())])


def parse_counts(text: str) -> list[tuple[tuple[str, int, int, str], int]]:
    """:func:`counts_json`'s text read back (ValueError: not that shape)."""
    out = []
    for item in json.loads(text):
        boot, pid, ticks, manifest, n = item
        out.append(((str(boot), int(pid), int(ticks), str(manifest)), int(n)))
    return out


def has_counts(db: Database) -> bool:
    """Whether ``binding_batches`` has the columns of ledgered counts (a database made before
    them, opened read only, does not)."""
    return db.has_column("binding_batches", "counts_json")


def batch_columns(db: Database) -> str:
    """The stored digests and counts of a batch for a SELECT (NULLs where not stored)."""
    if has_counts(db):
        return "spans_sha256, ids_sha256, counts_json"
    return "NULL, NULL, NULL"


def _canonical(row: Sequence[Any]) -> Sequence[Any]:
    """ROW without its trailing NULLs: a column added later (``spec_json``) is NULL in rows
    stored before it existed, and leaving NULLs out keeps their digests what they were. A
    slice, not a list (JSON writes a tuple as the same array; one copy, made in C)."""
    n = len(row)
    while n and row[n - 1] is None:
        n -= 1
    return row[:n]


# one encoder for every batch (json.dumps with options builds a JSONEncoder per call); the
# bytes are json.dumps(..., separators=(",", ":"))'s
_ROWS_JSON = json.JSONEncoder(separators=(",", ":")).encode


def rows_bytes(rows: Iterable[Sequence[Any]]) -> bytes:
    """The canonical bytes of rows in order: one compact JSON array of arrays (a row's
    trailing NULL columns left out)."""
    return _ROWS_JSON([_canonical(r) for r in rows]).encode()


def rows_sha256(rows: Iterable[Sequence[Any]]) -> str:
    """The digest of rows in order (of :func:`rows_bytes`)."""
    return hashlib.sha256(rows_bytes(rows)).hexdigest()


StoredBatch = tuple[str, str, float, str, str, str | None]


def stored_batches(db: Database) -> Iterator[StoredBatch]:
    """(ref, target, received, digest of its span rows, digest of its id rows, its counts)
    of every stored batch, rows in storage order (one batch's rows are consecutive: a batch
    is written in one transaction, one writer at a time). The counts are None for a batch
    stored before counts were ledgered, and the rows' own when the stored digests and counts
    agree with them; when they do not, a text that is no count (its subject then matches no
    entry). Streams the rows, holding one batch's rows at a time and three digests per batch.
    Rows of no stored batch (inserted behind the ledger's back) come last, with an empty
    target."""
    span_sql = f"SELECT {span_select(db)} FROM bindings ORDER BY rowid"  # noqa: S608
    id_sql = f"SELECT {ID_COLUMNS} FROM request_ids ORDER BY rowid"  # noqa: S608
    spans = {b: (d, c) for b, d, c in _digests(db, span_sql)}
    ids = {b: d for b, d, _ in _digests(db, id_sql)}
    empty = rows_sha256(())
    none = (empty, "[]")
    for ref, target, received, s_sha, i_sha, counts in list(
        db.execute(
            f"SELECT ref, target, received_unix, {batch_columns(db)} FROM binding_batches "  # noqa: S608
            "ORDER BY rowid"
        )
    ):
        s_rows, s_counts = spans.pop(ref, none)
        i_rows = ids.pop(ref, empty)
        if counts is not None and (s_sha, i_sha, counts) != (s_rows, i_rows, s_counts):
            s_counts = "the batch's stored digests or counts are not its rows'"
        yield ref, target, float(received), s_rows, i_rows, None if counts is None else s_counts
    for ref in sorted({*spans, *ids}):
        yield ref, "", 0.0, spans.get(ref, none)[0], ids.get(ref, empty), None


def _digests(db: Database, sql: str) -> Iterator[tuple[str, str, str]]:
    """(batch, digest of its rows, their counts) for consecutive runs of rows of one batch.
    A batch whose rows are not consecutive (reordered behind the ledger's back) yields twice;
    the later digest wins and does not match. Counts are :func:`counts_json`'s for span rows
    (meaningless for id rows)."""
    current: str | None = None
    rows: list[Any] = []
    for raw in db.execute(sql):
        if raw[0] != current:
            if current is not None:
                yield current, rows_sha256(rows), _counts_of(rows)
            current, rows = raw[0], []
        rows.append(raw)
    if current is not None:
        yield current, rows_sha256(rows), _counts_of(rows)


def _counts_of(rows: Sequence[Sequence[Any]]) -> str:
    return counts_json(rows) if rows and len(rows[0]) > 12 else "[]"
