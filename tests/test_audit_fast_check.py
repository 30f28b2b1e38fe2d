"""The audit queries' index check at O(the answer), on SQLite and a real PostgreSQL (issue 21):
`audit request` hashes the batches its own rows came in and reads no binding row of the
target's other batches; the request counts of the target's processes are checked against the
stored bindings counted in their index. Each attack on a row outside the answer (edit a row,
delete one, forge one for another target, point a binding at another process, re-file a
binding under another batch) is still refused, and so is the coordinated edit of rows and
count (checked against the per-process counts each batch's ledger entry commits to; more
variations of it in tests/test_ledgered_counts.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import pytest

from servewitness import wire
from servewitness.ledger import index_check
from servewitness.ledger.queries import find_file, find_request
from servewitness.model import ProcessKey, RequestId, RequestSpan, TargetReport
from servewitness.server.db import open_database
from servewitness.server.index import processes_seen
from servewitness.server.store import Store, StoredReport
from tests.helpers import Backend, verifier_cli
from tests.test_bindings_store import M1, stocked
from tests.test_policy_engine import worker

SHA_A = "a" * 64  # the worker's first file
PER_BATCH = 6
OTHER = "cmpl-other2-0-0001"
API = ProcessKey("boot", 10, 100)  # a request of the second batch, not alpha's


class Counting:
    """A real database connection that counts the rows its statements on ``bindings``
    return (what a check reads of the binding rows)."""

    def __init__(self, target: str) -> None:
        self.db = open_database(target, read_only=True)
        self.kind = self.db.kind
        self.binding_rows = 0

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Iterator[Any] | Any:
        rows = self.db.execute(sql, args).fetchall()
        if "FROM bindings" in sql:
            self.binding_rows += len(rows)
        return _Rows(rows)

    def executemany(self, sql: str, rows: Any) -> None:
        raise AssertionError("a query writes nothing")

    def has_column(self, table: str, column: str) -> bool:
        return self.db.has_column(table, column)


class _Rows(list[Any]):
    def fetchone(self) -> Any:
        return self[0] if self else None

    def fetchall(self) -> list[Any]:
        return list(self)


def more_batches(target: str, batches: int) -> None:
    """BATCHES more reports of the stocked worker, each with PER_BATCH bindings."""
    w = replace(worker(), manifest_digest=M1, container_id="c" * 64)
    s = Store(target)
    try:
        for b in range(batches):
            seq, now = b + 2, time.time()
            body = wire.report_to_bytes(TargetReport("a", "serving", seq, "", now, (w,)))
            spans = [RequestSpan(w.key, f"cmpl-other{seq}-0-{i:04x}", 50 + i, 60 + i, 10, 20,
                                 now - 1, now, M1, M1, "x.Runner", (("h", 10),))
                     for i in range(PER_BATCH)]  # fmt: skip
            ids = [RequestId(API, sp.internal_id, sp.internal_id.rsplit("-", 1)[0], now - 1)
                   for sp in spans]  # fmt: skip
            assert s.save_report(StoredReport("a", seq, "serving", now, body), {},
                                 processes_seen((w,)), spans, ids)  # fmt: skip
    finally:
        s.close()


def refusals(target: str) -> dict[str, bool]:
    """Whether `audit request alpha` and `audit file SHA_A` refuse to answer."""
    out = {}
    db = open_database(target, read_only=True)
    try:
        for name, call in (("request", lambda: find_request(db, "alpha")),
                           ("file", lambda: find_file(db, SHA_A))):  # fmt: skip
            try:
                call()
                out[name] = False
            except index_check.IndexDisagrees:
                out[name] = True
    finally:
        db.close()
    return out


def test_a_request_reads_no_binding_row_of_other_batches(backend: Backend) -> None:
    """The binding rows `audit request` reads do not grow with the target's history: 1 batch
    or 8 batches before it, the same rows (its own batch, hashed whole)."""
    stocked(backend.target)
    read = []
    for extra in (0, 7):
        if extra:
            more_batches(backend.target, extra)
        db = Counting(backend.target)
        try:
            (got,) = find_request(db, "alpha")  # type: ignore[arg-type]
            assert got.role == "worker"
            read.append(db.binding_rows)
        finally:
            db.db.close()
    assert read[0] == read[1], read
    assert read[0] >= 2  # negative control: its own batch (two rows) was read, and hashed


ATTACKS = [
    # name, statements, refused by (request alpha, file SHA_A)
    ("edit a count outside the answer", ["UPDATE processes SET requests = requests + 1"],
     {"request": True, "file": True}),
    ("delete another request's binding", [("DELETE FROM bindings WHERE internal_id = ?",
                                           (OTHER,))], {"request": True, "file": True}),
    ("point a binding at another process", [("UPDATE bindings SET pid = 4242 WHERE "
                                             "internal_id = ?", (OTHER,))],
     {"request": True, "file": True}),
    ("forge a process row for another target", [(
        "INSERT INTO processes (target, boot_id, pid, start_ticks, manifest, role, rank, "
        "container_id, runner, first_unix, last_unix, reports, requests) VALUES "
        "('elsewhere', 'b', 7, 7, ?, 'worker', 0, NULL, NULL, 1.0, 1.0, 1, 0)", (M1,))],
     {"request": False, "file": True}),  # alpha's target is untouched; the file's is not
    ("delete the process row", ["DELETE FROM processes"], {"request": True, "file": True}),
]  # fmt: skip


@pytest.mark.parametrize(("name", "sql", "refused"), ATTACKS, ids=[a[0] for a in ATTACKS])
def test_attacks_outside_the_answer_are_refused(
    backend: Backend, name: str, sql: list[Any], refused: dict[str, bool]
) -> None:
    stocked(backend.target)
    more_batches(backend.target, 2)
    assert refusals(backend.target) == {"request": False, "file": False}  # negative control
    backend.sql(*sql)
    assert refusals(backend.target) == refused


def test_a_binding_refiled_under_another_batch_is_refused(backend: Backend) -> None:
    """Unplanned variation: no count changes, only the batch a row claims: the request's own
    batches (those its rows and its ids name) are hashed, and both now differ."""
    stocked(backend.target)
    more_batches(backend.target, 1)
    backend.sql("UPDATE bindings SET batch = '[\"a\", 2]' WHERE internal_id = 'cmpl-alpha-0-1a2b'")
    assert refusals(backend.target)["request"]


def test_a_coordinated_edit_of_rows_and_count_is_refused(backend: Backend) -> None:
    """The edit the fast path once left to `audit verify` (docs/audit.md): delete another
    request's binding AND lower the process's count to match. The count now differs from the
    counts the batches' ledger entries commit to: `audit file` and `audit request` refuse
    (exit 1, naming the row and field), without re-hashing the batch; `audit verify` still
    names the batch."""
    stocked(backend.target)
    more_batches(backend.target, 1)
    told = verifier_cli("audit", "file", SHA_A, "--db", backend.target)  # negative control
    assert told.returncode == 0, told.stderr
    assert "served 8 request(s) (count checked against the ledger)" in told.stdout, told.stdout
    assert "hashed whole" not in told.stdout  # every batch carries its ledgered counts
    backend.sql(("DELETE FROM bindings WHERE internal_id = ?", (OTHER,)),
                "UPDATE processes SET requests = requests - 1")  # fmt: skip
    assert refusals(backend.target) == {"request": True, "file": True}
    for args in (("file", SHA_A), ("request", "alpha")):
        told = verifier_cli("audit", *args, "--db", backend.target)
        assert told.returncode == 1, (args, told.stdout, told.stderr)
        assert "index tables disagree with the ledgered content" in told.stderr, told.stderr
        assert "requests is 7, the ledgered content says 8" in told.stderr, told.stderr
        assert told.stdout == ""  # nothing answered
    out = verifier_cli("audit", "verify", "--db", backend.target)
    said = out.stdout + out.stderr
    assert out.returncode == 1 and 'bindings ["a", 2]' in said and "changed" in said, said
    db = open_database(backend.target, read_only=True)
    try:
        with pytest.raises(index_check.IndexDisagrees, match="bindings"):
            find_request(db, "cmpl-other2-0-0002")
    finally:
        db.close()
