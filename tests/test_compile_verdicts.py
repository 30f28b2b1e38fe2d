"""Compile verdicts kept by content across agent restarts (servewitness/evidence/verdicts.py): a
restarted agent reuses a verdict only for the same pyc and source bytes, and ignores a store
that is not whole and unedited. Real pycs written by py_compile, real files on disk."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from servewitness.evidence import statefile
from servewitness.evidence.bytecode import judge_bytecode
from servewitness.evidence.pycfile import CompileCache
from servewitness.evidence.verdicts import FILENAME, VerdictStore
from servewitness.model import DRIFT_BYTECODE_STALE
from tests.test_bytecode import NEW, OLD, entry, make_stale, write_module


def judged(pyc: Path, store: VerdictStore) -> tuple[list[str], dict[str, str]]:
    """The drift ids and the compiled-from map of a pyc judged as a freshly started agent
    judges it: an empty in-memory cache, the verdicts STORE holds."""
    j = judge_bytecode([entry(pyc)], Path, cache=CompileCache(), verdicts=store)
    return sorted(d.id for d in j.drift), dict(j.compiled_from)


def forged_store(path: Path, outcome: tuple[bool, str] | None, like: VerdictStore) -> None:
    """A store at PATH (whole, digest and all) that holds OUTCOME under each of LIKE's keys."""
    forged = VerdictStore(path)
    for key in list(like._verdicts):
        forged.put(key, outcome)
    forged.save()


def test_restarted_agent_reuses_the_verdict_and_judges_the_same(tmp_path: Path) -> None:
    _, pyc = write_module(tmp_path / "pkg")
    store_path = tmp_path / "state" / FILENAME
    store_path.parent.mkdir()
    first = VerdictStore(store_path)
    assert judged(pyc, first) == ([], {str(pyc): hashlib.sha256(OLD).hexdigest()})
    assert len(first) == 1 and store_path.exists()
    again = VerdictStore(store_path)  # a new agent process, the same state directory
    assert len(again) == 1
    assert judged(pyc, again) == ([], {str(pyc): hashlib.sha256(OLD).hexdigest()})
    assert not again.dirty  # nothing compiled: the verdict was reused


def test_kept_verdict_is_what_decides(tmp_path: Path) -> None:
    """Positive control for the cache being read: a (validly saved) verdict that says "other
    code" for an honest pyc is what the restarted agent reports, so a hit skips the compile."""
    _, pyc = write_module(tmp_path / "pkg")
    path = tmp_path / FILENAME
    honest = VerdictStore(None)
    judged(pyc, honest)
    forged_store(path, (True, ""), honest)
    assert judged(pyc, VerdictStore(path)) == ([DRIFT_BYTECODE_STALE], {})


def test_swapped_pyc_with_the_same_source_is_compiled_and_caught(tmp_path: Path) -> None:
    """Attack from the serving container: replace the pyc (its header kept valid), keep the
    source. The pyc's bytes changed, so its key did: the good verdict is not used."""
    src, pyc = write_module(tmp_path / "pkg")
    store = VerdictStore(tmp_path / FILENAME)
    assert judged(pyc, store)[0] == []
    # the pyc now holds code compiled from NEW, its source still holds OLD
    src.write_bytes(NEW)
    _, pyc2 = write_module(tmp_path / "pkg", NEW)
    assert pyc2 == pyc
    make_stale(src, pyc, OLD)
    restarted = VerdictStore(tmp_path / FILENAME)
    assert judged(pyc, restarted)[0] == [DRIFT_BYTECODE_STALE]
    assert len(restarted) == 2  # the new pair compiled and kept beside the old one


def test_swapped_source_with_the_same_pyc_is_compiled_and_caught(tmp_path: Path) -> None:
    src, pyc = write_module(tmp_path / "pkg")
    store = VerdictStore(tmp_path / FILENAME)
    assert judged(pyc, store)[0] == []
    make_stale(src, pyc, NEW)  # the source rewritten, its size and mtime put back
    assert judged(pyc, VerdictStore(tmp_path / FILENAME))[0] == [DRIFT_BYTECODE_STALE]


