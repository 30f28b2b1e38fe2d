"""The manifest digest is a Merkle root over sorted (path, sha256) entries."""

from __future__ import annotations

import hashlib

from servewitness.model import merkle_root

A = ("/a.py", "00" * 32)
B = ("/b.py", "11" * 32)
C = ("/c.py", "22" * 32)


def test_root_is_independent_of_entry_order_and_duplicates() -> None:
    assert merkle_root([A, B, C]) == merkle_root([C, A, B, A])


def test_empty_manifest_has_the_hash_of_nothing() -> None:
    assert merkle_root([]) == "sha256:" + hashlib.sha256(b"").hexdigest()


def test_single_entry_root_is_its_leaf() -> None:
    leaf = hashlib.sha256(b"\x00/a.py\x00" + A[1].encode()).hexdigest()
    assert merkle_root([A]) == "sha256:" + leaf


def test_any_change_of_path_or_hash_changes_the_root() -> None:
    base = merkle_root([A, B, C])
    assert merkle_root([A, B, ("/c.py", "23" * 32)]) != base
    assert merkle_root([A, B, ("/d.py", C[1])]) != base
    assert merkle_root([A, B]) != base
