"""Variations on three defences added 2026-12-07, found the same day by an outside tester (a
fourth pass) and each closed: a followed report older than the held one of its agent is never
newer (``Evaluator.followed``); a followed retirement needs its ledger entry and a verifier's
vouch (``Follower._vouched``, ``target_events.vouch``); a loader custom as an import begins
stays custom whatever it looks like after (``_loaders._load_unlocked``); the import system is
compared again as each file's bytes leave the reader, and an audit hook added after the early
probe is a judged probe error (``_integrity``).

1. Report time on the way (``server/nonces.py``): no break found (see the report).
2. Rows other verifiers stored, followed by every verifier (``server/follow.py``): a writer of
   the database (no signing key) moves a genuine, vouched report row to a later rowid, or adds
   a ``target_events`` row.
3. The probe's import-system fingerprint and ``_loaders.is_custom``: a ``sitecustomize``
   (early probe) makes an import run other code than the bytes hashed.

Each test asserts the sound outcome; its docstring says what the attack got before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from servewitness import wire
from servewitness.ledger import chain
from servewitness.ledger.keys import Ed25519PrivateKey
from servewitness.model import ProcessKey, ProcessReport, TargetReport, Verdict, manifest_digest
from servewitness.server import clock, follow, report_rows, vouch
from servewitness.server.db import open_database
from servewitness.server.evaluate import Evaluator
from servewitness.server.store import Store, StoredReport
from tests.test_bytecode_attacks import install, judged
from tests.test_import_system_attacks import EVIL, _findings, _run, served_by

KEY = vouch.receipt_key(Ed25519PrivateKey.generate())
EMPTY = manifest_digest(())


def _proc(pid: int) -> ProcessReport:
    return ProcessReport(
        key=ProcessKey("boot", pid, 20), ns_pid=pid, ppid=1, start_time=1.0, role="worker",
        rank=0, container_id=None, cmdline=("python",), exe="/usr/bin/python3",
        probe_present=True, manifest_digest=EMPTY, files=(),
    )  # fmt: skip


def _save(store: Store, agent: str, target: str, seq: int, pid: int) -> None:
    """What a verifier holding KEY stores for a report it received just now (``_ingest``)."""
    body = wire.report_to_bytes(TargetReport(agent, target, seq, "", time.time(), (_proc(pid),)))
    rep = StoredReport(agent, seq, target, time.time(), body)
    row = vouch.row_digest(*report_rows.identity(rep))
    receipt = follow.receipt_json(f"agent {agent}", 0.0, 0.0, key=KEY, row=row)
    assert store.save_report(dataclasses.replace(rep, receipt=receipt), {})


@contextlib.contextmanager
def following(db: str) -> Iterator[tuple[Evaluator, follow.Follower, Store]]:
    """A verifier holding KEY following DB from now (its evaluator and follower), and the
    store another verifier on DB writes with."""
    here, there = Store(db), Store(db)
    try:
        ev = Evaluator(here)
        follower = follow.Follower(here, ev, receipt_key=KEY)
        follower.poll()
        yield ev, follower, there
    finally:
        here.close()
        there.close()


def _sql(db_path: str, sql: str, args: tuple[object, ...] = ()) -> None:
    db = open_database(db_path)
    try:
        db.execute(sql, args)
    finally:
        db.close()


# -- 2a. a genuine older report moved to a later rowid becomes the target's newest ------------


def test_a_genuine_older_report_moved_to_a_later_rowid_never_replaces_the_newest(
    tmp_path: Path,
) -> None:
    """Attack (a writer of the SQLite file, no signing key): agent-t's verifier stored its
    reports seq 1 (pid 10: say, an honest server) and seq 2 (pid 11: say, the one whose
    newest report FAILs: a forbidden module loaded, the hook dead). The writer runs
    ``UPDATE reports SET rowid = MAX(rowid)+1 WHERE seq = 1``. Nothing the ledger entry or the
    vouch binds changed (``vouch.row_digest``: agent, seq, target, received_unix, body;
    ``ledgered_body``: the entry found by (agent, seq)), so the row checks; the follower
    takes "newest" as the highest rowid (``Evaluator.is_newer``/``followed``), and no seq
    comparison is made. Every verifier on the database follows it, the one that received both
    reports included (``stored_here`` knows the old rowid only).
    Gets: the target's latest evidence is seq 1 again (pid 10), authenticated as its agent,
    dated at its real receipt (fresh while within the run's freshness): the verdict is
    judged on the report before the newest one until the agent's next report, and the writer
    can repeat it after every report.
    Sound: a followed report older (lower seq of the same agent) than the one held is never
    taken as the target's latest evidence."""
    db = str(tmp_path / "db.sqlite3")
    with following(db) as (ev, follower, there):
        _save(there, "agent-t", "t", 1, pid=10)
        _save(there, "agent-t", "t", 2, pid=11)
        follower.poll()
        (t,) = ev.targets()
        assert (t.seq, t.snapshot.processes[0].key.pid) == (2, 11)  # control: the newest
        _sql(
            db,
            "UPDATE reports SET rowid = (SELECT MAX(rowid) + 1 FROM reports) "
            "WHERE agent_id = 'agent-t' AND seq = 1",
        )
        follower.poll()
        (t,) = ev.targets()
        got = (
            f"seq {t.seq}, pid {t.snapshot.processes[0].key.pid}, "
            f"authenticated_as {t.snapshot.authenticated_as!r}, evidence age "
            f"{clock.boot_s() - (t.snapshot.evidence_boot_s or 0.0):.2f} s"
        )
        assert t.seq == 2, got


# -- 2b. a target_events row makes every verifier forget a target it hears from ----------------


@pytest.mark.parametrize("ledgered", [False, True], ids=["bare-row", "with-ledger-entry"])
def test_a_forget_written_into_the_store_never_retires_a_target(
    tmp_path: Path, ledgered: bool
) -> None:
    """Attack (a writer of the SQLite file, no key, no operator credential for
    ``ForgetTarget``): INSERT INTO target_events (target 'bad', event 'forgotten', last agent
    and seq = its newest report's), bare, or with the ledger entry a verifier's own code would
    append (``chain.append``). Followed rows of ``target_events`` are applied with no ledger
    check and no vouch (``Follower.poll`` -> ``Evaluator.retired``; a *forget*, unlike an
    expiry, is applied even though this verifier just heard the target), and at a restart
    ``Evaluator._load`` does not load it back either.
    Gets: every verifier drops target 'bad' (its FAILing evidence) from every run's
    verdict; a run over "every target that reports" judges the others alone, so a window
    can open, and seal the same processes, without it; repeated after each of its reports.
    Sound: a retirement no verifier vouched for (or at least with no ledger entry) is not
    applied; 'bad' stays tracked."""
    db = str(tmp_path / "db.sqlite3")
    with following(db) as (ev, follower, there):
        _save(there, "agent-bad", "bad", 1, pid=10)
        _save(there, "agent-good", "good", 1, pid=20)
        follower.poll()
        assert sorted(t.snapshot.target for t in ev.targets()) == ["bad", "good"]  # control
        at = time.time()
        row = ("bad", at, "forgotten", "nobody", "agent-bad", 1)
        w = open_database(db)
        try:
            w.execute(
                "INSERT INTO target_events (target, at_unix, event, by_whom, last_agent, "
                "last_seq) VALUES (?, ?, ?, ?, ?, ?)",
                row,
            )
            if ledgered:
                chain.append(
                    w, at, "target", chain.target_ref("bad", at), chain.target_subject(*row)
                )
        finally:
            w.close()
        follower.poll()
        got = sorted(t.snapshot.target for t in ev.targets())
        assert "bad" in got, f"tracked after the inserted row: {got}"


# -- 3. a custom loader that looks like a reader again once the import is done -----------------

# Each: a meta-path finder answers fakedist.core with a loader that runs EVIL, then, at the
# end of its exec_module (inside the import, after the probe's integrity check and before its
# is_custom look), makes itself look like an ordinary SourceFileLoader of the published file.
DISGUISES = {
    # a code-path method set on a plain SourceFileLoader instance, removed by itself
    "instance-method-removed": """\
        ld = importlib.machinery.SourceFileLoader(name, path)
        def exec_module(mod, ld=ld):
            del ld.exec_module
            exec(compile(EVIL, path, "exec"), mod.__dict__)
        ld.exec_module = exec_module
        """,
    # an overriding subclass whose instance reassigns its __class__ to the reader
    "class-reassigned": """\
        class Evil(importlib.machinery.SourceFileLoader):
            def exec_module(self, mod):
                exec(compile(EVIL, self.path, "exec"), mod.__dict__)
                self.__class__ = importlib.machinery.SourceFileLoader
        ld = Evil(name, path)
        """,
    # an overriding subclass that swaps the spec's (and module's) loader for a genuine one
    "spec-loader-swapped": """\
        class Evil(importlib.machinery.SourceFileLoader):
            def exec_module(self, mod):
                exec(compile(EVIL, self.path, "exec"), mod.__dict__)
                real = importlib.machinery.SourceFileLoader(self.name, self.path)
                mod.__spec__.loader = real
                mod.__loader__ = real
        ld = Evil(name, path)
        """,
}


@pytest.mark.parametrize("how", sorted(DISGUISES))
def test_a_custom_loader_disguised_as_a_reader_after_it_ran_is_unfiled(
    tmp_path: Path, how: str
) -> None:
    """Attack: a ``sitecustomize`` (early probe) adds a meta-path finder serving
    ``fakedist.core`` with a loader that runs the attacker's source; as its ``exec_module``
    ends it makes the loader look like a plain ``SourceFileLoader`` (its instance method
    deleted, its ``__class__`` reassigned, or the spec's loader swapped for a genuine one).
    The probe's ``_load_unlocked`` wrapper asks ``is_custom(spec.loader)`` only after the
    import ran, and the sweeper asks the same of the module's spec later: both see a reader.
    Gets: ``'evil!!!!!'`` runs; no unfiled record; the sweeper hashes the published core.py
    (``late``) and ``pristine = ["fakedist"]`` PASSes.
    Sound: ``provenance.module.unfiled`` (FAIL): the loader that ran the module was custom."""
    report = served_by(tmp_path, DISGUISES[how])
    verdict, found = judged(report)
    ids = {fid for fid, _, _ in found}
    assert "provenance.module.unfiled" in ids or verdict == Verdict.FAIL, (
        verdict,
        _findings(found),
    )


def test_an_import_system_patch_made_and_undone_inside_one_import_is_seen(
    tmp_path: Path,
) -> None:
    """Attack: the fingerprint is compared as each import *begins* and at each sweep; a
    ``sitecustomize`` (early probe) adds an audit hook (``sys.addaudithook``, outside the
    fingerprint). When the import of ``fakedist.core`` opens core.py (the ``open`` audit
    event: after ``_load_unlocked``'s check, before compiling), the hook installs a
    ``SourceLoader.source_to_code`` that puts the original back first thing and compiles the
    attacker's source. When the import ends the import system is exactly as fingerprinted.
    Gets: ``'evil!!!!!'`` runs from a core.py recorded ``at: load`` with its published hash,
    no ``imports`` probe error, ``pristine = ["fakedist"]`` PASS.
    Sound: FAIL (the compile step was replaced during that import)."""
    sitecustomize = f"""\
        import sys
        import importlib._bootstrap_external as be
        EVIL = {EVIL!r}
        _orig = be.SourceLoader.source_to_code

        def source_to_code(self, data, path, *, _optimize=-1):
            be.SourceLoader.source_to_code = _orig  # undone before anyone looks again
            if str(path).endswith("fakedist/core.py"):
                data = EVIL.encode()
            return _orig(self, data, path, _optimize=_optimize)

        def hook(event, args):
            if event == "open" and args and str(args[0]).endswith("fakedist/core.py"):
                be.SourceLoader.source_to_code = source_to_code

        sys.addaudithook(hook)
        """
    site = tmp_path / "site"
    core = install(site)
    for pyc in (core.parent / "__pycache__").glob("core.*"):
        pyc.unlink()  # the source path (the same works on _compile_bytecode with the pyc)
    result, report = _run(tmp_path, site, sitecustomize,
                          "importlib.import_module('fakedist.core').VALUE")  # fmt: skip
    assert result == repr("evil!!!!!")
    loaded = {f.path: f.at for f in report.files or () if f.path.startswith(str(core.parent))}
    verdict, found = judged(report)
    assert verdict == Verdict.FAIL, (verdict, _findings(found), loaded, report.probe_errors)
    # the early probe's own audit hook says where the hook was added (the session-28 GPU run
    # showed only that one was): the attacker's sitecustomize, line and function
    added = [e for e in report.probe_errors if "an audit hook was added" in e]
    assert added and "sitecustomize.py:" in added[0] and "(<module>)" in added[0], added
