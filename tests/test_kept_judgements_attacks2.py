"""More attacks on the kept judgement (servewitness/evidence/judgements.py, inputs.py,
agent/judged.py), after the fix that keeps every disk read of the distribution index
(``Judgement.disk``) and reuses the static part only while each reads the same.

As in ``test_kept_judgements_attacks.py``: a real probed workload, an agent whose judgement
store is on collects once (the judgement is kept), the workload acts, then a restarted agent
(same state directory) is compared with a fresh agent whose store is off. The safe outcome:
the restarted agent reports what the fresh one reports. A test that fails names an unsafe
divergence.

Written by a second attacker who had not read the code (2026-12-06). Three succeeded against
df03e95 and pass since: the source a pyc is compared with is kept as a read (bytecode's
``reads``), a file's identity is its read descriptor's (``fstat``) and a listing's its
directory descriptor's, and a ``*.dist-info`` symbolic link is looked at for where it
points. Its false alarm (a hard link) is the documented limit of a first look, tested from
the running agent's side."""

from __future__ import annotations

import dataclasses
import os
import py_compile
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from servewitness.agent.config import AgentConfig
from servewitness.agent.runner import Agent
from servewitness.evidence import distindex
from servewitness.evidence.regular import open_file
from servewitness.model import (
    DRIFT_BYTECODE_STALE,
    DRIFT_MODULE_SHADOWED,
    DRIFT_RECORD_CHANGED_AFTER_START,
    Origin,
)
from tests.helpers import install_dist
from tests.test_cold_manifest import make_site
from tests.test_kept_judgements import collect
from tests.test_kept_judgements_attacks import (
    _b64,
    drift_at,
    judged,
    origin_of,
    restarted_and_fresh,
    workload,
)


def _forged_record(site: Path) -> str:
    """fakedist's RECORD with the row of its patched core.py forged to match the patch (no
    size field), padded with blank lines to the genuine RECORD's length where it is shorter."""
    core = site / "fakedist" / "core.py"
    genuine = (site / "fakedist-1.0.dist-info" / "RECORD").read_text()
    forged = "".join(
        f"fakedist/core.py,sha256={_b64(core.read_bytes())},\n"
        if row.startswith("fakedist/core.py,")
        else row + "\n"
        for row in genuine.splitlines()
    )
    return forged + "\n" * max(0, len(genuine) - len(forged))


def stale_pyc(tmp_path: Path, name: str) -> tuple[Path, Path, Path, bytes, bytes]:
    """Module NAME in TMP_PATH/app: its genuine source (an old mtime) and a pyc compiled from
    other code whose header carries the genuine source's size and mtime (the interpreter
    takes it as fresh): (app, source, pyc, the genuine bytes, the code the pyc holds)."""
    app = tmp_path / "app"
    app.mkdir()
    good = b"X = 1  # the genuine source\n"
    evil = b"X = 666  # what runs instead\n"
    source = app / f"{name}.py"
    source.write_bytes(good)
    os.utime(source, (MTIME, MTIME))
    evil_src = tmp_path / "evilsrc" / f"{name}.py"
    evil_src.parent.mkdir()
    evil_src.write_bytes(evil)
    pyc = app / "__pycache__" / f"{name}.{sys.implementation.cache_tag}.pyc"
    py_compile.compile(str(evil_src), cfile=str(pyc), dfile=str(source), doraise=True)
    data = bytearray(pyc.read_bytes())
    data[8:12] = MTIME.to_bytes(4, "little")
    data[12:16] = len(good).to_bytes(4, "little")
    pyc.write_bytes(bytes(data))
    return app, source, pyc, good, evil


MTIME = 1_000_000_000  # the genuine source's mtime, which the stale pyc's header names


def forgeable_site(tmp_path: Path) -> tuple[Path, Path, Path, str, str]:
    """``make_site`` in TMP_PATH/site: (site, the patched core.py, fakedist's RECORD, its
    genuine text, a forged text of the same length that calls core.py published)."""
    site = tmp_path / "site"
    make_site(site)
    record = site / "fakedist-1.0.dist-info" / "RECORD"
    return site, site / "fakedist" / "core.py", record, record.read_text(), _forged_record(site)


