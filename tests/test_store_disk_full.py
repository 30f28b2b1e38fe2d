"""The store recovers from a full disk on its own: after a transaction fails on a storage
error, the next one starts on a fresh connection. SQLite's pager stays in its error state
until every read on the connection ends, and a statement left open (a cursor not read to
its end) kept it there: the verifier went on refusing every report as "database or disk is
full" long after space was freed (tests/test_faults.py's disk-full test, in loaded runs)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from servewitness import wire
from servewitness.ledger import keys
from servewitness.model import TargetReport
from servewitness.server.index import processes_seen
from servewitness.server.store import Store, StoredReport
from tests.test_faults import fill, small_disk
from tests.test_policy_engine import api, engine, worker

M = "sha256:" + "3" * 64
PROCS = tuple(replace(p, manifest_digest=M) for p in (api(), engine(), worker()))


def save(store: Store, seq: int) -> None:
    t = time.time()
    body = wire.report_to_bytes(TargetReport("a", "t", seq, "", t, PROCS)) + bytes(3000)
    manifests = {M: PROCS[2].files or ()} if seq == 1 else {}
    store.save_report(StoredReport("a", seq, "t", t, body), manifests, processes_seen(PROCS), [])


def test_a_store_that_hit_a_full_disk_stores_again_once_space_is_freed(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "4M") as disk:
        store = Store(disk / "db.sqlite3")
        try:
            key = keys.generate()
            for seq in range(1, 21):
                save(store, seq)
                if seq == 10:
                    assert store.sign_checkpoint(key) is not None
            filler = disk / "filler"
            fill(filler)
            refused = 0
            for _ in range(3):
                try:
                    save(store, 21)
                except store.errors as e:
                    assert "full" in str(e)
                    refused += 1
                try:
                    store.sign_checkpoint(key)  # entries 11..20 are not signed yet
                except store.errors as e:
                    assert "full" in str(e)
                    refused += 1
            assert refused == 6
            filler.unlink()
            save(store, 21)  # space again: stored
            assert store.last_seq("a") == 21
            assert store.verify_ledger().ok
        finally:
            store.close()
