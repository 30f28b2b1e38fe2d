"""Windows and seals in the store, on SQLite and a real PostgreSQL: each is a ledger entry
whose subject the ledger walk recomputes from its row, a window is sealed once, and the
seal's inclusion proofs verify against the signed checkpoint that covers it. An edited window
or seal row is caught by the walk on both backends (the live tests run SQLite only)."""

from __future__ import annotations

import json
from typing import Any

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
        seal, _ = store.record_seal("w1", "run-a", 1_700_000_060.0, {"held": True})
        with pytest.raises(window_rows.AlreadySealed):
            store.record_seal("w1", "run-a", 1_700_000_061.0, {"held": False})
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


def _window(store: Store, wid: str, run: str, held: bool | None) -> dict[str, Any]:
    """Window WID on RUN, sealed with HELD (None: left open); the seal's other_windows."""
    store.record_window(wid, run, 1_700_000_000.0, {"id": wid})
    if held is None:
        return {}
    _, text = store.record_seal(wid, run, 1_700_000_060.0, {"held": held})
    counts: dict[str, Any] = json.loads(text)["other_windows"]
    return counts


def test_a_seal_counts_every_other_window_of_the_ledger_and_of_its_run(backend: Backend) -> None:
    """The lab that seals several windows and shows the best: every seal counts the windows
    before it, on its run and on the whole ledger (another run per attempt is no hiding
    place), by outcome, in the content its ledger entry covers."""
    store = Store(backend.target)
    try:
        first = _window(store, "a1", "run-a", False)
        _window(store, "a2", "run-a", None)  # opened, never sealed
        _window(store, "b1", "run-b", True)
        store.record_window("a3", "run-a", 1_700_000_000.0, {"id": "a3"})  # open meanwhile
        last = _window(store, "a4", "run-a", True)
        _, late = store.record_seal("a3", "run-a", 1_700_000_090.0, {"held": False})
    finally:
        store.close()
    zero = dict.fromkeys(("opened", "held", "not_held", "not_sealed", "unreadable"), 0)
    assert first == {"ledger_size": 1, "ledger": zero, "run": zero}
    assert last["ledger"] == {**zero, "opened": 4, "held": 1, "not_held": 1, "not_sealed": 2}
    assert last["run"] == {**zero, "opened": 3, "not_held": 1, "not_sealed": 2}
    # a3, sealed after a4: a4 counts as held, a3 itself is not counted.
    others = json.loads(late)["other_windows"]
    assert others["run"] == {**zero, "opened": 3, "held": 1, "not_held": 1, "not_sealed": 1}
    assert backend.check().ok


def test_windows_whose_rows_were_removed_or_edited_count_as_unreadable(backend: Backend) -> None:
    """A database writer hides a failed attempt: the window's row deleted, or its seal's
    row. The ledger entries stay, so the next seal still counts it, as unreadable (and
    `audit verify` names the edit)."""
    store = Store(backend.target)
    try:
        _window(store, "a1", "run-a", False)
        _window(store, "a2", "run-a", False)
        backend.sql(("DELETE FROM windows WHERE id = ?", ("a1",)))
        backend.sql(("DELETE FROM seals WHERE window_id = ?", ("a2",)))
        counts = _window(store, "a3", "run-a", True)
    finally:
        store.close()
    assert counts["ledger"] == {"opened": 2, "held": 0, "not_held": 0, "not_sealed": 0,
                                "unreadable": 2}  # fmt: skip
    assert counts["run"]["opened"] == 1  # a1's run is gone with its row: the ledger's count
    assert not backend.check().ok


def test_the_held_column_a_count_reads_is_checked_against_the_ledgered_seal(
    backend: Backend,
) -> None:
    """A later seal reads whether each seal held from the seals' ``held`` column, not from
    every seal's content. A database writer who flips it (a broken attempt made to count as
    held) is named by the ledger walk; a seal stored before the column (NULL) is read from
    its content, and counted the same."""
    store = Store(backend.target)
    try:
        _window(store, "a1", "run-a", False)
        _window(store, "a2", "run-a", True)
        backend.sql("UPDATE seals SET held = NULL")  # as stored by an older verifier
        assert backend.check().ok
        before = _window(store, "a3", "run-a", True)
        backend.sql(("UPDATE seals SET held = 1 WHERE window_id = ?", ("a1",)))
        check = backend.check()
        after = _window(store, "a4", "run-a", True)
    finally:
        store.close()
    assert before["run"] == {"opened": 2, "held": 1, "not_held": 1, "not_sealed": 0,
                             "unreadable": 0}  # fmt: skip
    assert not check.ok and "seal a1): the stored seal was changed" in str(check.problem), check
    assert after["run"]["held"] == 3  # the lie the walk names: a1 now counts as held
