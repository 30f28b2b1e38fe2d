"""judge_bytecode against real pycs written by py_compile, and one a real interpreter runs.
Every loaded pyc is compared with its source; the attacks on a live probed process are in
tests/test_bytecode_attacks.py."""

from __future__ import annotations

import hashlib
import importlib.util
import marshal
import os
import platform
import py_compile
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from servewitness.evidence import bytecode, pycfile
from servewitness.evidence.bytecode import check_bytecode, judge_bytecode
from servewitness.evidence.pycfile import CompileCache
from servewitness.model import (
    DRIFT_BYTECODE_SOURCELESS,
    DRIFT_BYTECODE_STALE,
    DRIFT_BYTECODE_UNCHECKED,
    DRIFT_BYTECODE_UNVERIFIED,
    FileEntry,
)

Mode = py_compile.PycInvalidationMode
TIMESTAMP, CHECKED, UNCHECKED = Mode.TIMESTAMP, Mode.CHECKED_HASH, Mode.UNCHECKED_HASH
OLD = b"VALUE = 'old'\n"
NEW = b"VALUE = 'new'\n"  # the same size as OLD
HOUR_NS = 3600 * 10**9


def write_module(
    directory: Path, text: bytes = OLD, mode: Mode = TIMESTAMP, optimize: int = -1
) -> tuple[Path, Path]:
    """DIRECTORY/mod.py holding TEXT, and its pyc in __pycache__ as py_compile writes it."""
    directory.mkdir(parents=True, exist_ok=True)
    src = directory / "mod.py"
    src.write_bytes(text)
    level = optimize if optimize > 0 else ""
    pyc = Path(importlib.util.cache_from_source(str(src), optimization=level))
    py_compile.compile(
        str(src), cfile=str(pyc), doraise=True, invalidation_mode=mode, optimize=optimize
    )
    return src, pyc


def age(path: Path) -> None:
    """Set PATH's mtime an hour back (its ctime moves to now)."""
    past = time.time_ns() - HOUR_NS
    os.utime(path, ns=(past, past))


def rewrite_keeping_stat(src: Path, text: bytes) -> None:
    """Give SRC other bytes of the same size and restore its atime and mtime: the header of a
    timestamp pyc still matches, only the source's ctime moved."""
    assert len(text) == src.stat().st_size
    st = src.stat()
    src.write_bytes(text)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))


def make_stale(src: Path, pyc: Path, text: bytes = NEW) -> None:
    """The stale case: the pyc written (an hour ago) before its source was rewritten."""
    age(pyc)
    rewrite_keeping_stat(src, text)


def entry(path: Path | str, data_from: Path | None = None, **kw: str | None) -> FileEntry:
    """A manifest entry for a pyc loaded now (sha256 of DATA_FROM, default: the file)."""
    data = (data_from or Path(path)).read_bytes()
    fields: dict[str, str | None] = {
        "sha256": hashlib.sha256(data).hexdigest(),
        "kind": "bytecode",
        "module": "mod",
        "at": "load",
    }
    fields.update(kw)
    return FileEntry(
        str(path),
        fields["sha256"],
        len(data),
        fields["kind"] or "",
        fields["module"],
        fields["at"] or "",
    )


def ids(
    files: list[FileEntry],
    to_host: Callable[[str], Path] = Path,
    cache: CompileCache | None = bytecode.SHARED_CACHE,
) -> list[str]:
    """The sorted ids of the drifts check_bytecode finds in FILES."""
    drifts = check_bytecode(files, to_host, cache=cache)
    return sorted(d.id for d in drifts)


def shown(files: list[FileEntry], cache: CompileCache | None = None) -> dict[str, str]:
    """The pycs judge_bytecode shows to be compiled from their source, and the source's hash."""
    return dict(judge_bytecode(files, Path, cache=cache).compiled_from)


def test_fresh_timestamp_pyc_has_no_drift(tmp_path: Path) -> None:
    _, pyc = write_module(tmp_path / "pkg")
    cache = CompileCache()
    # Compiled and compared (as every loaded pyc is): the same code, no false positive.
    assert ids([entry(pyc)], cache=cache) == []
    assert len(cache) == 1
    assert shown([entry(pyc)]) == {str(pyc): hashlib.sha256(OLD).hexdigest()}


