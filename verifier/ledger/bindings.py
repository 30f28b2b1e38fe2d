"""Request bindings in the store: which steps served which request, under which manifest,
runner and hook counts (``bindings``), and the API server's external ids for the engine's
internal ids (``request_ids``). They arrive with a report and are stored apart from it, as one
batch per report (``binding_batches``) with one ledger entry (kind ``bindings``) whose subject
covers every row of the batch in order; a retransmitted report is stored once, its batch too.

Rows are plain columns (no JSON to decode on the query path) and indexed by internal id,
external id, client id and manifest digest, so a lookup stays milliseconds at millions of rows.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from verifier.ledger.interface import Database
from verifier.model import RequestId, RequestSpan, RequestSpec

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

# The OpenAI server's id prefixes (vllm/entrypoints/**/serving.py): "<prefix>-<base id>", the
# base id being the client's X-Request-Id header when it sent one. Completions add
# "-<prompt index>" for the engine.
_PREFIXES = ("chatcmpl-", "cmpl-", "generate-tokens-", "tokenize-", "embd-", "pool-")
_COMPLETION = re.compile(r"cmpl-(.+)-\d+")


def client_id(external: str) -> str:
    """The client's own id inside an external id (``cmpl-abc-0`` -> ``abc``); the external
    id itself when it has no known prefix."""
    m = _COMPLETION.fullmatch(external)
    if m:
        return m.group(1)
    for prefix in _PREFIXES:
        if external.startswith(prefix) and len(external) > len(prefix):
            return external[len(prefix) :]
    return external


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
        b.first_step, b.last_step, b.steps, b.tokens, float(b.first_unix), float(b.last_unix),
        b.manifest_first, b.manifest_last, b.runner, hooks, int(b.finished), spec_json(b.spec),
    )  # fmt: skip


def id_row(batch: str, target: str, r: RequestId) -> tuple[Any, ...]:
    return (batch, target, r.internal_id, r.external_id, client_id(r.external_id), float(r.unix))


def store_batch(  # noqa: PLR0917 - one call site, inside the store's transaction
    db: Database,
    batch: str,
    target: str,
    spans: Sequence[RequestSpan],
    ids: Sequence[RequestId],
    received: float,
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Insert one batch (inside the caller's transaction); its rows, for the ledger subject.
    The index of requests served per process (``verifier.server.index``) is the caller's."""
    span_rows = [span_row(batch, target, b) for b in spans]
    id_rows = [id_row(batch, target, r) for r in ids]
    db.execute(
        "INSERT INTO binding_batches (ref, target, received_unix, spans, ids) "
        "VALUES (?, ?, ?, ?, ?)",
        (batch, target, received, len(span_rows), len(id_rows)),
    )
    if span_rows:
        db.executemany(INSERT_SPAN, span_rows)
    if id_rows:
        db.executemany(INSERT_ID, id_rows)
    return span_rows, id_rows


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


def stored_batches(db: Database) -> Iterator[tuple[str, str, float, str, str]]:
    """(ref, target, received, digest of its span rows, digest of its id rows) of every stored
    batch, rows in storage order (one batch's rows are consecutive: a batch is written in one
    transaction, one writer at a time). Streams the rows, holding one batch's rows at a time
    and two digests per batch. Rows of no stored batch (inserted behind the ledger's back) come
    last, with an empty target."""
    spans = dict(_digests(db, f"SELECT {span_select(db)} FROM bindings ORDER BY rowid"))  # noqa: S608
    ids = dict(_digests(db, f"SELECT {ID_COLUMNS} FROM request_ids ORDER BY rowid"))  # noqa: S608
    empty = rows_sha256(())
    for ref, target, received in list(
        db.execute("SELECT ref, target, received_unix FROM binding_batches ORDER BY rowid")
    ):
        yield ref, target, float(received), spans.pop(ref, empty), ids.pop(ref, empty)
    for ref in sorted({*spans, *ids}):
        yield ref, "", 0.0, spans.get(ref, empty), ids.get(ref, empty)


def _digests(db: Database, sql: str) -> Iterator[tuple[str, str]]:
    """(batch, digest of its rows) for consecutive runs of rows of one batch. A batch whose
    rows are not consecutive (reordered behind the ledger's back) yields twice; the later
    digest wins and does not match."""
    current: str | None = None
    rows: list[Any] = []
    for raw in db.execute(sql):
        if raw[0] != current:
            if current is not None:
                yield current, rows_sha256(rows)
            current, rows = raw[0], []
        rows.append(raw)
    if current is not None:
        yield current, rows_sha256(rows)
