"""Per-process request counts in each batch's ledger subject, attacked for real on SQLite and
a real PostgreSQL: variations of the coordinated edit of binding rows and
``processes.requests`` that `audit file` and `audit request` check against what the ledger
committed to, the one variation they leave to `audit verify` (docs/threat-model.md), and
stores written before the counts were ledgered, which are checked by hashing their batches
whole and say so."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from servewitness.ledger import bindings, chain
from servewitness.model import ProcessKey, RequestId, RequestSpan
from servewitness.server.db import Database, open_database
from tests.helpers import Backend, verifier_cli
from tests.test_audit_fast_check import OTHER, SHA_A, more_batches, refusals
from tests.test_bindings_store import stocked
from tests.test_export import keys

BATCH2 = json.dumps(["a", 2])


def _old_write_batch(db: Database, p: bindings.PreparedBatch) -> tuple[str, str, None]:
    """What the verifier wrote before counts were ledgered: the batch row without digests or
    counts, and (through the store) the subject over the rows' digests alone."""
    db.execute(
        "INSERT INTO binding_batches (ref, target, received_unix, spans, ids) "
        "VALUES (?, ?, ?, ?, ?)",
        (p.ref, p.target, p.received, len(p.span_rows), len(p.id_rows)),
    )
    if p.span_rows:
        db.executemany(bindings.INSERT_SPAN, p.span_rows)
    if p.id_rows:
        db.executemany(bindings.INSERT_ID, p.id_rows)
    return bindings.rows_sha256(p.span_rows), bindings.rows_sha256(p.id_rows), None