def test_source_rewritten_with_mtime_restored_is_stale(tmp_path: Path) -> None:
    src, pyc = write_module(tmp_path / "pkg")
    make_stale(src, pyc)
    drifts = check_bytecode([entry(pyc)], Path)
    assert [(d.id, d.path, d.module) for d in drifts] == [(DRIFT_BYTECODE_STALE, str(pyc), "mod")]
    assert f"other source than {src} holds" in drifts[0].detail
    assert "size and mtime match, so the interpreter used it" in drifts[0].detail


def test_same_content_touch_is_compiled_and_found_equal(tmp_path: Path) -> None:
    src, pyc = write_module(tmp_path / "pkg")
    age(pyc)
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))  # a candidate: its ctime moved
    assert src.stat().st_ctime_ns > pyc.stat().st_mtime_ns
    cache = CompileCache()
    assert ids([entry(pyc)], cache=cache) == []
    assert len(cache) == 1  # it was compiled and compared, not skipped


def test_pyc_mtime_set_forward_after_the_rewrite_is_still_stale(tmp_path: Path) -> None:
    src, pyc = write_module(tmp_path / "pkg")
    rewrite_keeping_stat(src, NEW)
    future = time.time_ns() + HOUR_NS
    os.utime(pyc, ns=(future, future))  # the pyc now looks written after the source changed
    assert ids([entry(pyc)]) == [DRIFT_BYTECODE_STALE]


def test_source_that_no_longer_compiles_is_stale(tmp_path: Path) -> None:
    src, pyc = write_module(tmp_path / "pkg")
    make_stale(src, pyc, b"VALUE = 'old\n\n")
    drifts = check_bytecode([entry(pyc)], Path)
    assert [d.id for d in drifts] == [DRIFT_BYTECODE_STALE]
    assert "does not compile: SyntaxError" in drifts[0].detail


def test_optimized_pyc_is_compared_at_its_level(tmp_path: Path) -> None:
    # At -OO the docstring is stripped: compiled at level 0 the code would differ.
    text = b'"""Doc."""\nVALUE = 1\n'
    src, pyc = write_module(tmp_path / "pkg", text, optimize=2)
    assert pyc.name == f"mod.{sys.implementation.cache_tag}.opt-2.pyc"
    age(pyc)
    rewrite_keeping_stat(src, text)
    cache = CompileCache()
    assert ids([entry(pyc)], cache=cache) == []
    assert len(cache) == 1


def test_source_warnings_do_not_escape_or_count(tmp_path: Path) -> None:
    text = b"PATTERN = '\\d'\n"  # an invalid escape: DeprecationWarning when compiled
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        src, pyc = write_module(tmp_path / "pkg", text)
    age(pyc)
    rewrite_keeping_stat(src, text)
    assert ids([entry(pyc)]) == []  # pytest turns an escaped warning into an error


def test_unchecked_hash_pyc_shown_compiled_from_its_source_is_no_finding(tmp_path: Path) -> None:
    # The interpreter never checked it, but its code was compared here: the stronger proof.
    src, pyc = write_module(tmp_path / "pkg", mode=UNCHECKED)
    assert ids([entry(pyc)]) == []
    assert shown([entry(pyc)]) == {str(pyc): hashlib.sha256(src.read_bytes()).hexdigest()}
    # A comment changes the source's hash, not its code: still no finding.
    src.write_bytes(OLD + b"# a comment\n")
    assert ids([entry(pyc)]) == []


def test_unchecked_hash_pyc_whose_hash_matches_but_code_does_not(tmp_path: Path) -> None:
    src, pyc = write_module(tmp_path / "pkg", mode=UNCHECKED)
    forged = pyc.read_bytes()[: pycfile.HEADER] + marshal.dumps(compile(NEW, str(src), "exec"))
    pyc.write_bytes(forged)
    drifts = {d.id: d.detail for d in check_bytecode([entry(pyc)], Path)}
    assert sorted(drifts) == [DRIFT_BYTECODE_STALE, DRIFT_BYTECODE_UNCHECKED]
    assert "embedded source hash matches" in drifts[DRIFT_BYTECODE_UNCHECKED]
    assert shown([entry(pyc)]) == {}


