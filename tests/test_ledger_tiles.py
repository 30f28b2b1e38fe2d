"""The ledger's tree kept in tiles (``servewitness.ledger.tiles``) gives the roots and proofs
the whole tree gives, at every size, and names a tile rewritten behind it."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servewitness.ledger import keys, merkle
from servewitness.ledger.bundle import tree_from_db
from servewitness.ledger.checkpoints import NotAppendOnly
from servewitness.ledger.tiles import TileRewritten, Tiles
from servewitness.policy import policy_digest
from servewitness.server.db import open_database
from servewitness.server.store import Store
from tests.helpers import rechain
from tests.test_faults import policy


def leaves(n: int) -> list[bytes]:
    return [hashlib.sha256(str(i).encode()).digest() for i in range(n)]


def reader(
    data: list[bytes], reads: list[tuple[int, int]] | None = None
) -> Callable[[int, int], list[bytes]]:
    def read(start: int, end: int) -> list[bytes]:
        if reads is not None:
            reads.append((start, end))
        return data[start:end]

    return read


@given(
    n=st.integers(1, 1200),
    height=st.integers(0, 4),
    picks=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), max_size=6),
    grow=st.integers(0, 300),
)
@settings(max_examples=200, deadline=None)
def test_roots_and_proofs_equal_the_whole_trees_at_every_size(
    n: int, height: int, picks: list[tuple[int, int]], grow: int
) -> None:
    data = leaves(n + grow)
    tiles = Tiles(height)
    tiles.extend(data[:n])
    view = tiles.view(reader(data))
    tiles.extend(data[n:])  # the view keeps the size it was made at
    whole = merkle.Tree(data[:n])
    assert view.size == n
    assert view.root() == whole.root()
    for a, b in picks:
        size = 1 + a % n
        index, first = b % size, b % (size + 1)
        assert view.root(size) == whole.root(size)
        assert view.inclusion_proof(index, size) == whole.inclusion_proof(index, size)
        assert view.consistency_proof(first, size) == whole.consistency_proof(first, size)
        assert view.leaf_hash(index) == whole.leaf_hash(index)
    assert tiles.view(reader(data)).root() == merkle.Tree(data).root()


def test_a_proof_reads_at_most_the_tiles_it_reaches_into() -> None:
    """At 100,000 entries and tiles of 256, the root and a proof read two tiles, not the
    ledger; the tiles kept are 64 bytes per tile."""
    data = leaves(100_000)
    tiles = Tiles(8)
    tiles.extend(data)
    reads: list[tuple[int, int]] = []
    view = tiles.view(reader(data, reads))
    assert view.root(99_000) == merkle.Tree(data[:99_000]).root()
    view.inclusion_proof(12_345, 99_000)
    assert len(reads) <= 3 and all(e - s == 256 for s, e in reads), reads


def test_an_entry_rewritten_behind_the_tiles_is_named_not_proved() -> None:
    data = leaves(1000)
    tiles = Tiles(8)
    tiles.extend(data)
    edited = list(data)
    edited[300] = hashlib.sha256(b"rewritten").digest()  # entry seq 301, in tile 1
    view = tiles.view(reader(edited))
    with pytest.raises(TileRewritten, match=r"entries 257\.\.512"):
        view.inclusion_proof(300)
    # a proof that does not reach into that tile is over the tree as kept
    assert view.inclusion_proof(10) == merkle.Tree(data).inclusion_proof(10)
    assert view.root() == merkle.Tree(data).root()
    shorter = tiles.view(reader(data[:700]))  # entries deleted behind it
    with pytest.raises(TileRewritten):
        shorter.inclusion_proof(600)


# -- the verifier's kept tree over a real store -----------------------------------------------


def _store_with_entries(path: Path, n: int, key: Any) -> Store:
    """A real SQLite store whose ledger holds N entries (registered runs) and a signed
    checkpoint."""
    store = Store(path)
    text = policy(30.0)
    for i in range(n):
        store.register_run(f"r{i}", text, policy_digest(text), "p.toml")
    assert store.sign_checkpoint(key) is not None
    return store


def test_the_kept_tree_reads_only_what_was_appended_and_names_rewrites(tmp_path: Path) -> None:
    """After the first call builds the tree, a call reads the entries appended since and the
    newest entry it knew (one row), not the ledger; a proof over an entry whose stored hash
    was changed behind it is refused, and so is every call once the chain was rewritten (the
    newest entry changed); a new store (a restart) checks the whole ledger again."""
    key = keys.generate()
    store = _store_with_entries(tmp_path / "v.sqlite3", 600, key)
    try:
        whole = store.read(tree_from_db)
        assert store.audit_read(key, lambda db, t: t.root()) == whole.root()
        rows: list[int] = []
        db = store._db
        execute = db.execute

        def counting(sql: str, args: Any = ()) -> Any:
            got = list(execute(sql, args))
            if "FROM ledger" in sql:
                rows.append(len(got))
            return _Rows(got)

        db.execute = counting  # type: ignore[method-assign]
        assert store.audit_read(key, lambda db, t: t.inclusion_proof(5)) == whole.inclusion_proof(5)
        db.execute = execute  # type: ignore[method-assign]
        assert sum(rows) <= 2 + 256, rows  # max(seq), the newest known entry, one tile

        # An old entry's stored hash changed, the chain not redone: proofs over it are refused.
        conn = open_database(str(tmp_path / "v.sqlite3"))
        conn.execute("UPDATE ledger SET hash = ? WHERE seq = 10", ("ab" * 32,))
        conn.close()
        with pytest.raises(TileRewritten, match=r"entries 1\.\.256"):
            store.audit_read(key, lambda db, t: t.inclusion_proof(9))
        assert store.audit_read(key, lambda db, t: t.inclusion_proof(300)) == whole.inclusion_proof(
            300
        )
    finally:
        store.close()
    again = Store(tmp_path / "v.sqlite3")  # a restart reads the whole ledger: refused
    try:
        with pytest.raises(NotAppendOnly, match="rewritten"):
            again.audit_read(key, lambda db, t: t.root())
    finally:
        again.close()


def test_a_rechained_rewrite_is_refused_on_the_next_call(tmp_path: Path) -> None:
    key = keys.generate()
    store = _store_with_entries(tmp_path / "v.sqlite3", 300, key)
    try:
        store.audit_read(key, lambda db, t: t.root())
        conn = open_database(str(tmp_path / "v.sqlite3"))
        conn.execute("UPDATE runs SET policy_toml = ? WHERE name = 'r2'", ("# forged",))
        rechain(conn)  # every hash from entry 3 on redone: the chain verifies on its own
        conn.close()
        with pytest.raises(NotAppendOnly, match="entry 300 is not the one"):
            store.audit_read(key, lambda db, t: t.root())
    finally:
        store.close()


class _Rows(list):  # type: ignore[type-arg]
    def fetchone(self) -> Any:
        return self[0] if self else None