def test_edited_store_is_ignored_whole_and_rebuilt(tmp_path: Path) -> None:
    """An edit that keeps the JSON valid but not the digest: nothing in it is trusted (the
    forged "other code" verdict would show), it is logged and rebuilt from the compile."""
    _, pyc = write_module(tmp_path / "pkg")
    path = tmp_path / FILENAME
    honest = VerdictStore(None)
    judged(pyc, honest)
    forged_store(path, None, honest)
    digest, _, body = path.read_bytes().partition(b"\n")
    doc = json.loads(body)
    doc["verdicts"][0][1] = [True, ""]  # edited: "other code"
    path.write_bytes(digest + b"\n" + json.dumps(doc, separators=(",", ":")).encode())
    with capture_logs() as logs:
        store = VerdictStore(path)
    assert [(x["event"], x["reason"]) for x in logs] == [
        ("compile_cache_ignored", "digest mismatch")
    ]
    assert len(store) == 0
    assert judged(pyc, store)[0] == []
    assert len(VerdictStore(path)) == 1  # rebuilt, and whole again


def test_truncated_or_garbage_store_is_ignored(tmp_path: Path) -> None:
    _, pyc = write_module(tmp_path / "pkg")
    path = tmp_path / FILENAME
    store = VerdictStore(path)
    judged(pyc, store)
    whole = path.read_bytes()
    for bad in (whole[:-5], b"", b"\n", b"not a store"):
        path.write_bytes(bad)
        with capture_logs() as logs:
            assert len(VerdictStore(path)) == 0
        assert [x["event"] for x in logs] == ["compile_cache_ignored"]


def test_oversized_store_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bounded cost: a store over ``statefile.MAX_BYTES`` is not read past the bound."""
    _, pyc = write_module(tmp_path / "pkg")
    path = tmp_path / FILENAME
    store = VerdictStore(path)
    judged(pyc, store)
    monkeypatch.setattr(statefile, "MAX_BYTES", path.stat().st_size - 1)
    with capture_logs() as logs:
        assert len(VerdictStore(path)) == 0
    assert [(x["event"], x["reason"]) for x in logs] == [("compile_cache_ignored", "too large")]
    monkeypatch.setattr(statefile, "MAX_BYTES", path.stat().st_size)
    assert len(VerdictStore(path)) == 1  # control: at the bound it is read


def test_store_of_another_interpreter_is_not_used(tmp_path: Path) -> None:
    path = tmp_path / FILENAME
    body = json.dumps(
        {"format": "verifier-compile-verdicts/1", "magic": "00000000", "python": "2.7"}
        | {"verdicts": [["00" * 16, None]]}
    ).encode()
    path.write_bytes(hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
    with capture_logs() as logs:
        assert len(VerdictStore(path)) == 0
    assert [x["event"] for x in logs] == ["compile_cache_other_python"]


def test_store_is_bounded_least_recently_used_first(tmp_path: Path) -> None:
    store = VerdictStore(tmp_path / FILENAME, limit=2)
    store.put("a", None)
    store.put("b", (True, ""))
    assert store.get("a") == (True, None)  # a used: b is now the oldest
    store.put("c", (False, "why"))
    assert (store.get("b"), store.get("a"), store.get("c")) == (
        (False, None),
        (True, None),
        (True, (False, "why")),
    )
    store.save()
    assert len(VerdictStore(tmp_path / FILENAME, limit=2)) == 2


def test_off_switch_writes_nothing(tmp_path: Path) -> None:
    _, pyc = write_module(tmp_path / "pkg")
    store = VerdictStore(None)  # VERIFIER_AGENT_COMPILE_CACHE=0 / --no-compile-cache
    assert judged(pyc, store)[0] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg"]