def test_unchecked_hash_pyc_with_changed_source_is_unchecked_and_stale(tmp_path: Path) -> None:
    src, pyc = write_module(tmp_path / "pkg", mode=UNCHECKED)
    src.write_bytes(b"VALUE = 'something else'\n")
    drifts = {d.id: d.detail for d in check_bytecode([entry(pyc)], Path)}
    assert sorted(drifts) == [DRIFT_BYTECODE_STALE, DRIFT_BYTECODE_UNCHECKED]
    assert "does not match" in drifts[DRIFT_BYTECODE_UNCHECKED]
    assert "never checks it, so it used it" in drifts[DRIFT_BYTECODE_STALE]


def test_checked_hash_pyc_matching_has_no_drift(tmp_path: Path) -> None:
    _, pyc = write_module(tmp_path / "pkg", mode=CHECKED)
    cache = CompileCache()
    assert ids([entry(pyc)], cache=cache) == []
    assert len(cache) == 1  # compared, not trusted for its header


def test_checked_hash_pyc_with_changed_source_is_stale(tmp_path: Path) -> None:
    src, pyc = write_module(tmp_path / "pkg", mode=CHECKED)
    src.write_bytes(NEW)
    assert ids([entry(pyc)]) == [DRIFT_BYTECODE_STALE]


def test_checked_hash_pyc_whose_source_changed_after_load_is_stale(tmp_path: Path) -> None:
    # The probe says it was used (not rejected): the code that ran is not the source's now.
    src, pyc = write_module(tmp_path / "pkg", mode=CHECKED)
    src.write_bytes(NEW)
    drifts = check_bytecode([entry(pyc), entry(src, kind="source")], Path)
    assert [d.id for d in drifts] == [DRIFT_BYTECODE_STALE]
    assert "or the source changed since" in drifts[0].detail
    assert ids([entry(pyc, at="rejected")]) == []  # one its loader rejected never ran


def test_hash_based_pyc_of_another_python_is_unverified(tmp_path: Path) -> None:
    _, pyc = write_module(tmp_path / "pkg", mode=UNCHECKED)
    data = pyc.read_bytes()
    pyc.write_bytes(b"\x00\x00\r\n" + data[4:])
    drifts = {d.id: d.detail for d in check_bytecode([entry(pyc)], Path)}
    assert sorted(drifts) == [DRIFT_BYTECODE_UNCHECKED, DRIFT_BYTECODE_UNVERIFIED]
    assert "bytecode of another Python (magic 00000d0a" in drifts[DRIFT_BYTECODE_UNVERIFIED]


def test_unreadable_source_of_hash_based_pyc_is_unverified(tmp_path: Path) -> None:
    src, pyc = write_module(tmp_path / "pkg", mode=CHECKED)
    src.unlink()
    src.mkdir()  # stat works, reading fails (whatever the user's privileges)
    drifts = check_bytecode([entry(pyc)], Path)
    assert [d.id for d in drifts] == [DRIFT_BYTECODE_UNVERIFIED]
    assert f"cannot read {src}" in drifts[0].detail
    assert "not a regular file: a directory" in drifts[0].detail


def test_unstattable_source_of_timestamp_pyc_is_unverified(tmp_path: Path) -> None:
    src, pyc = write_module(tmp_path / "pkg")
    src.unlink()
    src.symlink_to(src)  # a loop: stat fails with ELOOP, not "missing"
    drifts = check_bytecode([entry(pyc)], Path)
    assert [d.id for d in drifts] == [DRIFT_BYTECODE_UNVERIFIED]
    assert "symbolic links" in drifts[0].detail


def test_pyc_outside_pycache_is_sourceless(tmp_path: Path) -> None:
    src = tmp_path / "mod.py"
    src.write_bytes(OLD)
    pyc = tmp_path / "mod.pyc"
    py_compile.compile(str(src), cfile=str(pyc), doraise=True)
    src.unlink()
    drifts = check_bytecode([entry(pyc)], Path)
    assert [(d.id, d.path, d.module) for d in drifts] == [
        (DRIFT_BYTECODE_SOURCELESS, str(pyc), "mod")
    ]


