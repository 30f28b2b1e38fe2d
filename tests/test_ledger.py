"""The audit ledger: every stored row is chained, and editing, deleting, reordering or
inserting rows directly in the database is caught, naming the first entry that does not match.
Tampering goes through the database engine itself, as an attacker with access would: every
case runs against SQLite and against a real PostgreSQL server."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from servewitness.model import FileEntry
from servewitness.server.db import open_database
from servewitness.server.store import Store, StoredReport
from tests.helpers import Backend, not_vllm_policy, rechain, verifier_cli
from tests.test_gate_e2e import Daemon

FILES = (FileEntry("/x.py", "a" * 64, 1, "source", "x", "load"),)


def populated(target: str | Path) -> str:
    """A store with a run, two reports (one bringing a manifest) and two verdicts; its head."""
    s = Store(target)
    try:
        s.register_run(
            "r", not_vllm_policy('version = 1\n[[hooks]]\nname = "h"\n'), "sha256:" + "1" * 64, "t"
        )
        s.save_report(StoredReport("a", 1, "t", 100.0, b"one"), {"sha256:" + "2" * 64: FILES})
        s.save_report(StoredReport("a", 2, "t", 101.0, b"two"), {"sha256:" + "2" * 64: FILES})
        s.record_verdict("r", "PENDING", {"n": 1})
        time.sleep(0.01)
        s.record_verdict("r", "PASS", {"n": 2})
        v = s.verify_ledger()
    finally:
        s.close()
    assert v.ok and v.entries == 6, v  # run, manifest (once), 2 reports, 2 verdicts
    return v.head


INSERT_REPORT = (
    "INSERT INTO reports (agent_id, seq, target, received_unix, report) VALUES (?, ?, ?, ?, ?)",
    ("b", 9, "t", 1.0, b"\x01"),
)


def test_an_untouched_store_verifies_and_every_row_is_chained(backend: Backend) -> None:
    head = populated(backend.target)
    v = backend.check()
    assert (v.ok, v.entries, v.head) == (True, 6, head)


Statement = str | tuple[str, Sequence[Any]]
CASES: list[tuple[str, list[Statement], str, str | None]] = [
    ("edit a report", [("UPDATE reports SET report = ? WHERE seq = 2", (b"\x00",))],
     "the stored report was changed", "report:1"),
    ("edit a policy", ["UPDATE runs SET policy_toml = 'version = 1'"],
     "the stored run was changed", "run:0"),
    ("edit a verdict", ["UPDATE verdicts SET verdict = 'PASS' WHERE verdict = 'PENDING'"],
     "the stored verdict was changed", "verdict:0"),
    ("edit a manifest", ["UPDATE manifests SET files_json = '[]'"],
     "the stored manifest was changed", "manifest:0"),
    ("delete a report", ["DELETE FROM reports WHERE seq = 1"],
     "the report it records is gone", "report:0"),
    ("delete a ledger entry", ["DELETE FROM ledger WHERE seq = 3"],
     "ledger entry 3 is missing", None),
    ("edit a ledger subject", ["UPDATE ledger SET subject = 'x' || subject WHERE seq = 2"],
     "its fields do not match its hash", None),
    ("reorder two entries", [
        "UPDATE ledger SET seq = -1 WHERE seq = 3", "UPDATE ledger SET seq = 3 WHERE seq = 4",
        "UPDATE ledger SET seq = 4 WHERE seq = -1"], "does not follow entry 2", None),
    ("insert behind its back", [INSERT_REPORT],
     "not in the ledger, first report", None),
]  # fmt: skip


@pytest.mark.parametrize(("name", "sql", "says", "where"), CASES, ids=[c[0] for c in CASES])
def test_tampering_is_caught_at_the_first_entry_that_no_longer_matches(
    backend: Backend, name: str, sql: list[Statement], says: str, where: str | None
) -> None:
    populated(backend.target)
    expected_seq = None
    if where is not None:
        kind, n = where.split(":")
        expected_seq = backend.entry(kind, int(n))
    backend.sql(*sql)
    v = backend.check()
    assert not v.ok and says in (v.problem or ""), v
    if expected_seq is not None:
        assert v.seq == expected_seq and v.entries == expected_seq - 1, v


def test_a_rewritten_chain_verifies_but_its_head_moves(backend: Backend) -> None:
    """What a chain alone cannot stop: edit a row and recompute every hash after it. It then
    verifies, but the head is not the one recorded before: pin the head elsewhere (a signed
    checkpoint does)."""
    head = populated(backend.target)
    db = open_database(backend.target)
    db.execute("UPDATE reports SET report = ? WHERE seq = 2", (b"\x00",))
    rechain(db)
    db.close()
    v = backend.check()
    assert v.ok and v.head != head


def test_an_older_database_gets_its_ledger_once_and_never_adopts_later_rows(
    backend: Backend,
) -> None:
    populated(backend.target)
    backend.sql("DELETE FROM ledger")  # as written by a verifier without a ledger
    s = Store(backend.target)
    assert s.backfilled == 6 and s.verify_ledger().ok
    s.close()
    backend.sql(INSERT_REPORT)
    s = Store(backend.target)  # a restart must not launder a row inserted behind the chain's back
    try:
        assert s.backfilled == 0 and not s.verify_ledger().ok
    finally:
        s.close()


def test_audit_verify_cli_exit_codes(backend: Backend, tmp_path: Path) -> None:
    path = backend.target
    head = populated(path)
    out = verifier_cli("audit", "verify", "--db", path)
    assert out.returncode == 0 and f"6 entries, head {head}" in out.stdout, out.stderr
    out = verifier_cli("audit", "verify", "--db", path, "--json")
    assert json.loads(out.stdout) == {"ok": True, "entries": 6, "head": head, "problem": None,
                                      "seq": None, "checkpoints": 0,
                                      "scope": "internal", "index": []}  # fmt: skip
    backend.sql(("UPDATE reports SET report = ? WHERE seq = 2", (b"\x00",)))
    out = verifier_cli("audit", "verify", "--db", path)
    assert out.returncode == 1 and "the stored report was changed" in out.stderr
    assert "verifier: error:" in out.stderr and "Traceback" not in out.stderr


def test_audit_cli_names_a_missing_foreign_or_unreachable_database(tmp_path: Path) -> None:
    out = verifier_cli("audit", "verify", "--db", str(tmp_path / "none.sqlite3"))
    assert out.returncode == 3 and "no such database file" in out.stderr
    # Bytes that are no database: a file given by mistake and a database whose header was
    # destroyed look the same, and an audit must not read either as configuration: exit 1
    # (docs/operations.md, "A damaged database"). An SQLite file of another program is 3.
    (tmp_path / "junk.sqlite3").write_bytes(b"not a database at all" * 100)
    out = verifier_cli("audit", "verify", "--db", str(tmp_path / "junk.sqlite3"))
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert "is corrupt: file is not a database" in out.stderr, out.stderr
    sqlite3.connect(tmp_path / "other.sqlite3").execute("CREATE TABLE t (x)").connection.close()
    out = verifier_cli("audit", "verify", "--db", str(tmp_path / "other.sqlite3"))
    assert out.returncode == 3 and "not a verifier database" in out.stderr, out.stderr
    from servewitness.testing.vllm_server import free_port

    url = f"postgresql://postgres:secret@127.0.0.1:{free_port()}/verifier"  # nobody listens
    for args in (["audit", "verify"], ["audit", "run", "r"], ["audit", "request", "x"]):
        out = verifier_cli(*args, "--db", url)
        assert out.returncode == 9, (args, out.stdout, out.stderr)
        assert "cannot reach the verifier database" in out.stderr, out.stderr
        assert "secret" not in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_live_verifier_ledger_over_real_grpc(backend: Backend, tmp_path: Path) -> None:
    """A real `verifier serve` with a real agent: what it stores verifies while it runs, and
    a report edited in its live database is caught."""
    db = backend.target
    sock = tmp_path / "v.sock"
    (tmp_path / "p.toml").write_text(not_vllm_policy('version = 1\n[[hooks]]\nname = "h"\n'))
    assert verifier_cli("keygen", "--out", str(tmp_path / "v.key")).returncode == 0
    args = ["serve", "--listen", f"unix:{sock}", "--db", str(db), "--report-interval", "0.2",
            "--run", f"r={tmp_path / 'p.toml'}",
            "--signing-key", str(tmp_path / "v.key")]  # fmt: skip
    serve = Daemon(args, tmp_path / "serve.log").start()
    agent = None
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.1)
        agent = Daemon(["agent", "--verifier", f"unix:{sock}", "--target", "t", "--pid", "1",
                        "--interval", "0.2", "--spool", str(tmp_path / "spool"), "--no-docker"],
                       tmp_path / "agent.log").start()  # fmt: skip
        deadline = time.monotonic() + 120  # an agent's start and first report: 30 s was too
        while True:  # little on a loaded 2-core machine (2026-12-03)
            out = verifier_cli("status", "r", "--verifier", f"unix:{sock}")
            if "target t" in out.stdout:
                break
            assert time.monotonic() < deadline, out.stdout + (tmp_path / "agent.log").read_text()
            time.sleep(0.2)
        out = verifier_cli("audit", "verify", "--db", str(db), "--json")
        got = json.loads(out.stdout)
        assert out.returncode == 0 and got["ok"] and got["entries"] >= 3, (
            got
        )  # run, report, verdict
    finally:
        if agent is not None:
            agent.stop()
        serve.stop()
    pub = str(tmp_path / "v.key.pub")
    out = verifier_cli("audit", "verify", "--db", str(db), "--key", pub, "--json")
    got = json.loads(out.stdout)
    assert out.returncode == 0 and got["checkpoints"] >= 1, got  # signed while serving and at exit
    backend.sql("UPDATE reports SET target = 'elsewhere' WHERE seq = 1")
    out = verifier_cli("audit", "verify", "--db", str(db))
    assert out.returncode == 1 and "the stored report was changed" in out.stderr


def test_audit_file_queries_and_their_errors(backend: Backend) -> None:
    """`audit file` by path suffix over real wire reports; nothing found is exit 6; a stored
    report that no longer decodes is a clear error pointing at `audit verify`."""
    from dataclasses import replace

    from servewitness import wire
    from servewitness.model import TargetReport
    from servewitness.server.index import processes_seen
    from tests.test_policy_engine import worker

    w = replace(worker(), manifest_digest="sha256:" + "3" * 64, container_id="c" * 64)
    assert w.files
    path = backend.target
    s = Store(path)
    try:
        s.register_run(
            "all",
            not_vllm_policy('version = 1\n[[hooks]]\nname = "h"\n'),
            "sha256:" + "1" * 64,
            "t",
        )
        s.register_run(
            "elsewhere",
            not_vllm_policy('version = 1\n[targets]\nnames = ["x"]\n[[hooks]]\nname = "h"\n'),
            "sha256:" + "4" * 64, "t",
        )  # fmt: skip
        body = wire.report_to_bytes(TargetReport("a", "serving", 1, "", 100.0, (w,)))
        s.save_report(
            StoredReport("a", 1, "serving", 100.0, body),
            {"sha256:" + "3" * 64: w.files},
            processes_seen((w,)),
        )
    finally:
        s.close()
    wanted = w.files[0].path
    suffix = "/".join(wanted.split("/")[-2:])
    out = verifier_cli("audit", "file", suffix, "--db", str(path), "--json")
    assert out.returncode == 0, out.stderr
    (hit,) = [h for h in json.loads(out.stdout) if h["path"] == wanted]
    assert (hit["target"], hit["pid"], hit["role"], hit["runs"]) == ("serving", w.key.pid,
                                                                     "worker", ["all"])  # fmt: skip
    assert hit["container_id"] == "c" * 64 and hit["reports"] == 1
    out = verifier_cli("audit", "file", "/no/such/file.py", "--db", str(path))
    assert out.returncode == 6 and "no stored manifest" in out.stderr
    backend.sql(("UPDATE reports SET report = ?", (b"\xff\xff",)))
    out = verifier_cli("audit", "file", suffix, "--db", str(path))
    # Not answered from the index: the report the process row derives from no longer
    # matches its ledger entry (issue 19, item 6a).
    assert out.returncode == 1 and 'reports ["a", 1]: changed' in out.stderr, out.stderr
    out = verifier_cli("audit", "verify", "--db", str(path))
    assert out.returncode == 1 and "the stored report was changed" in out.stderr