def test_a_pyc_source_staged_for_the_first_judgement_is_compared_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: the workload runs a pyc compiled from other code than its source (its header
    names the genuine source's size and mtime, so the interpreter uses it). While the agent
    first judges, the workload writes the code the pyc was compiled from into the source
    path (the compare finds the pyc is its source's: no finding), then puts the genuine
    source back. The bytecode judge reads the source from the disk, but that read is no
    ``Input`` of the judgement (only the index's reads are), and the source is no manifest
    file (the probe journals the pyc), so the key and the disk are "unchanged" and the kept
    "compiled from its source" is reused. An agent without the store compares the pyc with
    the genuine source and flags it stale.

    UNSAFE when this fails (a running agent with ``recheck_s=0`` shares it)."""
    app, source, pyc, good, evil = stale_pyc(tmp_path, "pycmod")
    state = tmp_path / "state"
    with workload(tmp_path, "import pycmod\nassert pycmod.X == 666", app) as w:
        control = collect(w.pid, tmp_path / "c", cache=False)
        assert DRIFT_BYTECODE_STALE in drift_at(control, pyc), "control: the pyc is stale"
        source.write_bytes(evil)  # staged for the first judgement
        first = collect(w.pid, state)
        assert DRIFT_BYTECODE_STALE not in drift_at(first, pyc)  # fooled, as anyone would be
        source.write_bytes(good)
        os.utime(source, (MTIME, MTIME))
        again, fresh, reused = restarted_and_fresh(w.pid, state, tmp_path / "o", monkeypatch)
    assert DRIFT_BYTECODE_STALE in drift_at(fresh, pyc), "control"
    assert drift_at(again, pyc) == drift_at(fresh, pyc), reused
    assert judged(again) == judged(fresh)


def test_a_record_swapped_in_between_the_look_and_the_read_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack (a race, its winning moment staged here): ``DistIndex._read`` takes a RECORD's
    identity by path (``inputs.snapshot``) and then opens the path again to read it. Between
    the two, the workload renames the genuine ``.dist-info`` away and a copy holding a forged
    RECORD into its place, and right after the read swaps them back. Renaming a directory
    leaves the ctime of the files inside unchanged: the kept read is (the genuine RECORD's
    identity, the forged bytes' digest), and the genuine RECORD, back in place, has exactly
    that identity, so ``inputs.unchanged`` answers "unchanged" with a ``stat`` and never reads
    it again; ``changed_after_start`` sees the genuine file's old ctime too. The restarted
    agent keeps "pristine" for the patched file; an agent without the store reads the genuine
    RECORD and says patched. (A workload that swaps the two directories in a loop wins this
    race now and then; each loss only costs it a re-judgement.)

    UNSAFE when this fails: the identity kept is not that of the file read (``fstat`` of the
    descriptor read, compared with the look, would close it)."""
    site = tmp_path / "site"
    make_site(site)
    core = site / "fakedist" / "core.py"
    info = site / "fakedist-1.0.dist-info"
    decoy = tmp_path / "decoy"
    shutil.copytree(info, decoy)
    (decoy / "RECORD").write_text(_forged_record(site))
    away = tmp_path / "away"
    real_open = open_file
    raced: list[str] = []

    def racing_open(path: str | Path, *, nofollow: bool = False) -> BinaryIO:
        if str(path).endswith("fakedist-1.0.dist-info/RECORD") and not raced:
            raced.append(str(path))
            info.rename(away)  # the workload, just before the agent's open
            decoy.rename(info)
            try:
                return real_open(path, nofollow=nofollow)
            finally:
                info.rename(decoy)  # and straight back: the agent reads the forged file's fd
                away.rename(info)
        return real_open(path, nofollow=nofollow)

    state = tmp_path / "state"
    with workload(tmp_path, "import fakedist.core", site) as w:
        with monkeypatch.context() as m:
            m.setattr(distindex, "open_file", racing_open)
            first = collect(w.pid, state)
        assert raced, "the race was staged"
        assert origin_of(first, core) == Origin.PRISTINE  # the forged bytes were read
        again, fresh, reused = restarted_and_fresh(w.pid, state, tmp_path / "o", monkeypatch)
    assert origin_of(fresh, core) == Origin.PATCHED, "control"
    assert origin_of(again, core) == origin_of(fresh, core), reused
    assert judged(again) == judged(fresh)


def test_a_dangling_dist_info_link_pointed_after_the_first_judgement_shows_the_shadowing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: a site listing keeps the ``*.dist-info`` names that are directories
    (``inputs.dist_infos``: ``is_dir`` follows links) and the site directory's identity.
    The site holds ``victim-1.0.dist-info`` as a symbolic link to a path that does not exist
    while the agent first judges: not a directory, so not listed, and the module loaded from
    the front of the path shadows nothing. Then the workload renames a ready ``.dist-info``
    (made before the process started) to the link's target, elsewhere: the site directory
    itself is not touched (its identity is the same, so its listing is not read again) and
    the RECORD's ctime predates the start. An agent without the store lists the link as a
    directory, finds the claimant, and flags the shadowing.

    UNSAFE when this fails: a distribution hidden behind a dangling link stays hidden."""
    site = tmp_path / "site"
    make_site(site)
    (site / "victim.py").write_bytes(b"V = 1\n")
    staging = tmp_path / "staging"
    install_dist(staging, "victim", {"victim.py": b"V = 1\n"})
    ready = staging / "victim-1.0.dist-info"
    target = tmp_path / "elsewhere" / "victim-info"
    target.parent.mkdir()
    (site / "victim-1.0.dist-info").symlink_to(target)
    front = tmp_path / "front"
    front.mkdir()
    shadow = front / "victim.py"
    shadow.write_bytes(b"V = 666  # shadows site's victim\n")
    time.sleep(1.1)  # the site directory's ctime is no longer young
    state = tmp_path / "state"
    with workload(tmp_path, "import victim, fakedist.core", front, site) as w:
        first = collect(w.pid, state)
        assert DRIFT_MODULE_SHADOWED not in drift_at(first, shadow)
        ready.rename(target)
        again, fresh, reused = restarted_and_fresh(w.pid, state, tmp_path / "o", monkeypatch)
    assert drift_at(fresh, shadow) == [DRIFT_MODULE_SHADOWED], "control"
    assert drift_at(again, shadow) == drift_at(fresh, shadow), reused
    assert judged(again) == judged(fresh)


def test_a_record_replaced_by_rename_with_the_same_size_and_mtime_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: after the judgement is kept, rename a forged RECORD of the same size, with the
    genuine one's mtime, over the genuine one (then the reverse order: forged first). The
    inode and ctime differ, so the restarted agent reads it again and judges as a fresh one
    does."""
    site, core, record, genuine, forged = forgeable_site(tmp_path)
    assert len(forged) == len(genuine)
    st = record.stat()
    state = tmp_path / "state"
    with workload(tmp_path, "import fakedist.core", site) as w:
        first = collect(w.pid, state)
        assert origin_of(first, core) == Origin.PATCHED
        tmp = record.with_name(".RECORD.tmp")
        tmp.write_text(forged)
        os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
        tmp.rename(record)
        again, fresh, reused = restarted_and_fresh(w.pid, state, tmp_path / "o", monkeypatch)
    assert reused == 1, "judged afresh"
    assert judged(again) == judged(fresh)
    assert DRIFT_RECORD_CHANGED_AFTER_START in drift_at(fresh, record)


def test_a_record_changed_twice_within_a_tick_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: write the forged RECORD just before the agent first judges and the genuine one
    back at once (the same timestamp tick, same size, mtime put back): the identity taken was
    young (``CHANGING``), so the restarted agent reads it again and compares the digest."""
    site, core, record, genuine, forged = forgeable_site(tmp_path)
    st = record.stat()
    state = tmp_path / "state"
    real_open = open_file
    done: list[bool] = []

    def put_back() -> None:
        done.append(True)
        with open(record, "w") as fh:  # in place: the same inode
            fh.write(genuine)
        os.utime(record, ns=(st.st_atime_ns, st.st_mtime_ns))

    def put_back_after(path: str | Path, *, nofollow: bool = False) -> Any:
        f = real_open(path, nofollow=nofollow)
        if str(path).endswith("fakedist-1.0.dist-info/RECORD") and not done:
            return _ThenRun(f, put_back)  # the genuine bytes back right after the read
        return f

    with workload(tmp_path, "import fakedist.core", site) as w:
        with open(record, "w") as fh:
            fh.write(forged)
        os.utime(record, ns=(st.st_atime_ns, st.st_mtime_ns))
        with monkeypatch.context() as m:
            m.setattr(distindex, "open_file", put_back_after)
            first = collect(w.pid, state)
        assert done and origin_of(first, core) == Origin.PRISTINE
        again, fresh, reused = restarted_and_fresh(w.pid, state, tmp_path / "o", monkeypatch)
    assert origin_of(fresh, core) == Origin.PATCHED, "control"
    assert origin_of(again, core) == Origin.PATCHED, reused


class _ThenRun:
    """A file object read once, then AFTER runs (the workload acting right after a read)."""

    def __init__(self, f: BinaryIO, after: Callable[[], None]) -> None:
        self.f, self.after = f, after

    def fileno(self) -> int:
        return self.f.fileno()

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.after()
        return data

    def __enter__(self) -> _ThenRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.f.close()


def _hard_linked(path: Path, to: Path) -> Callable[[], None]:
    os.link(path, to)
    return to.unlink


def test_an_honest_hard_link_to_an_installer_file_is_vouched_for_by_an_agent_that_looked(
    tmp_path: Path,
) -> None:
    """An honest setup: package managers that link one cache into many environments (uv,
    pnpm-style stores) add a hard link to an installed file when another environment installs
    the same distribution, which moves the inode's ctime with the same bytes. An agent that
    read the file before, with a ctime before the start, keeps that reading (the same bytes
    read again): no ``provenance.record.changed_after_start``. A first look cannot tell a link
    from a rewrite and flags it, as ``provenance.file.changed_after_start`` does for a loaded
    file (docs/policy.md). (Found as a false alarm by the attacker; this is the documented
    limit, the running agent's side of it tested.)"""
    site = tmp_path / "site"
    make_site(site)
    metadata = site / "fakedist-1.0.dist-info" / "METADATA"
    time.sleep(1.1)  # the site's files are not young when first read
    with workload(tmp_path, "import fakedist.core", site) as w:
        running = Agent(AgentConfig("127.0.0.1:9", "t", "a", tmp_path / "s1", root_pid=w.pid,
                                    docker_socket=None, recheck_s=0))  # fmt: skip
        try:
            (before,) = running.collect().processes
            assert DRIFT_RECORD_CHANGED_AFTER_START not in drift_at(before, metadata)
            other_env = tmp_path / "other-env"
            other_env.mkdir()
            unlink = _hard_linked(metadata, other_env / "METADATA")  # same bytes, new link
            try:
                (after,) = running.collect().processes
                first_look = collect(w.pid, tmp_path / "s2", cache=False)
            finally:
                unlink()
        finally:
            running.channel.close()
    assert DRIFT_RECORD_CHANGED_AFTER_START not in drift_at(after, metadata)
    assert DRIFT_RECORD_CHANGED_AFTER_START in drift_at(first_look, metadata)  # the limit


def test_a_running_agent_compares_a_pyc_again_once_its_staged_source_is_restored(
    tmp_path: Path,
) -> None:
    """The pyc attack above against a running agent that re-judges on every collect
    (``recheck_s=0``): its memory keeps the static part under the same key and disk, so the
    second collect reuses "compiled from its source" too.

    UNSAFE when this fails."""
    app, source, pyc, good, evil = stale_pyc(tmp_path, "pycmod2")
    config = AgentConfig(
        "127.0.0.1:9", "t", "a", tmp_path / "state", root_pid=0, docker_socket=None,
        recheck_s=0,
    )  # fmt: skip
    with workload(tmp_path, "import pycmod2\nassert pycmod2.X == 666", app) as w:
        agent = Agent(dataclasses.replace(config, root_pid=w.pid))
        try:
            source.write_bytes(evil)  # staged for the first judgement
            (first,) = agent.collect().processes
            assert DRIFT_BYTECODE_STALE not in drift_at(first, pyc)
            source.write_bytes(good)
            os.utime(source, (MTIME, MTIME))
            (again,) = agent.collect().processes
        finally:
            agent.channel.close()
        fresh = collect(w.pid, tmp_path / "o", cache=False)
    assert DRIFT_BYTECODE_STALE in drift_at(fresh, pyc), "control"
    assert drift_at(again, pyc) == drift_at(fresh, pyc)