def test_pyc_under_a_pycache_prefix_is_judged_against_the_probes_source(tmp_path: Path) -> None:
    # PYTHONPYCACHEPREFIX: mod.cpython-311.pyc outside any __pycache__, the source elsewhere.
    src = tmp_path / "app" / "mod.py"
    src.parent.mkdir()
    src.write_bytes(OLD)
    pyc = (
        tmp_path
        / "prefix"
        / str(src.parent).lstrip("/")
        / f"mod.{sys.implementation.cache_tag}.pyc"
    )
    pyc.parent.mkdir(parents=True)
    py_compile.compile(str(src), cfile=str(pyc), doraise=True)
    make_stale(src, pyc)
    source_entry = entry(src, kind="source", at="deferred")
    assert ids([entry(pyc), source_entry]) == [DRIFT_BYTECODE_STALE]
    assert ids([entry(pyc)]) == [DRIFT_BYTECODE_SOURCELESS]  # no source known


def test_timestamp_pyc_of_another_python_is_unverified(tmp_path: Path) -> None:
    # Fresh or stale, the agent cannot compile for another Python: never shown, never pristine.
    for stale in (False, True):
        src, pyc = write_module(tmp_path / f"pkg{stale}")
        data = pyc.read_bytes()
        pyc.write_bytes(b"\x00\x00\r\n" + data[4:])
        if stale:
            make_stale(src, pyc)
        drifts = check_bytecode([entry(pyc)], Path)
        assert [d.id for d in drifts] == [DRIFT_BYTECODE_UNVERIFIED]
        assert "bytecode of another Python (magic 00000d0a" in drifts[0].detail
        assert shown([entry(pyc)]) == {}


def test_missing_source_is_unverified(tmp_path: Path) -> None:
    # Used at load (the probe says so), deleted since: it can no longer be shown to be its
    # source's, so it is a finding (a warning) and not pristine.
    for mode in (TIMESTAMP, CHECKED, UNCHECKED):
        src, pyc = write_module(tmp_path / mode.name, mode=mode)
        src.unlink()
        drifts = {d.id: d.detail for d in check_bytecode([entry(pyc)], Path)}
        also = [DRIFT_BYTECODE_UNCHECKED] if mode is UNCHECKED else []
        assert sorted(drifts) == sorted([DRIFT_BYTECODE_UNVERIFIED, *also])
        assert f"{src} is missing now" in drifts[DRIFT_BYTECODE_UNVERIFIED]


def test_truncated_pyc_is_no_drift_or_unverified(tmp_path: Path) -> None:
    _, pyc = write_module(tmp_path / "header")
    pyc.write_bytes(pyc.read_bytes()[:10])  # no interpreter accepts this header
    assert ids([entry(pyc)]) == []
    src2, pyc2 = write_module(tmp_path / "body")
    pyc2.write_bytes(pyc2.read_bytes()[: pycfile.HEADER + 5])
    make_stale(src2, pyc2)  # importing it failed: nothing ran, but nothing is shown either
    drifts = check_bytecode([entry(pyc2)], Path)
    assert [d.id for d in drifts] == [DRIFT_BYTECODE_UNVERIFIED]
    assert "cannot be unmarshalled" in drifts[0].detail


def test_bad_flags_are_no_drift(tmp_path: Path) -> None:
    src, pyc = write_module(tmp_path / "pkg")
    data = pyc.read_bytes()
    pyc.write_bytes(data[:4] + (4).to_bytes(4, "little") + data[8:])
    make_stale(src, pyc)
    assert ids([entry(pyc)]) == []


def test_only_bytecode_read_at_load_is_judged(tmp_path: Path) -> None:
    src, pyc = write_module(tmp_path / "pkg")
    make_stale(src, pyc)
    assert ids([entry(pyc)]) == [DRIFT_BYTECODE_STALE]  # the same pyc, judged
    others = [entry(pyc, kind="source"), entry(pyc, kind="data"), entry(pyc, at="snapshot")]
    others += [entry(pyc, at="late")]
    assert ids(others) == []


def test_pyc_changed_since_load_is_left_to_the_cross_check(tmp_path: Path) -> None:
    src, pyc = write_module(tmp_path / "pkg")
    make_stale(src, pyc)
    other = entry(pyc, sha256=hashlib.sha256(b"other bytes").hexdigest())
    unhashed = entry(pyc, sha256=None)
    _, upyc = write_module(tmp_path / "unchecked", mode=UNCHECKED)
    assert ids([other, unhashed, entry(upyc, sha256="0" * 64)]) == []