@pytest.fixture
def old_writer(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(bindings, "write_batch", _old_write_batch)
    yield


def _stored_counts(backend: Backend, ref: str) -> tuple[str, str]:
    """(spans digest, counts) the batch REF's remaining rows recompute to: what an attacker
    who knows the new columns writes after editing the rows."""
    db = open_database(backend.target, read_only=True)
    try:
        rows = db.execute(
            f"SELECT {bindings.SPAN_COLUMNS} FROM bindings WHERE batch = ? ORDER BY rowid",  # noqa: S608
            (ref,),
        ).fetchall()
    finally:
        db.close()
    return bindings.rows_sha256(rows), bindings.counts_json(rows)


def _cli_refuses(backend: Backend, field: str) -> None:
    for args in (("file", SHA_A), ("request", "alpha")):
        told = verifier_cli("audit", *args, "--db", backend.target)
        assert told.returncode == 1, (args, told.stdout, told.stderr)
        assert field in told.stderr, told.stderr


def test_the_batch_row_edited_to_match_is_refused(backend: Backend) -> None:
    """Variation: the attacker also rewrites the batch's stored digest and counts to what the
    remaining rows say. They no longer recompute the batch's ledger entry."""
    stocked(backend.target)
    more_batches(backend.target, 1)
    assert refusals(backend.target) == {"request": False, "file": False}  # negative control
    backend.sql(("DELETE FROM bindings WHERE internal_id = ?", (OTHER,)),
                "UPDATE processes SET requests = requests - 1")  # fmt: skip
    spans_sha, counts = _stored_counts(backend, BATCH2)
    backend.sql((
        "UPDATE binding_batches SET spans_sha256 = ?, counts_json = ?, spans = spans - 1 "
        "WHERE ref = ?", (spans_sha, counts, BATCH2)))  # fmt: skip
    assert refusals(backend.target) == {"request": True, "file": True}
    _cli_refuses(backend, f"bindings {BATCH2}: changed after it was ledgered")


def test_counts_nulled_to_look_old_are_hashed_and_refused(backend: Backend) -> None:
    """Variation: the counts set NULL so the batch looks written before them: it is then
    hashed whole, and its rows (one deleted) do not recompute its entry."""
    stocked(backend.target)
    more_batches(backend.target, 1)
    assert refusals(backend.target) == {"request": False, "file": False}  # negative control
    null = "UPDATE binding_batches SET counts_json = NULL WHERE ref = ?"
    backend.sql(("DELETE FROM bindings WHERE internal_id = ?", (OTHER,)),
                "UPDATE processes SET requests = requests - 1", (null, (BATCH2,)))  # fmt: skip
    assert refusals(backend.target) == {"request": True, "file": True}
    _cli_refuses(backend, f"bindings {BATCH2}: changed after it was ledgered")


def test_a_whole_batch_deleted_with_its_counts_is_refused(backend: Backend) -> None:
    """Variation: the batch's row, its bindings and ids all deleted, the count lowered by its
    six requests. Its report is still stored and its ledger entry is still there."""
    stocked(backend.target)
    more_batches(backend.target, 1)
    assert refusals(backend.target) == {"request": False, "file": False}  # negative control
    backend.sql(("DELETE FROM bindings WHERE batch = ?", (BATCH2,)),
                ("DELETE FROM request_ids WHERE batch = ?", (BATCH2,)),
                ("DELETE FROM binding_batches WHERE ref = ?", (BATCH2,)),
                "UPDATE processes SET requests = requests - 6")  # fmt: skip
    assert refusals(backend.target) == {"request": True, "file": True}
    _cli_refuses(backend, f"binding_batches {BATCH2}: missing")


def test_a_report_deleted_with_its_batch_is_left_to_audit_verify(backend: Backend) -> None:
    """The documented limit (docs/threat-model.md): delete a middle report AND its batch, and
    lower the process's report and request counts to match. The quick audit checks the
    reports and batches it finds against their entries, but does not enumerate the ledger
    for entries whose content is gone (that is O(ledger)): `audit file` answers; `audit
    verify` names the missing report."""
    stocked(backend.target)
    more_batches(backend.target, 2)
    assert refusals(backend.target) == {"request": False, "file": False}
    backend.sql(("DELETE FROM reports WHERE agent_id = 'a' AND seq = 2", ()),
                ("DELETE FROM bindings WHERE batch = ?", (BATCH2,)),
                ("DELETE FROM request_ids WHERE batch = ?", (BATCH2,)),
                ("DELETE FROM binding_batches WHERE ref = ?", (BATCH2,)),
                "UPDATE processes SET requests = requests - 6, reports = reports - 1")  # fmt: skip
    assert refusals(backend.target) == {"request": False, "file": False}
    out = verifier_cli("audit", "verify", "--db", backend.target)
    said = out.stdout + out.stderr
    assert out.returncode == 1 and "the report it records is gone" in said, said


def _drop_count_columns(backend: Backend) -> None:
    """A database made before the columns existed (the audit opens it read only: no
    migration)."""
    backend.sql(*(f"ALTER TABLE binding_batches DROP COLUMN {c}"
                  for c in ("spans_sha256", "ids_sha256", "counts_json")))  # fmt: skip


@pytest.mark.usefixtures("old_writer")
def test_an_old_store_is_checked_by_hashing_its_batches_and_says_so(backend: Backend) -> None:
    """A store written before counts were ledgered audits: the chain verifies, `audit file`
    answers after hashing its two batches whole and says so, and the coordinated edit is
    refused there too (never a silent PASS)."""
    stocked(backend.target)
    more_batches(backend.target, 1)
    _drop_count_columns(backend)
    assert backend.check().ok
    told = verifier_cli("audit", "file", SHA_A, "--db", backend.target)
    assert told.returncode == 0, told.stderr
    assert "note: 2 batch(es) of bindings were stored before" in told.stdout, told.stdout
    told = verifier_cli("audit", "request", "alpha", "--db", backend.target, "--json")
    assert told.returncode == 0, told.stderr
    assert "note: 2 batch(es)" in told.stderr and json.loads(told.stdout), told.stderr
    backend.sql(("DELETE FROM bindings WHERE internal_id = ?", (OTHER,)),
                "UPDATE processes SET requests = requests - 1")  # fmt: skip
    assert refusals(backend.target) == {"request": True, "file": True}
    _cli_refuses(backend, f"bindings {BATCH2}: changed after it was ledgered")


def test_a_migrated_store_ledgers_counts_for_new_batches_only(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Old batches, then the verifier upgraded (the columns added, NULL in the old rows),
    then new batches: the full chain walk accepts both kinds, and the quick audit hashes
    only the old batch whole."""
    with monkeypatch.context() as m:
        m.setattr(bindings, "write_batch", _old_write_batch)
        stocked(backend.target)
    _drop_count_columns(backend)
    more_batches(backend.target, 2)  # the new Store adds the columns back, NULL in batch 1
    assert backend.check().ok
    told = verifier_cli("audit", "file", SHA_A, "--db", backend.target)
    assert told.returncode == 0, told.stderr
    assert "served 14 request(s)" in told.stdout, told.stdout
    assert "note: 1 batch(es) of bindings were stored before" in told.stdout, told.stdout


def test_old_and_new_subjects_differ_so_a_batch_cannot_be_downgraded() -> None:
    """The subject with counts is not the subject without them for the same rows: a batch
    ledgered with counts whose counts are removed matches no entry."""
    key = ProcessKey("boot", 10, 100)
    span = RequestSpan(key, "cmpl-x-0", 1, 2, 1, 1, 0.0, 1.0, "m", "m", "r", (("h", 1),))
    rows = [bindings.span_row("b", "t", span)]
    ids = [bindings.id_row("b", "t", RequestId(key, "cmpl-x-0", "cmpl-x", 0.0))]
    args = ("b", "t", 1.0, bindings.rows_sha256(rows), bindings.rows_sha256(ids))
    with_counts = chain.bindings_subject(*args, bindings.counts_json(rows))
    assert chain.bindings_subject(*args) != with_counts
    assert bindings.counts_json(rows) == '[["boot",10,100,"m",1]]'


def test_an_exported_batch_carries_its_counts_and_they_are_checked_offline(
    backend: Backend, tmp_path: Path
) -> None:
    """A bundle's batch carries ``counts_json`` (what its subject covers); offline, counts
    that are not its rows' (edited), or left out (a downgrade to the older subject), do not
    verify (exit 7)."""
    stocked(backend.target)
    key, pub = keys(tmp_path)
    bundle = tmp_path / "audit.json"
    out = verifier_cli("audit", "export", "--db", backend.target, "--key", str(key),
                       "--out", str(bundle), "--request", "alpha")  # fmt: skip
    assert out.returncode == 0, out.stderr
    out = verifier_cli("audit", "verify", str(bundle), "--key", str(pub))
    assert out.returncode == 0, out.stdout + out.stderr  # negative control
    data = json.loads(bundle.read_text())
    (fields,) = [c["fields"] for c in data["contents"] if c["kind"] == "bindings"]
    assert fields["counts_json"].endswith(",2]]"), fields["counts_json"]  # alpha and beta
    for name in ("edited", "left out"):
        tampered = json.loads(bundle.read_text())
        for c in tampered["contents"]:
            if c["kind"] == "bindings" and name == "edited":
                c["fields"]["counts_json"] = c["fields"]["counts_json"][:-3] + "3]]"
            elif c["kind"] == "bindings":
                del c["fields"]["counts_json"]
        path = tmp_path / "tampered.json"
        path.write_text(json.dumps(tampered))
        out = verifier_cli("audit", "verify", str(path), "--key", str(pub))
        assert out.returncode == 7, (name, out.stdout + out.stderr)
