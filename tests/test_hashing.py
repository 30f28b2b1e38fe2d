"""Parallel hashing with a (dev, inode, size, mtime, ctime) cache: right digests, honest errors."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from servewitness.evidence.hashing import Hasher
from tests.helpers import threads_started


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


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file counts as settled (written a while ago): what these tests write is new."""
    monkeypatch.setattr("servewitness.evidence.hashing.SETTLED_NS", -(10**18))


@pytest.mark.usefixtures("settled")
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


@pytest.mark.usefixtures("settled")
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


def test_files_either_side_of_the_thread_and_read_bounds_hash_right(tmp_path: Path) -> None:
    """Small files are hashed by the caller in one read, big ones by threads in chunks: every
    size either side of both bounds gets the digest hashlib gives, in input order."""
    from servewitness.evidence import hashing

    sizes = [0, 1, hashing.SMALL - 1, hashing.SMALL, hashing.SMALL + 1, hashing.CHUNK - 1]
    sizes += [hashing.CHUNK, hashing.CHUNK + 1, 3 * hashing.CHUNK + 7, 5, 77]
    files = []
    for i, n in enumerate(sizes):
        p = tmp_path / f"f{i}"
        p.write_bytes(os.urandom(n))
        files.append(str(p))
    got = Hasher(workers=2, cache=False).hash_files([*files, files[3]])  # (a repeat: once)
    want = [(f, _sha(Path(f).read_bytes()), os.path.getsize(f)) for f in files]
    assert [(h.path, h.sha256, h.size) for h in got] == want
    assert all(h.error is None for h in got)


def test_a_file_that_grows_past_what_stat_said_is_not_given_a_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One read of one byte more than stat said: bytes appended between the look and the read
    are seen (the digest would be of a file stat never described)."""
    p = tmp_path / "grows"
    p.write_bytes(b"x" * 100)
    real_read = os.read

    def read_after_append(fd: int, n: int) -> bytes:
        with p.open("ab") as f:  # the writer gets in between the fstat and the read
            f.write(b"y")
        return real_read(fd, n)

    monkeypatch.setattr("servewitness.evidence.hashing.os", _Patched(read_after_append))
    got = Hasher(cache=False).hash_file(str(p))
    assert (got.sha256, got.error, got.size) == (None, "changed while hashing", 101)


class _Patched:
    """``os`` with its ``read`` replaced."""

    def __init__(self, read: object) -> None:
        self.read = read

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)


def test_an_error_in_the_callers_part_stops_the_threads_and_is_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from servewitness.evidence import hashing

    big = tmp_path / "big"
    big.write_bytes(b"b" * (hashing.SMALL + 1))
    small = tmp_path / "small"
    small.write_bytes(b"s")
    real = Hasher.hash_file

    def boom(self: Hasher, path: str) -> hashing.Hashed:
        if path == str(small):
            raise MemoryError("the caller's part")
        return real(self, path)

    monkeypatch.setattr(Hasher, "hash_file", boom)
    started = threads_started(monkeypatch)
    with pytest.raises(MemoryError, match="the caller's part"):
        Hasher(cache=False).hash_files([str(big), str(small)])
    assert [t.name for t in started] == [hashing.THREAD_NAME]  # the big file had a thread
    assert [t for t in started if t.is_alive()] == []  # and it was joined, not left behind


def test_short_reads_of_a_small_file_are_read_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file system may answer a read with fewer bytes than asked before the end (network,
    FUSE): the small files' single read goes on until the end, and the digest is the file's."""
    p = tmp_path / "f"
    p.write_bytes(os.urandom(5000))
    real_read = os.read

    def trickle(fd: int, n: int) -> bytes:
        return real_read(fd, min(n, 700))

    monkeypatch.setattr("servewitness.evidence.hashing.os", _Patched(trickle))
    got = Hasher(cache=False).hash_file(str(p))
    assert (got.sha256, got.size, got.error) == (_sha(p.read_bytes()), 5000, None)


def test_a_file_changed_in_the_last_second_is_hashed_again_not_served_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write moves the ctime when it begins, before its bytes land: a file changed this
    recently may be read torn under a key that will not move again, so its digest is not
    kept. The same file a second later is."""
    from servewitness.evidence import hashing

    p = tmp_path / "f"
    p.write_bytes(b"abc")
    hasher = Hasher()
    first, again = hasher.hash_file(str(p)), hasher.hash_file(str(p))
    assert (first.cached, again.cached, again.sha256) == (False, False, _sha(b"abc"))
    later = os.stat(p).st_ctime_ns + hashing.SETTLED_NS + 1
    monkeypatch.setattr("servewitness.evidence.hashing.time", _Clock(later))
    settled_once, settled_twice = hasher.hash_file(str(p)), hasher.hash_file(str(p))
    assert (settled_once.cached, settled_twice.cached) == (False, True)


class _Clock:
    """``time`` with ``time_ns`` fixed at NOW."""

    def __init__(self, now: int) -> None:
        self.now = now

    def time_ns(self) -> int:
        return self.now


def test_a_read_torn_by_a_write_under_way_is_caught_by_a_second_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write moves the ctime when it begins: a read overlapping its bytes sees the same key
    before and after. The file was just changed, so it is read twice; the first read torn
    (half old bytes, as a read racing an in-place rewrite returns them) and the second whole
    differ: no digest. The control: the same torn read of a settled file is not read again."""
    p = tmp_path / "f"
    p.write_bytes(b"B" * 10_000)
    real_read = os.read
    calls: list[int] = []

    def torn_once(fd: int, n: int) -> bytes:
        calls.append(n)
        data = real_read(fd, n)
        return b"A" * 5_000 + data[5_000:] if len(calls) == 1 else data

    monkeypatch.setattr("servewitness.evidence.hashing.os", _Patched(torn_once))
    got = Hasher(cache=False).hash_file(str(p))
    assert (got.sha256, got.error) == (None, "changed while hashing")
    assert len(calls) == 2

    calls.clear()
    monkeypatch.setattr("servewitness.evidence.hashing.SETTLED_NS", -(10**18))
    settled = Hasher(cache=False).hash_file(str(p))
    assert settled.sha256 == _sha(b"A" * 5_000 + b"B" * 5_000) and len(calls) == 1