def test_prefix_root_maps_process_paths(tmp_path: Path) -> None:
    root = tmp_path / "root"
    src, pyc = write_module(root / "app" / "pkg")
    make_stale(src, pyc)
    in_process = "/" + str(pyc.relative_to(root))

    def to_host(path: str) -> Path:
        return root / path.lstrip("/")

    drifts = check_bytecode([entry(in_process, data_from=pyc)], to_host)
    assert [(d.id, d.path) for d in drifts] == [(DRIFT_BYTECODE_STALE, in_process)]
    assert "other source than /app/pkg/mod.py holds" in drifts[0].detail
    assert ids([entry(in_process, data_from=pyc)], Path) == []  # not readable without the root


def test_one_drift_per_id_and_path(tmp_path: Path) -> None:
    src, pyc = write_module(tmp_path / "pkg", mode=UNCHECKED)
    src.write_bytes(NEW + b"# more\n")
    e = entry(pyc)
    assert ids([e, e, entry(pyc, module="other")]) == [
        DRIFT_BYTECODE_STALE,
        DRIFT_BYTECODE_UNCHECKED,
    ]


def test_cached_outcome_is_not_compiled_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, pyc = write_module(tmp_path / "pkg")
    make_stale(src, pyc)
    cache = CompileCache()
    assert ids([entry(pyc)], cache=cache) == [DRIFT_BYTECODE_STALE]

    def no_compile(*args: object) -> None:
        raise AssertionError("compiled again")

    monkeypatch.setattr(bytecode, "compare", no_compile)
    assert ids([entry(pyc)], cache=cache) == [DRIFT_BYTECODE_STALE]
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))  # same times, a new ctime: a new key
    with pytest.raises(AssertionError, match="compiled again"):
        check_bytecode([entry(pyc)], Path, cache=cache)


def test_odd_paths_do_not_raise(tmp_path: Path) -> None:
    odd = [entry(tmp_path / "__pycache__" / "x.cpython-311.pyc", data_from=Path(__file__))]
    odd += [FileEntry("/a/__pycache__/b\0.cpython-311.pyc", "0" * 64, 1, "bytecode", None, "load")]
    odd += [FileEntry("relative/__pycache__/b.pyc", "0" * 64, 1, "bytecode", None, "load")]
    assert ids(odd) == []


