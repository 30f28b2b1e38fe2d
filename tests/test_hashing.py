"""Parallel hashing with a (dev, inode, size, mtime, ctime) cache: right digests, honest errors."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from servewitness.evidence.hashing import Hasher


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_digests_match_hashlib_in_input_order(tmp_path: Path) -> None:
    files = []
    for i in range(20):
        p = tmp_path / f"f{i}"
        p.write_bytes(os.urandom(1000 * i + 1))
        files.append(p)
    got = Hasher(workers=4).hash_files(str(p) for p in files)
    assert [(h.path, h.sha256) for h in got] == [(str(p), _sha(p.read_bytes())) for p in files]


def test_rescan_of_an_unchanged_file_is_served_from_the_cache(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"abc")
    hasher = Hasher()
    first, again = hasher.hash_file(str(p)), hasher.hash_file(str(p))
    assert (first.cached, again.cached, again.sha256) == (False, True, _sha(b"abc"))


def test_rewrite_with_same_size_and_mtime_is_not_served_from_the_cache(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"abc")
    hasher = Hasher()
    hasher.hash_file(str(p))
    st = os.stat(p)
    p.write_bytes(b"xyz")  # same size
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime put back: ctime still moves
    again = hasher.hash_file(str(p))
    assert (again.cached, again.sha256) == (False, _sha(b"xyz"))


def test_missing_and_unreadable_files_give_reasons_not_crashes(tmp_path: Path) -> None:
    got = Hasher().hash_files([str(tmp_path / "nope"), str(tmp_path)])
    assert (got[0].sha256, got[0].error) == (None, "missing")
    assert got[1].sha256 is None and got[1].error is not None  # a directory cannot be read


def test_batch_rescan_answers_from_the_cache_and_rehashes_only_what_changed(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"one")
    b.write_bytes(b"two")
    hasher = Hasher()
    hasher.hash_files([str(a), str(b)])
    b.write_bytes(b"TWO!")
    again = hasher.hash_files([str(a), str(b)])
    assert [(h.cached, h.sha256) for h in again] == [(True, _sha(b"one")), (False, _sha(b"TWO!"))]


def test_bytes_that_change_while_being_read_give_no_digest() -> None:
    """A file whose size while read differs from what stat said just before (procfs files
    always do: stat says 0) is not given a digest, and says why."""
    got = Hasher(cache=False).hash_file("/proc/self/status")
    assert (got.sha256, got.error) == (None, "changed while hashing")
    assert got.size > 0  # bytes were read, and they are not trusted
