"""The manifest digest is a Merkle root over sorted (path, sha256) entries."""

from __future__ import annotations

import hashlib
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from servewitness.evidence.journal import (
    digest_of,
    manifest_digest_at,
    manifest_digests_at,
    manifest_of,
)
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


# -- the digests of a journal's prefixes (request spans: what was loaded at a step) ----------

_FIELDS = {
    "k": st.sampled_from(["file", "file", "file", "step", None]),
    "path": st.sampled_from(["/a.py", "/b.pyc", "/c.so", 7, None]),
    "at": st.sampled_from(["load", "load", "rejected", "snapshot", "late", None]),
    "kind": st.sampled_from(["bytecode", "source", "extension", None]),
    "sha256": st.sampled_from(["aa", "bb", "cc", "", None, 3]),
}
_RECORDS = st.lists(st.fixed_dictionaries({}, optional=_FIELDS), max_size=40)


def _digest_per_prefix(records: list[dict[str, Any]], files: int) -> str:
    """The definition: the manifest of the first FILES file records, digested."""
    picked = [r for r in records if r.get("k") == "file"][: max(files, 0)]
    return digest_of(manifest_of(picked)[0])


@given(_RECORDS, st.lists(st.integers(-2, 45), max_size=8))
@settings(max_examples=400, deadline=None)
def test_prefix_digests_in_one_pass_equal_one_manifest_per_prefix(
    records: list[dict[str, Any]], counts: list[int]
) -> None:
    got = manifest_digests_at(records, counts)
    assert got == {n: _digest_per_prefix(records, n) for n in counts}
    for n in counts:
        assert manifest_digest_at(records, n) == got[n]


def test_a_rejected_pyc_read_stands_only_once_every_read_of_it_was_rejected() -> None:
    load = {"k": "file", "path": "/m.pyc", "at": "load", "kind": "bytecode"}
    records = [
        {**load, "sha256": "aa"},
        {**load, "sha256": "bb"},
        {"k": "file", "path": "/m.pyc", "at": "rejected", "sha256": "bb"},
        {"k": "file", "path": "/m.pyc", "at": "rejected", "sha256": "aa"},
    ]
    got = manifest_digests_at(records, [1, 2, 3, 4])
    assert got[3] == merkle_root([("/m.pyc", "aa")])  # "aa" was read and not (yet) rejected
    assert got[4] == merkle_root([("/m.pyc", "aa")])  # the rejected record's own sha256
    assert got[2] == merkle_root([("/m.pyc", "bb")])