def test_interpreter_runs_a_stale_pyc_and_it_is_reported(tmp_path: Path) -> None:
    src, pyc = write_module(tmp_path)
    make_stale(src, pyc)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(PYTHONPATH=str(tmp_path), PYTHONDONTWRITEBYTECODE="1")
    run = subprocess.run(
        [sys.executable, "-c", "import mod; print(mod.VALUE)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    assert run.stdout == "old\n"  # the source says 'new': the interpreter ran the pyc
    assert src.read_bytes() == NEW
    drifts = check_bytecode([entry(pyc)], Path)
    assert [(d.id, d.path) for d in drifts] == [(DRIFT_BYTECODE_STALE, str(pyc))]


def test_source_whose_mtime_moved_after_load_does_not_hide_a_stale_pyc(tmp_path: Path) -> None:
    # The probe says the pyc ran; its header no longer matching the source says only that the
    # source's stat changed since, not that the interpreter rejected it.
    src, pyc = write_module(tmp_path / "pkg")
    make_stale(src, pyc)
    os.utime(src, (1, 1))
    drifts = check_bytecode([entry(pyc)], Path)
    assert [d.id for d in drifts] == [DRIFT_BYTECODE_STALE]
    assert "the source's size or mtime changed since" in drifts[0].detail


def test_an_edit_of_the_pyc_is_a_new_key_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, pyc = write_module(tmp_path / "pkg")
    cache = CompileCache()
    assert ids([entry(pyc)], cache=cache) == []

    def no_compile(*args: object) -> None:
        raise AssertionError("compiled again")

    monkeypatch.setattr(bytecode, "compare", no_compile)
    assert ids([entry(pyc)], cache=cache) == []  # a rescan: a stat and a 16-byte read
    st = pyc.stat()
    os.utime(pyc, ns=(st.st_atime_ns, st.st_mtime_ns))  # same bytes and times, a new ctime
    with pytest.raises(AssertionError, match="compiled again"):
        check_bytecode([entry(pyc)], Path, cache=cache)


def test_processes_that_see_the_same_files_share_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two processes of one container: other /proc/<pid>/root prefixes, the same files.
    _, pyc = write_module(tmp_path / "root" / "app" / "pkg")
    (tmp_path / "other").symlink_to(tmp_path / "root")
    in_process = "/" + str(pyc.relative_to(tmp_path / "root"))
    cache = CompileCache()
    first = judge_bytecode(
        [entry(in_process, data_from=pyc)], lambda p: tmp_path / "root" / p.lstrip("/"), cache=cache
    )
    assert first.drift == () and in_process in first.compiled_from

    def no_compile(*args: object) -> None:
        raise AssertionError("compiled again")

    monkeypatch.setattr(bytecode, "compare", no_compile)
    second = judge_bytecode(
        [entry(in_process, data_from=pyc)],
        lambda p: tmp_path / "other" / p.lstrip("/"),
        cache=cache,
    )
    assert second == first and len(cache) == 1


def test_the_cache_is_bounded_and_keeps_the_newest() -> None:
    cache = CompileCache(limit=4)
    keys = [
        pycfile.cache_key(("/p", i, i, 1, 1, 1), ("/s", i, i, 1, 1, 1), 0, "") for i in range(9)
    ]
    for k in keys:
        cache.put(k, pycfile.Checked(loaded=True))
    assert len(cache) <= 4
    assert cache.get(keys[-1]) is not None and cache.get(keys[0]) is None
    nothing = CompileCache(limit=0)
    nothing.put(keys[0], pycfile.Checked(loaded=True))
    assert len(nothing) == 0


def test_an_entry_costs_a_few_hundred_bytes(tmp_path: Path) -> None:
    # What bounds the cache's memory: the default limit times this (about 20 MB).
    cache = CompileCache()
    files = [entry(write_module(tmp_path / f"p{i}")[1], module=f"p{i}") for i in range(50)]
    assert ids(files, cache=cache) == [] and len(cache) == 50
    assert cache.footprint() / len(cache) < 400
    assert cache.limit * 400 < 30e6


def test_a_pyc_is_rejected_only_if_every_read_of_it_was() -> None:
    from servewitness.evidence.journal import manifest_of

    def rec(sha: str, at: str, t: float) -> dict[str, object]:
        return {"k": "file", "path": "/p/__pycache__/m.pyc", "kind": "bytecode", "sha256": sha,
                "size": 1, "module": "m", "at": at, "t": t}  # fmt: skip

    honest = [rec("a", "load", 1.0), rec("a", "rejected", 1.0)]
    assert [f.at for f in manifest_of(honest)[0]] == ["rejected"]
    # Used (forged bytes F), then made stale and read and rejected again (other bytes H).
    covered = [rec("f", "load", 1.0), rec("h", "load", 2.0), rec("h", "rejected", 2.0)]
    files, hashed_at = manifest_of(covered)
    assert [(f.sha256, f.at) for f in files] == [("f", "load")]
    assert hashed_at == {"/p/__pycache__/m.pyc": 1.0}
    again = [rec("f", "load", 1.0), rec("f", "load", 2.0), rec("f", "rejected", 2.0)]
    assert [(f.sha256, f.at) for f in manifest_of(again)[0]] == [("f", "load")]


def test_other_code_under_another_python_release_is_unverified(tmp_path: Path) -> None:
    # One magic number covers every 3.11.x; a patch release may compile differently, so other
    # code is no proof of a forgery then: unverified (and not pristine), not stale.
    src, pyc = write_module(tmp_path / "stale")
    make_stale(src, pyc)
    ours = platform.python_version()
    assert ids([entry(pyc)]) == [DRIFT_BYTECODE_STALE]
    assert [d.id for d in check_bytecode([entry(pyc)], Path, python=ours)] == [DRIFT_BYTECODE_STALE]
    drifts = check_bytecode([entry(pyc)], Path, python="3.11.0")
    assert [d.id for d in drifts] == [DRIFT_BYTECODE_UNVERIFIED]
    assert f"the process runs Python 3.11.0 and this verifier {ours}" in drifts[0].detail
    _, fresh = write_module(tmp_path / "fresh")
    same = judge_bytecode([entry(fresh)], Path, python="3.11.0")
    assert same.drift == () and str(fresh) in same.compiled_from  # equal code is proof anyway
