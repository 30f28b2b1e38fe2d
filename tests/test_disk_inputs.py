"""What a judgement read from the disk, and whether it would read the same now
(servewitness/evidence/inputs.py), on real files and directories: a rewritten file or a
``.dist-info`` added is a change; a touch with the same bytes, or an unrelated entry in a
listed directory, is not; a file younger than ``YOUNG_S`` is always read again."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from servewitness.evidence import inputs as I
from servewitness.evidence.distindex import DistIndex
from tests.test_cold_manifest import make_site


def aged(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make PATH's ctime count as old: the clock the young rule reads is moved ahead."""
    ahead = time.time_ns() + int(10 * I.YOUNG_S * 1e9)
    monkeypatch.setattr(time, "time_ns", lambda: ahead)  # the module the rule reads it from


def read(path: Path, kind: str = I.FILE) -> I.Input:
    digest = {
        I.FILE: lambda: I.of_bytes(path.read_bytes() if path.exists() else None),
        I.LISTING: lambda: I.of_names(I.dist_infos(path)),
        I.EXISTS: lambda: I.look(path)[1],
    }[kind]()
    return (str(path), kind, I.snapshot(path), digest)


def same(kept: I.Input) -> bool:
    return I.unchanged([kept], str)


def test_a_file_is_unchanged_until_its_bytes_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = tmp_path / "RECORD"
    f.write_bytes(b"a,sha256=x,1\n")
    aged(f, monkeypatch)
    kept = read(f)
    assert kept[2] not in (I.CHANGING, I.ABSENT) and same(kept)  # the stat answers
    os.utime(f)  # the same bytes, another mtime and ctime: read again, the same digest
    assert same(kept)
    f.write_bytes(b"a,sha256=y,1\n")
    assert not same(kept)
    f.write_bytes(b"a,sha256=x,1\n")  # put back: the same bytes, read again
    assert same(kept)
    f.unlink()
    assert not same(kept)


def test_a_young_file_is_always_read_again(tmp_path: Path) -> None:
    """A ctime within YOUNG_S of now is not kept: a second change within one clock tick
    would leave the identity as it was."""
    f = tmp_path / "RECORD"
    f.write_bytes(b"x\n")
    kept = read(f)
    assert kept[2] == I.CHANGING
    assert same(kept)  # by its digest
    f.write_bytes(b"y\n")  # the same size: only the digest tells
    assert not same(kept)


def test_an_absent_file_is_a_change_when_it_appears(tmp_path: Path) -> None:
    f = tmp_path / "direct_url.json"
    kept = read(f)
    assert kept[2] == I.ABSENT and kept[3] == "" and same(kept)
    f.write_text("{}")
    assert not same(kept)


def test_a_listing_changes_with_its_dist_infos_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    (site / "a-1.0.dist-info").mkdir(parents=True)
    aged(site, monkeypatch)
    kept = read(site, I.LISTING)
    (site / "unrelated.py").write_text("")  # the directory's ctime moves; its dist-infos do not
    assert same(kept)
    (site / "b-1.0.dist-info").mkdir()
    assert not same(kept)
    (site / "b-1.0.dist-info").rename(tmp_path / "away")
    assert same(kept)
    (site / "a-1.0.dist-info").rename(tmp_path / "gone")  # hidden
    assert not same(kept)


def test_an_existence_look_changes_when_the_file_comes_or_goes(tmp_path: Path) -> None:
    f = tmp_path / "json.py"
    kept = read(f, I.EXISTS)
    assert same(kept)
    f.write_text("")
    assert not same(kept)


def test_anything_that_cannot_be_read_again_is_a_change(tmp_path: Path) -> None:
    f = tmp_path / "RECORD"
    f.write_bytes(b"x\n")
    assert not same((str(f), I.FILE, I.CHANGING, I.UNREADABLE))
    assert not same((str(f), "another kind", I.CHANGING, I.of_bytes(b"x\n")))
    big = (str(f), I.FILE, I.CHANGING, I.of_bytes(b"x\n"))
    with pytest.MonkeyPatch.context() as m:
        m.setattr(I, "MAX_READ", 1)  # bounded: a file grown past the bound is not read
        assert not same(big)
    assert same(big)


def test_the_index_keeps_every_read_it_made(tmp_path: Path) -> None:
    """The site's listing, each distribution's METADATA, RECORD and direct_url.json (absent:
    kept as absent), and every directory searched for a site."""
    site = tmp_path / "site"
    make_site(site)
    index = DistIndex(Path)
    assert index.claim(str(site / "fakedist" / "core.py")) is not None
    kept = {(path, kind): digest for path, kind, _, digest in index.inputs()}
    info = site / "fakedist-1.0.dist-info"
    assert kept[(str(site), I.LISTING)] == I.of_names(["brokendist-1.0.dist-info", info.name])
    assert kept[(str(info / "RECORD"), I.FILE)] == I.of_bytes((info / "RECORD").read_bytes())
    assert kept[(str(info / "METADATA"), I.FILE)] == I.of_bytes((info / "METADATA").read_bytes())
    assert kept[(str(info / "direct_url.json"), I.FILE)] == ""
    assert (str(site / "fakedist"), I.LISTING) in kept  # searched: no dist-info there
    assert I.unchanged(index.inputs(), str)
    (info / "RECORD").write_text((info / "RECORD").read_text() + "fakedist/x.py,,\n")
    assert not I.unchanged(index.inputs(), str)
