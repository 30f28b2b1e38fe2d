"""The manifest digest: a Merkle root over every field of every entry, sorted by path."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from servewitness.evidence.journal import (
    digest_of,
    manifest_digest_at,
    manifest_digests_at,
    manifest_of,
)
from servewitness.model import FileEntry, manifest_digest, manifest_leaf

A = FileEntry("/a.py", "00" * 32, 10, "source", "a", "load")
B = FileEntry("/b.py", "11" * 32, 20, "bytecode", "b", "snapshot")
C = FileEntry("/c.py", "22" * 32, 30, "source", None, "late")
UNREADABLE = FileEntry("/d.py", None, -1, "source", "d", "load")


def test_root_is_independent_of_entry_order_and_duplicates() -> None:
    assert manifest_digest([A, B, C]) == manifest_digest([C, A, B, A])


def test_empty_manifest_has_the_hash_of_nothing() -> None:
    assert manifest_digest([]) == "sha256:" + hashlib.sha256(b"").hexdigest()


def test_single_entry_root_is_its_leaf_over_every_field() -> None:
    text = json.dumps(["/a.py", "00" * 32, 10, "source", "a", "load"], separators=(",", ":"))
    assert manifest_digest([A]) == "sha256:" + hashlib.sha256(b"\x00" + text.encode()).hexdigest()


def test_any_change_of_any_stored_field_changes_the_root() -> None:
    """What a stored manifest keeps of an entry (``server/manifest_rows.to_rows``) is what
    its digest commits to: another sender of the same digest cannot change any of it. The
    identities are per process and left out."""
    base = manifest_digest([A, B, C, UNREADABLE])
    changes: list[dict[str, Any]] = [
        {"path": "/e.py"}, {"sha256": "23" * 32}, {"sha256": None}, {"size": 11},
        {"kind": "bytecode"}, {"module": None}, {"module": "evil"}, {"at": "rejected"},
    ]  # fmt: skip
    for change in changes:
        assert manifest_digest([dataclasses.replace(A, **change), B, C, UNREADABLE]) != base
    assert manifest_digest([A, B, C]) != base  # an unreadable entry counts too
    same = dataclasses.replace(A, identity=None, loaded=None)
    assert manifest_digest([same, B, C, UNREADABLE]) == base


def test_fields_that_look_alike_in_text_give_different_leaves() -> None:
    """The leaf is JSON, not text joined by a separator: a separator inside a field (a NUL,
    a quote) cannot move text from one field to the next, and an absent module or hash is
    not an empty one."""
    one = FileEntry("/x", None, 1, "a\x00b", None, "load")
    two = FileEntry("/x", None, 1, "a", "b", "load")
    assert manifest_digest([one]) != manifest_digest([two])
    assert manifest_digest([dataclasses.replace(A, module="")]) != manifest_digest(
        [dataclasses.replace(A, module=None)]
    )


_TEXTS = st.text(st.characters(codec=None), max_size=12)  # control, non-ASCII, surrogates


_LEAF_FIELDS = st.tuples(
    _TEXTS, st.none() | _TEXTS, st.integers(-(2**70), 2**70), _TEXTS, st.none() | _TEXTS, _TEXTS
)


@given(_LEAF_FIELDS)
@settings(max_examples=300, deadline=None)
def test_a_leaf_is_the_json_of_its_fields_whatever_they_hold(fields: Any) -> None:
    """The leaf's text is written by hand for speed; it must be exactly what ``json.dumps``
    writes (compact, ASCII) for any strings, absent values and sizes, and a field of another
    type (a bool, a str subclass) takes the encoder itself."""
    text = json.dumps(list(fields), separators=(",", ":"))
    assert manifest_leaf(fields) == hashlib.sha256(b"\x00" + text.encode()).digest()
    odd = (fields[0], fields[1], True, fields[3], fields[4], fields[5])
    text = json.dumps(list(odd), separators=(",", ":"))
    assert manifest_leaf(odd) == hashlib.sha256(b"\x00" + text.encode()).digest()


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
    read_aa = FileEntry("/m.pyc", "aa", -1, "bytecode", None, "load")
    assert got[3] == manifest_digest([read_aa])  # "aa" was read and not (yet) rejected
    rejected_aa = FileEntry("/m.pyc", "aa", -1, "", None, "rejected")
    assert got[4] == manifest_digest([rejected_aa])  # the rejected record itself
    assert got[2] == manifest_digest([dataclasses.replace(read_aa, sha256="bb")])
