"""Windows and seals in the store, on SQLite and a real PostgreSQL: each is a ledger entry
whose subject the ledger walk recomputes from its row, a window is sealed once, and the
seal's inclusion proofs verify against the signed checkpoint that covers it. An edited window
or seal row is caught by the walk on both backends (the live tests run SQLite only)."""

from __future__ import annotations

import json

import pytest

from servewitness.ledger import chain, keys, merkle, note
from servewitness.server import window_rows
from servewitness.server.store import Store
from tests.helpers import Backend


def test_window_and_seal_are_ledgered_proven_and_edits_are_caught(backend: Backend) -> None:
    key = keys.generate()
    store = Store(backend.target)
    try:
        entry, text = store.record_window("w1", "run-a", 1_700_000_000.0, {"id": "w1", "n": 1})
        assert json.loads(text)["ledger_size_at_open"] == entry.seq - 1
        seal = store.record_seal("w1", "run-a", 1_700_000_060.0, chain.canonical({"held": True}))
        with pytest.raises(window_rows.AlreadySealed):
            store.record_seal("w1", "run-a", 1_700_000_061.0, chain.canonical({"held": False}))
        assert store.seal_proofs(key, entry.seq, seal.seq) is None  # no checkpoint covers it yet
        store.sign_checkpoint(key)
        proofs = store.seal_proofs(key, entry.seq, seal.seq)
        stored = store.get_window("w1")
    finally:
        store.close()
    assert proofs is not None and stored is not None and stored.sealed
    signed = note.verify(proofs.note, key.public_key())
    assert signed.size == proofs.size >= seal.seq
    for e, proof in ((entry, proofs.open_proof), (seal, proofs.seal_proof)):
        assert merkle.verify_inclusion(e.leaf, e.seq - 1, signed.size, proof, signed.root)
    assert backend.check().ok

    backend.sql(("UPDATE seals SET content_json = ? WHERE window_id = ?",
                 (chain.canonical({"held": False}), "w1")))  # fmt: skip
    assert not backend.check().ok
